package server

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthfleet/berth/leaseapi"
)

// register registers cluster id with token, as its agent does.
func (f *fixture) register(token, id string) {
	f.t.Helper()
	res := f.do(request{method: http.MethodPut, path: "/v1alpha1/clusters/" + id, token: token, body: `{"fingerprint":"fp-` + id + `"}`})
	if res.code != http.StatusOK {
		f.t.Fatalf("register %s: %d %s", id, res.code, res.body)
	}
}

// TestMove: who may move a term, what the answer and the lease show, how
// the reservation its end leaves answers the other clusters, and the
// refusals with their status codes.
func TestMove(t *testing.T) {
	const ttlSeconds = 10
	f := newFixture(t, fixtureOptions{})
	f.register(tokenA, "cluster-a")
	f.register(tokenB, "cluster-b")
	post := func(token, verb, body string) response {
		return f.do(request{method: http.MethodPost, path: leasePath("ns", "db", verb), token: token, body: body})
	}
	term := f.acquire(tokenA, "ns", "db", "cluster-a", ttlSeconds)
	body := func(to string) string {
		return fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d,"to":%q}`, term.FencingToken, to)
	}

	for name, tc := range map[string]struct {
		token, body string
		wantCode    int
		wantErr     string
	}{
		"another cluster":         {token: tokenB, body: body("cluster-b"), wantCode: http.StatusForbidden, wantErr: "may not act as holder"},
		"to its own cluster":      {token: tokenA, body: body("cluster-a"), wantCode: http.StatusBadRequest, wantErr: "to: must not be the holder's own cluster"},
		"to a bad id":             {token: tokenA, body: body("Not_An_ID"), wantCode: http.StatusBadRequest, wantErr: "to: "},
		"to an unknown cluster":   {token: tokenA, body: body("cluster-c"), wantCode: http.StatusConflict, wantErr: "cluster cluster-c is not registered"},
		"an older token":          {token: tokenA, body: `{"holder":"cluster-a","fencingToken":7,"to":"cluster-b"}`, wantCode: http.StatusConflict, wantErr: "not held by this holder"},
		"an unknown field":        {token: tokenA, body: `{"holder":"cluster-a","fencingToken":1,"where":"x"}`, wantCode: http.StatusBadRequest},
		"no fencing token at all": {token: tokenA, body: `{"holder":"cluster-a"}`, wantCode: http.StatusBadRequest, wantErr: "fencingToken"},
	} {
		res := post(tc.token, "move", tc.body)
		if res.code != tc.wantCode || !strings.Contains(res.errorMessage(t), tc.wantErr) {
			t.Errorf("move %s: %d %s, want %d containing %q", name, res.code, res.body, tc.wantCode, tc.wantErr)
		}
	}

	// The holder's own subject moves it (failback); the answer is the lease.
	res := post(tokenA, "move", body("cluster-b"))
	var moved leaseapi.Lease
	res.decode(t, &moved)
	want := leaseapi.Lease{Namespace: "ns", Name: "db", Holder: "cluster-a", FencingToken: term.FencingToken, TTLSeconds: ttlSeconds,
		AcquiredAt: term.AcquiredAt, RenewedAt: term.RenewedAt, ExpiresAt: term.ExpiresAt, Revoked: true,
		Move: &leaseapi.Move{From: "cluster-a", To: "cluster-b"}}
	if diff := cmp.Diff(want, moved); res.code != http.StatusOK || diff != "" {
		t.Fatalf("move: %d (-want +got):\n%s", res.code, diff)
	}
	if got := testutil.ToFloat64(f.srv.Metrics.outcomes.WithLabelValues("moved")); got != 1 {
		t.Errorf("moved outcomes = %v, want 1", got)
	}
	// An administrator asking again for another destination is refused.
	if res := post(tokenAdmin, "move", body("cluster-z")); res.code != http.StatusConflict || !strings.Contains(res.errorMessage(t), "already moving") {
		t.Errorf("a second move elsewhere: %d %s, want 409 already moving", res.code, res.body)
	}
	// The holder is told its term is revoked, as for any revocation.
	var renewed leaseapi.AcquireResponse
	post(tokenA, "renew", fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d,"ttlSeconds":10}`, term.FencingToken)).decode(t, &renewed)
	if renewed.Acquired || !renewed.Revoked || renewed.Move == nil || renewed.Move.To != "cluster-b" {
		t.Fatalf("the holder's renew of its moving term: %+v, want revoked and moving to cluster-b", renewed)
	}

	// Handed over: reserved for cluster-b; cluster-a is refused with a
	// message, and sees the reservation on GET.
	f.clock.Step(time.Second)
	if res := post(tokenA, "release", fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, term.FencingToken)); res.code != http.StatusNoContent {
		t.Fatalf("release: %d %s", res.code, res.body)
	}
	until := f.clock.Now().UTC().Add(ttlSeconds * time.Second)
	refused := f.acquire(tokenA, "ns", "db", "cluster-a", ttlSeconds)
	wantRefused := leaseapi.AcquireResponse{FencingToken: term.FencingToken, AcquiredAt: term.AcquiredAt, RenewedAt: f.clock.Now().UTC().Add(-time.Second),
		ExpiresAt: renewed.ExpiresAt, Reservation: leaseapi.Reservation{ReservedFor: "cluster-b", ReservedUntil: until},
		Message: "lease is reserved for cluster cluster-b until " + until.Format(time.RFC3339) + " (a move's destination)"}
	if diff := cmp.Diff(wantRefused, refused); diff != "" {
		t.Errorf("acquire by another cluster while reserved (-want +got):\n%s", diff)
	}
	var l leaseapi.Lease
	f.do(request{method: http.MethodGet, path: leasePath("ns", "db", ""), token: tokenB}).decode(t, &l)
	if l.Holder != "" || l.Move != nil || l.ReservedFor != "cluster-b" || !l.ReservedUntil.Equal(until) {
		t.Errorf("lease while reserved: %+v", l)
	}
	got := f.acquire(tokenB, "ns", "db", "cluster-b", ttlSeconds)
	if !got.Acquired || got.FencingToken != term.FencingToken+1 || got.ReservedFor != "" || got.Message != "" {
		t.Fatalf("acquire by the destination: %+v", got)
	}

	// A free lease: nothing to move, the record answered as it is.
	if res := post(tokenB, "release", fmt.Sprintf(`{"holder":"cluster-b","fencingToken":%d}`, got.FencingToken)); res.code != http.StatusNoContent {
		t.Fatal(res.body)
	}
	var free leaseapi.Lease
	res = post(tokenAdmin, "move", fmt.Sprintf(`{"holder":"cluster-b","fencingToken":%d}`, got.FencingToken))
	res.decode(t, &free)
	if res.code != http.StatusOK || free.Holder != "" || free.Move != nil {
		t.Errorf("move of a free lease: %d %+v, want 200 and the free lease", res.code, free)
	}
}

// TestHistory: the terms of a lease over the wire, newest first, the live
// one first without an end; readable by any authenticated subject.
func TestHistory(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	get := func(token, query string) response {
		return f.do(request{method: http.MethodGet, path: leasePath("ns", "db", "history") + query, token: token})
	}
	if res := get(tokenA, ""); res.code != http.StatusNotFound {
		t.Fatalf("history of a lease never seen: %d %s, want 404", res.code, res.body)
	}
	first := f.acquire(tokenA, "ns", "db", "cluster-a", 10)
	f.clock.Step(2 * time.Second)
	if res := f.do(request{method: http.MethodPost, path: leasePath("ns", "db", "release"), token: tokenA,
		body: fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, first.FencingToken)}); res.code != http.StatusNoContent {
		t.Fatal(res.body)
	}
	released := f.clock.Now().UTC()
	second := f.acquire(tokenB, "ns", "db", "cluster-b", 10)

	var list leaseapi.TermList
	res := get(tokenAdmin, "")
	res.decode(t, &list)
	want := []leaseapi.Term{
		{Holder: "cluster-b", FencingToken: second.FencingToken, AcquiredAt: second.AcquiredAt},
		{Holder: "cluster-a", FencingToken: first.FencingToken, AcquiredAt: first.AcquiredAt, EndedAt: released, Ending: leaseapi.TermReleased},
	}
	if diff := cmp.Diff(want, list.Items); res.code != http.StatusOK || diff != "" {
		t.Fatalf("history: %d (-want +got):\n%s", res.code, diff)
	}
	if !strings.Contains(string(res.body), `"ending":"released"`) || strings.Count(string(res.body), "endedAt") != 1 {
		t.Errorf("history body %s: want one endedAt and the ending named", res.body)
	}
	get(tokenB, "?limit=1").decode(t, &list)
	if len(list.Items) != 1 || list.Items[0].FencingToken != second.FencingToken {
		t.Errorf("history limited to 1: %+v", list.Items)
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x"} {
		if res := get(tokenA, q); res.code != http.StatusBadRequest || !strings.Contains(res.errorMessage(t), "limit") {
			t.Errorf("history%s: %d %s, want 400 naming limit", q, res.code, res.body)
		}
	}
	if res := get("", ""); res.code != http.StatusUnauthorized {
		t.Errorf("history without credentials: %d, want 401", res.code)
	}
}
