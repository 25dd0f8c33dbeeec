package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthfleet/berth/leaseapi"
)

const renewalsPath = "/v1alpha1/renewals"

// batchBody is the JSON of a batched renewal.
func batchBody(t *testing.T, holder string, leases ...leaseapi.BatchRenewal) string {
	t.Helper()
	return batchBodyB(t, holder, leases)
}

func batchBodyB(tb testing.TB, holder string, leases []leaseapi.BatchRenewal) string {
	tb.Helper()
	b, err := json.Marshal(leaseapi.BatchRenewRequest{Holder: holder, Leases: leases})
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

func renewal(ns, name string, token int32, ttlSeconds int32) leaseapi.BatchRenewal {
	return leaseapi.BatchRenewal{Namespace: ns, Name: name, FencingToken: token, TTLSeconds: ttlSeconds}
}

// TestBatchRenewal renews leases in every state in one batch, and their
// twins in another namespace one by one through POST .../renew at the same
// instant: every item answers exactly what the single renew answered, items
// come in the order of the request, and each item counts in the metrics as
// a single renew would.
func TestBatchRenewal(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	type state struct {
		name  string
		setup func(ns string)
		token int32
	}
	revoke := func(ns, name string) {
		res := f.do(request{method: http.MethodPost, path: leasePath(ns, name, "revoke"), token: tokenAdmin, body: `{"holder":"cluster-a","fencingToken":1}`})
		if res.code != http.StatusNoContent {
			t.Fatalf("revoke %s/%s: %d %s", ns, name, res.code, res.body)
		}
	}
	states := []state{
		{name: "held", setup: func(ns string) { f.acquire(tokenA, ns, "held", "cluster-a", 10) }, token: 1},
		{name: "worker", setup: func(ns string) { f.acquire(tokenA, ns, "worker", "cluster-a", 10) }, token: 1},
		{name: "wrong-token", setup: func(ns string) { f.acquire(tokenA, ns, "wrong-token", "cluster-a", 10) }, token: 7},
		{name: "other", setup: func(ns string) { f.acquire(tokenB, ns, "other", "cluster-b", 10) }, token: 1},
		{name: "expired", setup: func(ns string) { f.acquire(tokenA, ns, "expired", "cluster-a", 1) }, token: 1},
		{name: "never-seen", setup: func(string) {}, token: 1},
		{name: "revoked", setup: func(ns string) { f.acquire(tokenA, ns, "revoked", "cluster-a", 10); revoke(ns, "revoked") }, token: 1},
	}
	var leases []leaseapi.BatchRenewal
	for _, ns := range []string{"batch", "single"} {
		for i, s := range states {
			s.setup(ns)
			if ns == "batch" {
				leases = append(leases, renewal(ns, s.name, s.token, int32(20+i)))
			}
		}
	}
	// Out of key order, so that the answer's order is the request's.
	leases[0], leases[len(leases)-1] = leases[len(leases)-1], leases[0]
	f.clock.Step(2 * time.Second)
	m := f.srv.Metrics
	before := map[string]float64{}
	for _, o := range []string{"renewed", "lost", "revoked"} {
		before[o] = testutil.ToFloat64(m.outcomes.WithLabelValues(o))
	}

	res := f.do(request{method: http.MethodPost, path: renewalsPath, token: tokenA, body: batchBody(t, "cluster-a", leases...)})
	if res.code != http.StatusOK {
		t.Fatalf("batch: %d %s", res.code, res.body)
	}
	var got leaseapi.BatchRenewResponse
	res.decode(t, &got)
	if len(got.Items) != len(leases) {
		t.Fatalf("batch of %d answered %d items", len(leases), len(got.Items))
	}
	batchOutcomes := map[string]float64{}
	for _, o := range []string{"renewed", "lost", "revoked"} {
		batchOutcomes[o] = testutil.ToFloat64(m.outcomes.WithLabelValues(o)) - before[o]
	}

	wantOutcomes := map[string]float64{}
	for i, l := range leases {
		single := f.do(request{method: http.MethodPost, path: leasePath("single", l.Name, "renew"), token: tokenA,
			body: fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d,"ttlSeconds":%d}`, l.FencingToken, l.TTLSeconds)})
		if single.code != http.StatusOK {
			t.Fatalf("single renew of %s: %d %s", l.Name, single.code, single.body)
		}
		var want leaseapi.AcquireResponse
		single.decode(t, &want)
		item := got.Items[i]
		if item.Namespace != "batch" || item.Name != l.Name {
			t.Errorf("item %d is %s/%s, want batch/%s", i, item.Namespace, item.Name, l.Name)
		}
		if diff := cmp.Diff(want, item.AcquireResponse); diff != "" {
			t.Errorf("%s: item differs from the single renew (-single +batch):\n%s", l.Name, diff)
		}
		switch {
		case item.Revoked:
			wantOutcomes["revoked"]++
		case item.Acquired:
			wantOutcomes["renewed"]++
			if want := epoch.Add(2*time.Second + time.Duration(l.TTLSeconds)*time.Second); !item.ExpiresAt.Equal(want) {
				t.Errorf("%s: expires at %s, want the batch's instant plus its own TTL, %s", l.Name, item.ExpiresAt, want)
			}
		default:
			wantOutcomes["lost"]++
		}
	}
	if diff := cmp.Diff(map[string]float64{"renewed": 2, "lost": 4, "revoked": 1}, wantOutcomes); diff != "" {
		t.Errorf("what the single renews decided (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantOutcomes, batchOutcomes); diff != "" {
		t.Errorf("outcomes counted for the batch (-single renews +batch):\n%s", diff)
	}
	if n := testutil.CollectAndCount(m.batchLeases, "berth_leaseapi_batch_renewal_leases"); n != 1 {
		t.Errorf("batch size histogram series = %d, want 1", n)
	}
	if sum := batchLeasesSum(t, f); sum != float64(len(leases)) {
		t.Errorf("batch size histogram sums %g leases, want the batch's %d", sum, len(leases))
	}
	var logged []map[string]any
	for _, e := range f.logs.entries(t, "request") {
		if e["route"] == renewalsPath {
			logged = append(logged, e)
		}
	}
	if len(logged) != 1 || logged[0]["leases"] != float64(len(leases)) {
		t.Errorf("access log of the batch: %v, want one line with leases %d", logged, len(leases))
	}
}

// batchLeasesSum is the sum of the batch size histogram.
func batchLeasesSum(t *testing.T, f *fixture) float64 {
	t.Helper()
	families, err := f.srv.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == "berth_leaseapi_batch_renewal_leases" {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	return 0
}

func TestBatchRenewalErrors(t *testing.T) {
	ok := renewal("ns", "lease", 1, 10)
	many := func(n int) []leaseapi.BatchRenewal {
		out := make([]leaseapi.BatchRenewal, n)
		for i := range out {
			out[i] = renewal("ns", fmt.Sprintf("lease-%05d", i), 1, 10)
		}
		return out
	}
	post := func(path, token, body string) request {
		return request{method: http.MethodPost, path: path, token: token, body: body}
	}
	cases := map[string]struct {
		body        func(t *testing.T) string
		req         func(body string) request
		wantCode    int
		wantInError string
	}{
		"empty holder": {
			body:     func(t *testing.T) string { return batchBody(t, "", ok) },
			wantCode: http.StatusBadRequest, wantInError: "holder: ",
		},
		"holder over 253 bytes": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a/"+strings.Repeat("x", 244), ok) },
			wantCode: http.StatusBadRequest, wantInError: "holder: ",
		},
		"no leases": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a") },
			wantCode: http.StatusBadRequest, wantInError: "leases: must hold between 1 and 10000 leases, got 0",
		},
		"leases null": {
			body:     func(*testing.T) string { return `{"holder":"cluster-a","leases":null}` },
			wantCode: http.StatusBadRequest, wantInError: "leases: ",
		},
		"more than MaxBatchLeases": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a", many(leaseapi.MaxBatchLeases+1)...) },
			wantCode: http.StatusBadRequest, wantInError: "got 10001",
		},
		"bad namespace": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a", ok, renewal("NS", "x", 1, 10)) },
			wantCode: http.StatusBadRequest, wantInError: "leases[1].namespace: ",
		},
		"bad name": {
			body: func(t *testing.T) string {
				return batchBody(t, "cluster-a", ok, ok2(), renewal("ns", "bad_name", 1, 10))
			},
			wantCode: http.StatusBadRequest, wantInError: "leases[2].name: ",
		},
		"fencingToken zero": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a", renewal("ns", "a", 0, 10)) },
			wantCode: http.StatusBadRequest, wantInError: "leases[0].fencingToken: ",
		},
		"ttlSeconds zero": {
			body: func(t *testing.T) string {
				return batchBody(t, "cluster-a", ok, ok2(), ok3(), renewal("ns", "d", 1, 0))
			},
			wantCode: http.StatusBadRequest, wantInError: "leases[3].ttlSeconds: ",
		},
		"ttlSeconds over a day": {
			body: func(t *testing.T) string {
				return batchBody(t, "cluster-a", renewal("ns", "a", 1, leaseapi.MaxTTLSeconds+1))
			},
			wantCode: http.StatusBadRequest, wantInError: "leases[0].ttlSeconds: ",
		},
		"a key twice": {
			body: func(t *testing.T) string {
				return batchBody(t, "cluster-a", renewal("ns", "a", 1, 10), ok2(), ok, ok3(), renewal("other", "lease", 1, 10), renewal("ns", "lease", 2, 5))
			},
			wantCode: http.StatusBadRequest, wantInError: "leases[5]: duplicate of leases[2]",
		},
		"many bad leases are named up to a bound": {
			body: func(t *testing.T) string {
				bad := many(50)
				for i := range bad {
					bad[i].TTLSeconds = 0
				}
				return batchBody(t, "cluster-a", bad...)
			},
			wantCode: http.StatusBadRequest, wantInError: "more than 10 leases are invalid",
		},
		"unknown field": {
			body:     func(*testing.T) string { return `{"holder":"cluster-a","leases":[],"priority":1}` },
			wantCode: http.StatusBadRequest, wantInError: "priority: unknown field",
		},
		"unknown field in a lease": {
			body: func(*testing.T) string {
				return `{"holder":"cluster-a","leases":[{"namespace":"ns","name":"a","fencingToken":1,"ttlSeconds":5,"x":1}]}`
			},
			wantCode: http.StatusBadRequest, wantInError: "x: unknown field",
		},
		"two JSON values": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a", ok) + batchBody(t, "cluster-a", ok) },
			wantCode: http.StatusBadRequest, wantInError: "body: ",
		},
		"wrong type": {
			body: func(*testing.T) string {
				return `{"holder":"cluster-a","leases":[{"namespace":"ns","name":"a","fencingToken":"1","ttlSeconds":5}]}`
			},
			wantCode: http.StatusBadRequest, wantInError: "fencingToken: ",
		},
		"body over 4 MiB": {
			body: func(t *testing.T) string {
				return batchBody(t, "cluster-a", ok) + strings.Repeat(" ", leaseapi.MaxBatchBodyBytes)
			},
			wantCode: http.StatusRequestEntityTooLarge, wantInError: "4194304",
		},
		"body over 4 KiB is fine here": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a", ok) + strings.Repeat(" ", 64<<10) },
			wantCode: http.StatusOK,
		},
		"MaxBatchLeases leases of the longest keys fit": {
			body: func(t *testing.T) string {
				leases := many(leaseapi.MaxBatchLeases)
				for i := range leases {
					leases[i].Namespace = strings.Repeat("n", 63)
					leases[i].Name = fmt.Sprintf("%s-%05d", strings.Repeat("a", 253-64-6), i)
					leases[i].FencingToken, leases[i].TTLSeconds = 2147483647, leaseapi.MaxTTLSeconds
				}
				return batchBody(t, "cluster-a/"+strings.Repeat("h", 243), leases...)
			},
			wantCode: http.StatusOK,
		},
		"another subject's holder": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-b", ok) },
			wantCode: http.StatusForbidden, wantInError: `may not act as holder "cluster-b"`,
		},
		"no credentials": {
			body:     func(t *testing.T) string { return batchBody(t, "cluster-a", ok) },
			req:      func(body string) request { return post(renewalsPath, "", body) },
			wantCode: http.StatusUnauthorized, wantInError: "unauthorized",
		},
		"GET": {
			body:     func(*testing.T) string { return "" },
			req:      func(string) request { return request{method: http.MethodGet, path: renewalsPath, token: tokenA} },
			wantCode: http.StatusMethodNotAllowed, wantInError: "method not allowed",
		},
		// The larger bound is the batch route's alone.
		"4 KiB still bounds a single renew": {
			body: func(*testing.T) string {
				return `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":5}` + strings.Repeat(" ", leaseapi.MaxBodyBytes)
			},
			req:      func(body string) request { return post(leasePath("ns", "lease", "renew"), tokenA, body) },
			wantCode: http.StatusRequestEntityTooLarge, wantInError: "4096",
		},
		"4 KiB still bounds another method on the batch path": {
			body: func(*testing.T) string { return strings.Repeat(" ", leaseapi.MaxBodyBytes+1) },
			req: func(body string) request {
				return request{method: http.MethodPut, path: renewalsPath, token: tokenA, body: body}
			},
			wantCode: http.StatusRequestEntityTooLarge, wantInError: "4096",
		},
		"4 KiB still bounds a registration": {
			body: func(*testing.T) string { return `{"fingerprint":"f"}` + strings.Repeat(" ", leaseapi.MaxBodyBytes) },
			req: func(body string) request {
				return request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-a", token: tokenA, body: body}
			},
			wantCode: http.StatusRequestEntityTooLarge, wantInError: "4096",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			req := post(renewalsPath, tokenA, tc.body(t))
			if tc.req != nil {
				req = tc.req(req.body)
			}
			res := f.do(req)
			if res.code != tc.wantCode {
				t.Fatalf("status %d, want %d; body %.500s", res.code, tc.wantCode, res.body)
			}
			if tc.wantCode == http.StatusOK {
				return
			}
			if msg := res.errorMessage(t); !strings.Contains(msg, tc.wantInError) {
				t.Errorf("error %.500q does not contain %q", msg, tc.wantInError)
			}
		})
	}
}

func ok2() leaseapi.BatchRenewal { return renewal("ns", "b", 1, 10) }
func ok3() leaseapi.BatchRenewal { return renewal("ns", "c", 1, 10) }

// TestBatchRenewalStoreFailure: a failed round trip fails the whole batch
// with 500, the detail only in the log; renewals that landed before it only
// extended the caller's terms.
func TestBatchRenewalStoreFailure(t *testing.T) {
	for _, op := range []string{"GetLeases", "PutLeases"} {
		t.Run(op, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			f.acquire(tokenA, "ns", "a", "cluster-a", 10)
			f.store.failNext(op, errors.New("disk controller on fire"))
			res := f.do(request{method: http.MethodPost, path: renewalsPath, token: tokenA,
				body: batchBody(t, "cluster-a", renewal("ns", "a", 1, 10), renewal("ns", "b", 1, 10))})
			if res.code != http.StatusInternalServerError || res.errorMessage(t) != "internal error" {
				t.Fatalf("answer %d %s, want 500 internal error", res.code, res.body)
			}
			if !strings.Contains(f.logs.String(), "disk controller on fire") {
				t.Errorf("the store's error is not in the log")
			}
			stored, err := f.backend.GetLease(t.Context(), "ns", "a")
			if err != nil || stored.Holder != "cluster-a" || stored.FencingToken != 1 {
				t.Errorf("lease after the failed batch: %+v, %v; want still cluster-a's term 1", stored, err)
			}
		})
	}
}
