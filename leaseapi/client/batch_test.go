package client_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
)

// TestRenewBatch renews leases in several states in one call against a real
// lease API: each result is what Renew answers for the same lease right
// after.
func TestRenewBatch(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{})
	c := newClient(t, client.Config{URL: ts.URL})
	ctx := t.Context()
	for _, a := range []struct{ ns, name, holder string }{
		{"team", "exporter", "east"}, {"team", "taken", "west"}, {"other", "exporter", "east/shard-1"}, {"team", "mine", "east"},
	} {
		if res, err := c.Acquire(ctx, a.ns, a.name, a.holder, time.Minute); err != nil || !res.Acquired {
			t.Fatalf("acquire %s/%s: %+v, %v", a.ns, a.name, res, err)
		}
	}
	renewals := []client.Renewal{
		{Namespace: "team", Name: "exporter", FencingToken: 1, TTL: 30 * time.Second},
		{Namespace: "team", Name: "taken", FencingToken: 1, TTL: 30 * time.Second},
		{Namespace: "other", Name: "exporter", FencingToken: 1, TTL: 30 * time.Second}, // held by east/shard-1
		{Namespace: "team", Name: "never", FencingToken: 1, TTL: 30 * time.Second},
		{Namespace: "team", Name: "mine", FencingToken: 2, TTL: 1500 * time.Millisecond}, // wrong token
	}
	results, err := c.RenewBatch(ctx, "east", renewals)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(renewals) {
		t.Fatalf("%d results for %d renewals", len(results), len(renewals))
	}
	wantAcquired := []bool{true, false, false, false, false}
	for i, r := range renewals {
		if results[i].Acquired != wantAcquired[i] {
			t.Errorf("%s/%s: acquired %v, want %v", r.Namespace, r.Name, results[i].Acquired, wantAcquired[i])
		}
		single, err := c.Renew(ctx, r.Namespace, r.Name, "east", r.FencingToken, r.TTL)
		if err != nil {
			t.Fatal(err)
		}
		// The single renew comes later, so a renewed term's times moved on.
		if diff := cmp.Diff(single, results[i], cmpIgnoreRenewalTimes(single.Acquired)); diff != "" {
			t.Errorf("%s/%s: batch result differs from Renew's (-renew +batch):\n%s", r.Namespace, r.Name, diff)
		}
	}
	if results[1].Holder != "west" || results[2].Holder != "east/shard-1" {
		t.Errorf("lost leases name %q and %q, want their holders west and east/shard-1", results[1].Holder, results[2].Holder)
	}

	if results, err := c.RenewBatch(ctx, "east", nil); err != nil || len(results) != 0 {
		t.Errorf("empty batch: %v, %v; want no results and no request", results, err)
	}
	if _, err := c.RenewBatch(ctx, "east", []client.Renewal{{Namespace: "Team", Name: "x", FencingToken: 1, TTL: time.Second}}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("batch with a bad namespace: %v, want ErrInvalid", err)
	}
}

func cmpIgnoreRenewalTimes(renewed bool) cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool {
		f := p.Last().String()
		return renewed && (f == ".RenewedAt" || f == ".ExpiresAt")
	}, cmp.Ignore())
}

// countingHandler counts the requests to one path on their way to next.
type countingHandler struct {
	next http.Handler
	path string
	n    atomic.Int32
}

func (h *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == h.path {
		h.n.Add(1)
	}
	h.next.ServeHTTP(w, r)
}

// TestRenewBatchSplits: a call of more than MaxBatchLeases renewals is one
// request per MaxBatchLeases, and its results keep the order of the call.
func TestRenewBatchSplits(t *testing.T) {
	h := &countingHandler{next: leaseapitest.Handler(t, leaseapitest.Options{}), path: "/v1alpha1/renewals"}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c := newClient(t, client.Config{URL: ts.URL})
	if _, err := c.Acquire(t.Context(), "ns", "held", "east", time.Minute); err != nil {
		t.Fatal(err)
	}
	renewals := make([]client.Renewal, leaseapi.MaxBatchLeases+2)
	for i := range renewals {
		renewals[i] = client.Renewal{Namespace: "ns", Name: fmt.Sprintf("lease-%05d", i), FencingToken: 1, TTL: time.Minute}
	}
	renewals[leaseapi.MaxBatchLeases+1].Name = "held" // in the second request
	results, err := c.RenewBatch(t.Context(), "east", renewals)
	if err != nil {
		t.Fatal(err)
	}
	if n := h.n.Load(); n != 2 {
		t.Errorf("%d requests for %d renewals, want 2", n, len(renewals))
	}
	if len(results) != len(renewals) {
		t.Fatalf("%d results for %d renewals", len(results), len(renewals))
	}
	for i, r := range results {
		if want := i == leaseapi.MaxBatchLeases+1; r.Acquired != want {
			t.Errorf("result %d (%s): acquired %v, want %v", i, renewals[i].Name, r.Acquired, want)
		}
	}
}

// TestRenewBatchOnAnOlderServer: a lease API of the previous release knows
// no /v1alpha1/renewals. It answers 404 (its unmatched route) to a body
// within its 4 KiB bound and 413 to a larger one, read before routing; both
// are ErrNotSupported, so that the agent falls back to single renewals.
func TestRenewBatchOnAnOlderServer(t *testing.T) {
	older := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1alpha1/renewals" {
				next.ServeHTTP(w, r)
				return
			}
			body, _ := io.ReadAll(io.LimitReader(r.Body, leaseapi.MaxBodyBytes+1))
			w.Header().Set("Content-Type", "application/json")
			if len(body) > leaseapi.MaxBodyBytes {
				w.WriteHeader(http.StatusRequestEntityTooLarge)
				fmt.Fprintf(w, `{"error":%q}`, leaseapi.ErrBodyTooLarge.Error())
				return
			}
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"not found"}`)
		})
	}
	ts := httptest.NewServer(older(leaseapitest.Handler(t, leaseapitest.Options{})))
	t.Cleanup(ts.Close)
	c := newClient(t, client.Config{URL: ts.URL})
	for _, n := range []int{1, 200} {
		renewals := make([]client.Renewal, n)
		for i := range renewals {
			renewals[i] = client.Renewal{Namespace: "ns", Name: fmt.Sprintf("lease-%d", i), FencingToken: 1, TTL: time.Minute}
		}
		_, err := c.RenewBatch(t.Context(), "east", renewals)
		if !errors.Is(err, client.ErrNotSupported) {
			t.Errorf("batch of %d on an older server: %v, want ErrNotSupported", n, err)
		}
	}
	// A real 404 of the current server is not that: it has the route.
	c2 := newClient(t, client.Config{URL: leaseapitest.Start(t, leaseapitest.Options{}).URL})
	if _, err := c2.RenewBatch(t.Context(), "east", []client.Renewal{{Namespace: "ns", Name: "x", FencingToken: 1, TTL: time.Minute}}); err != nil {
		t.Errorf("batch on the current server: %v", err)
	}
}
