package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

const acquireA = `{"holder":"cluster-a","ttlSeconds":10}`

func TestErrorAnswers(t *testing.T) {
	heldByB := func(f *fixture) { f.acquire(tokenB, "ns", "lease", "cluster-b", 10) }
	heldByA := func(f *fixture) { f.acquire(tokenA, "ns", "lease", "cluster-a", 10) }
	register := func(id, token, fingerprint string) func(f *fixture) {
		return func(f *fixture) {
			res := f.do(request{method: http.MethodPut, path: "/v1alpha1/clusters/" + id, token: token,
				body: fmt.Sprintf(`{"fingerprint":%q,"agentVersion":"v1"}`, fingerprint)})
			if res.code != http.StatusOK {
				f.t.Fatalf("register %s: %d %s", id, res.code, res.body)
			}
		}
	}
	acquirePath := leasePath("ns", "lease", "acquire")
	renewPath := leasePath("ns", "lease", "renew")
	releasePath := leasePath("ns", "lease", "release")
	post := func(path, token, body string) request {
		return request{method: http.MethodPost, path: path, token: token, body: body}
	}
	get := func(path, token string) request { return request{method: http.MethodGet, path: path, token: token} }
	cont := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

	cases := map[string]struct {
		setup       func(f *fixture)
		req         request
		wantCode    int
		wantInError string
		wantHeader  map[string]string
	}{
		// 413
		"body over 4 KiB": {
			req:      post(acquirePath, tokenA, `{"holder":"cluster-a","ttlSeconds":10}`+strings.Repeat(" ", leaseapi.MaxBodyBytes)),
			wantCode: http.StatusRequestEntityTooLarge, wantInError: "4096",
		},
		// 400 naming the field
		"malformed JSON": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-a",`), wantCode: http.StatusBadRequest, wantInError: "body: ",
		},
		"empty body": {
			req: post(acquirePath, tokenA, ""), wantCode: http.StatusBadRequest, wantInError: "body: ",
		},
		"two JSON values": {
			req: post(acquirePath, tokenA, acquireA+acquireA), wantCode: http.StatusBadRequest, wantInError: "body: ",
		},
		"unknown field": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-a","ttlSeconds":10,"priority":1}`), wantCode: http.StatusBadRequest, wantInError: "priority: ",
		},
		"wrong type": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-a","ttlSeconds":"10"}`), wantCode: http.StatusBadRequest, wantInError: "ttlSeconds: ",
		},
		"empty holder": {
			req: post(acquirePath, tokenA, `{"holder":"","ttlSeconds":10}`), wantCode: http.StatusBadRequest, wantInError: "holder: ",
		},
		"holder over 253 bytes": {
			req:      post(acquirePath, tokenA, fmt.Sprintf(`{"holder":"cluster-a/%s","ttlSeconds":10}`, strings.Repeat("x", 244))),
			wantCode: http.StatusBadRequest, wantInError: "holder: ",
		},
		"ttlSeconds zero": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-a","ttlSeconds":0}`), wantCode: http.StatusBadRequest, wantInError: "ttlSeconds: ",
		},
		"ttlSeconds missing": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-a"}`), wantCode: http.StatusBadRequest, wantInError: "ttlSeconds: ",
		},
		"ttlSeconds negative on renew": {
			req: post(renewPath, tokenA, `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":-1}`), wantCode: http.StatusBadRequest, wantInError: "ttlSeconds: ",
		},
		"fencingToken missing on release": {
			req: post(releasePath, tokenA, `{"holder":"cluster-a"}`), wantCode: http.StatusBadRequest, wantInError: "fencingToken: ",
		},
		"uppercase namespace": {
			req: post(leasePath("NS", "lease", "acquire"), tokenA, acquireA), wantCode: http.StatusBadRequest, wantInError: "namespace: ",
		},
		"namespace over 63 characters": {
			req: get(leasePath(strings.Repeat("n", 64), "lease", ""), tokenA), wantCode: http.StatusBadRequest, wantInError: "namespace: ",
		},
		"name with an underscore": {
			req: post(leasePath("ns", "bad_name", "acquire"), tokenA, acquireA), wantCode: http.StatusBadRequest, wantInError: "name: ",
		},
		"namespace.name of 254 characters": {
			req: post(leasePath("ns", strings.Repeat("a", 251), "acquire"), tokenA, acquireA), wantCode: http.StatusBadRequest, wantInError: "name: ",
		},
		"namespace.name of exactly 253 characters is fine": {
			req: post(leasePath("ns", strings.Repeat("a", 250), "acquire"), tokenA, acquireA), wantCode: http.StatusOK,
		},
		"limit zero": {
			req: get("/v1alpha1/leases?limit=0", tokenA), wantCode: http.StatusBadRequest, wantInError: "limit: ",
		},
		"limit not a number": {
			req: get("/v1alpha1/leases?limit=ten", tokenA), wantCode: http.StatusBadRequest, wantInError: "limit: ",
		},
		"limit over the maximum": {
			req: get("/v1alpha1/leases?limit=1001", tokenA), wantCode: http.StatusBadRequest, wantInError: "limit: ",
		},
		"continue not base64": {
			req: get("/v1alpha1/leases?continue=%21%21%21", tokenA), wantCode: http.StatusBadRequest, wantInError: "continue: ",
		},
		"continue not a key": {
			req: get("/v1alpha1/leases?continue="+cont("no-slash"), tokenA), wantCode: http.StatusBadRequest, wantInError: "continue: ",
		},
		"list namespace invalid": {
			req: get("/v1alpha1/leases?namespace=Bad", tokenA), wantCode: http.StatusBadRequest, wantInError: "namespace: ",
		},
		"cluster id invalid": {
			req:      request{method: http.MethodPut, path: "/v1alpha1/clusters/Cluster_A", token: tokenA, body: `{"fingerprint":"f"}`},
			wantCode: http.StatusBadRequest, wantInError: "id: ",
		},
		"registration without fingerprint": {
			req:      request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-a", token: tokenA, body: `{"agentVersion":"v1"}`},
			wantCode: http.StatusBadRequest, wantInError: "fingerprint: ",
		},
		// 401
		"no credentials": {
			req:      post(acquirePath, "", acquireA),
			wantCode: http.StatusUnauthorized, wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="berth"`},
		},
		"unknown token": {
			req:      get("/v1alpha1/leases", "not-a-token"),
			wantCode: http.StatusUnauthorized, wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="berth"`},
		},
		"not a bearer token": {
			req:      request{method: http.MethodGet, path: "/v1alpha1/clusters", header: map[string]string{"Authorization": "Basic " + tokenA}},
			wantCode: http.StatusUnauthorized, wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="berth"`},
		},
		// 403
		"acquire as another cluster": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-b","ttlSeconds":10}`), wantCode: http.StatusForbidden, wantInError: "cluster-b",
		},
		"acquire as a holder that only shares a prefix": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-ab","ttlSeconds":10}`), wantCode: http.StatusForbidden, wantInError: "cluster-ab",
		},
		"acquire as another cluster's sub-holder": {
			req: post(acquirePath, tokenA, `{"holder":"cluster-b/x","ttlSeconds":10}`), wantCode: http.StatusForbidden, wantInError: "cluster-b/x",
		},
		"renew another cluster's lease": {
			setup: heldByB,
			req:   post(renewPath, tokenA, `{"holder":"cluster-b","fencingToken":1,"ttlSeconds":10}`), wantCode: http.StatusForbidden,
		},
		"release another cluster's lease": {
			setup: heldByB,
			req:   post(releasePath, tokenA, `{"holder":"cluster-b","fencingToken":1}`), wantCode: http.StatusForbidden,
		},
		"register another cluster": {
			req:      request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-b", token: tokenA, body: `{"fingerprint":"f"}`},
			wantCode: http.StatusForbidden,
		},
		"cordon as a non-administrator": {
			setup: register("cluster-b", tokenB, "fp-b"),
			req:   post("/v1alpha1/clusters/cluster-b/cordon", tokenA, ""), wantCode: http.StatusForbidden, wantInError: "administrator",
		},
		"uncordon own cluster as a non-administrator": {
			setup: register("cluster-a", tokenA, "fp-a"),
			req:   post("/v1alpha1/clusters/cluster-a/uncordon", tokenA, ""), wantCode: http.StatusForbidden, wantInError: "administrator",
		},
		// 404
		"lease never seen": {
			req: get(leasePath("ns", "never", ""), tokenA), wantCode: http.StatusNotFound,
		},
		"unknown route": {
			req: get("/v1alpha1/nothing", tokenA), wantCode: http.StatusNotFound,
		},
		"unknown verb on a lease": {
			req: post(leasePath("ns", "lease", "steal"), tokenA, acquireA), wantCode: http.StatusNotFound,
		},
		"cordon of an unregistered cluster": {
			req: post("/v1alpha1/clusters/cluster-z/cordon", tokenAdmin, ""), wantCode: http.StatusNotFound,
		},
		// 405
		"DELETE a lease": {
			req:      request{method: http.MethodDelete, path: leasePath("ns", "lease", ""), token: tokenA},
			wantCode: http.StatusMethodNotAllowed, wantHeader: map[string]string{"Allow": "GET"},
		},
		"GET acquire": {
			req:      get(acquirePath, tokenA),
			wantCode: http.StatusMethodNotAllowed, wantHeader: map[string]string{"Allow": "POST"},
		},
		"POST the lease list": {
			req:      post("/v1alpha1/leases", tokenA, "{}"),
			wantCode: http.StatusMethodNotAllowed, wantHeader: map[string]string{"Allow": "GET"},
		},
		"GET one cluster": {
			req:      get("/v1alpha1/clusters/cluster-a", tokenA),
			wantCode: http.StatusMethodNotAllowed, wantHeader: map[string]string{"Allow": "PUT"},
		},
		// 409
		"release with the wrong token": {
			setup: heldByA,
			req:   post(releasePath, tokenA, `{"holder":"cluster-a","fencingToken":2}`), wantCode: http.StatusConflict,
		},
		"release by a sub-holder that does not hold": {
			setup: heldByA,
			req:   post(releasePath, tokenA, `{"holder":"cluster-a/x","fencingToken":1}`), wantCode: http.StatusConflict,
		},
		"fingerprint conflict": {
			setup:    register("cluster-a", tokenA, "fp-1"),
			req:      request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-a", token: tokenA, body: `{"fingerprint":"fp-2"}`},
			wantCode: http.StatusConflict, wantInError: "fp-1",
		},
		"cordoned cluster acquiring": {
			setup: func(f *fixture) {
				register("cluster-a", tokenA, "fp-a")(f)
				if res := f.do(post("/v1alpha1/clusters/cluster-a/cordon", tokenAdmin, "")); res.code != http.StatusOK {
					f.t.Fatalf("cordon: %d %s", res.code, res.body)
				}
			},
			req:      post(acquirePath, tokenA, `{"holder":"cluster-a/worker","ttlSeconds":10}`),
			wantCode: http.StatusConflict, wantInError: "cordoned",
		},
		"tokens exhausted": {
			setup: func(f *fixture) {
				if _, err := f.backend.PutLease(f.t.Context(), store.Lease{Namespace: "ns", Name: "lease", FencingToken: math.MaxInt32}); err != nil {
					f.t.Fatal(err)
				}
			},
			req: post(acquirePath, tokenA, acquireA), wantCode: http.StatusConflict, wantInError: "exhausted",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			if tc.setup != nil {
				tc.setup(f)
			}
			res := f.do(tc.req)
			if res.code != tc.wantCode {
				t.Fatalf("status %d, want %d; body %s", res.code, tc.wantCode, res.body)
			}
			if msg := res.errorMessage(t); !strings.Contains(msg, tc.wantInError) {
				t.Errorf("error %q does not contain %q", msg, tc.wantInError)
			}
			for k, want := range tc.wantHeader {
				if got := res.header.Get(k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
			if _, ok := res.header["Www-Authenticate"]; ok != (tc.wantCode == http.StatusUnauthorized) {
				t.Errorf("WWW-Authenticate present = %v on a %d", ok, res.code)
			}
		})
	}
}

func TestLeaseLifecycle(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	at := func(d time.Duration) time.Time { return epoch.Add(d) }

	got := f.acquire(tokenA, "ns", "lease", "cluster-a", 10)
	want := leaseapi.AcquireResponse{Acquired: true, Holder: "cluster-a", FencingToken: 1, AcquiredAt: at(0), RenewedAt: at(0), ExpiresAt: at(10 * time.Second)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("first acquire (-want +got):\n%s", diff)
	}

	// Another cluster is told who holds it.
	got = f.acquire(tokenB, "ns", "lease", "cluster-b", 10)
	want = leaseapi.AcquireResponse{Holder: "cluster-a", FencingToken: 1, AcquiredAt: at(0), RenewedAt: at(0), ExpiresAt: at(10 * time.Second)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("acquire by another (-want +got):\n%s", diff)
	}

	// The holder renews, keeping the token.
	f.clock.Step(4 * time.Second)
	res := f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "renew"), token: tokenA,
		body: `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":20}`})
	res.decode(t, &got)
	want = leaseapi.AcquireResponse{Acquired: true, Holder: "cluster-a", FencingToken: 1, AcquiredAt: at(0), RenewedAt: at(4 * time.Second), ExpiresAt: at(24 * time.Second)}
	if diff := cmp.Diff(want, got); diff != "" || res.code != http.StatusOK {
		t.Fatalf("renew: %d (-want +got):\n%s", res.code, diff)
	}

	// Release frees it and keeps the token; GET shows it free.
	res = f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "release"), token: tokenA,
		body: `{"holder":"cluster-a","fencingToken":1}`})
	if res.code != http.StatusNoContent || len(res.body) != 0 {
		t.Fatalf("release: %d %q, want 204 without a body", res.code, res.body)
	}
	var l leaseapi.Lease
	res = f.do(request{method: http.MethodGet, path: leasePath("ns", "lease", ""), token: tokenB})
	res.decode(t, &l)
	wantLease := leaseapi.Lease{Namespace: "ns", Name: "lease", FencingToken: 1, TTLSeconds: 20, AcquiredAt: at(0), RenewedAt: at(4 * time.Second), ExpiresAt: at(24 * time.Second)}
	if diff := cmp.Diff(wantLease, l); diff != "" || res.code != http.StatusOK {
		t.Fatalf("get after release: %d (-want +got):\n%s", res.code, diff)
	}

	// Releasing again, and releasing a lease never seen, are 204.
	for _, path := range []string{leasePath("ns", "lease", "release"), leasePath("ns", "never", "release")} {
		res = f.do(request{method: http.MethodPost, path: path, token: tokenA, body: `{"holder":"cluster-a","fencingToken":1}`})
		if res.code != http.StatusNoContent {
			t.Fatalf("release %s again: %d %s", path, res.code, res.body)
		}
	}

	// The old holder's renew is lost; a sub-holder of the other cluster takes the next token.
	res = f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "renew"), token: tokenA,
		body: `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":10}`})
	got = leaseapi.AcquireResponse{}
	res.decode(t, &got)
	if res.code != http.StatusOK || got.Acquired || got.Holder != "" || got.FencingToken != 1 {
		t.Fatalf("renew after release: %d %+v, want 200 acquired=false holder=\"\" token 1", res.code, got)
	}
	got = f.acquire(tokenB, "ns", "lease", "cluster-b/worker-0", 5)
	if !got.Acquired || got.Holder != "cluster-b/worker-0" || got.FencingToken != 2 {
		t.Fatalf("acquire by cluster-b/worker-0: %+v, want acquired with token 2", got)
	}

	// Its term ends exactly at +5s on the server's clock: then it is free,
	// a renew is lost and anyone takes it with the next token.
	f.clock.Step(5 * time.Second)
	l = leaseapi.Lease{}
	f.do(request{method: http.MethodGet, path: leasePath("ns", "lease", ""), token: tokenA}).decode(t, &l)
	if l.Holder != "" || l.FencingToken != 2 {
		t.Fatalf("get after expiry: %+v, want free with token 2", l)
	}
	res = f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "renew"), token: tokenB,
		body: `{"holder":"cluster-b/worker-0","fencingToken":2,"ttlSeconds":10}`})
	got = leaseapi.AcquireResponse{}
	res.decode(t, &got)
	if got.Acquired {
		t.Fatalf("renew after expiry: %+v, want lost", got)
	}
	got = f.acquire(tokenA, "ns", "lease", "cluster-a", 10)
	if !got.Acquired || got.FencingToken != 3 {
		t.Fatalf("acquire after expiry: %+v, want acquired with token 3", got)
	}

	// Acquire by the holder renews and keeps the token.
	f.clock.Step(time.Second)
	got = f.acquire(tokenA, "ns", "lease", "cluster-a", 10)
	if !got.Acquired || got.FencingToken != 3 || !got.ExpiresAt.Equal(at(20*time.Second)) {
		t.Fatalf("re-acquire by holder: %+v, want token 3 until +20s", got)
	}
}

func TestAdminMayReleaseAnyLease(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	f.acquire(tokenA, "ns", "lease", "cluster-a/x", 10)

	cases := map[string]struct {
		token    string
		body     string
		wantCode int
	}{
		"other cluster":        {token: tokenB, body: `{"holder":"cluster-a/x","fencingToken":1}`, wantCode: http.StatusForbidden},
		"admin, wrong token":   {token: tokenAdmin, body: `{"holder":"cluster-a/x","fencingToken":7}`, wantCode: http.StatusConflict},
		"admin, holder's term": {token: tokenAdmin, body: `{"holder":"cluster-a/x","fencingToken":1}`, wantCode: http.StatusNoContent},
	}
	for _, name := range []string{"other cluster", "admin, wrong token", "admin, holder's term"} {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			res := f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "release"), token: tc.token, body: tc.body})
			if res.code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", res.code, tc.wantCode, res.body)
			}
		})
	}
	var l leaseapi.Lease
	f.do(request{method: http.MethodGet, path: leasePath("ns", "lease", ""), token: tokenB}).decode(t, &l)
	if l.Holder != "cluster-a/x" || l.FencingToken != 1 || !l.Revoked {
		t.Fatalf("after admin release: %+v, want still cluster-a/x's term 1, revoked (revoke_test.go)", l)
	}
}

func TestClusterRegistry(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	put := func(token, id, body string) response {
		return f.do(request{method: http.MethodPut, path: "/v1alpha1/clusters/" + id, token: token, body: body})
	}
	res := put(tokenA, "cluster-a", `{"fingerprint":"fp-1","agentVersion":"v0.1.0","labels":{"region":"eu"}}`)
	var reg leaseapi.ClusterRegistrationResponse
	res.decode(t, &reg)
	if diff := cmp.Diff(leaseapi.ClusterRegistrationResponse{ID: "cluster-a", LastSeen: epoch}, reg); diff != "" || res.code != http.StatusOK {
		t.Fatalf("register: %d (-want +got):\n%s", res.code, diff)
	}
	f.acquire(tokenA, "ns", "one", "cluster-a", 60)
	f.acquire(tokenA, "ns", "two", "cluster-a/x", 60)

	// Cordon (admin only) blocks new acquisitions but not renewals.
	res = f.do(request{method: http.MethodPost, path: "/v1alpha1/clusters/cluster-a/cordon", token: tokenAdmin})
	reg = leaseapi.ClusterRegistrationResponse{}
	res.decode(t, &reg)
	if res.code != http.StatusOK || !reg.Cordoned {
		t.Fatalf("cordon: %d %+v", res.code, reg)
	}
	if res := f.do(request{method: http.MethodPost, path: leasePath("ns", "three", "acquire"), token: tokenA, body: acquireA}); res.code != http.StatusConflict {
		t.Fatalf("acquire while cordoned: %d %s, want 409", res.code, res.body)
	}
	if got := f.acquire(tokenA, "ns", "one", "cluster-a", 60); !got.Acquired {
		t.Fatalf("renew by acquire while cordoned: %+v, want held", got)
	}
	// A heartbeat reports the cordon.
	res = put(tokenA, "cluster-a", `{"fingerprint":"fp-1","agentVersion":"v0.1.0"}`)
	reg = leaseapi.ClusterRegistrationResponse{}
	res.decode(t, &reg)
	if !reg.Cordoned {
		t.Fatalf("heartbeat while cordoned: %+v, want cordoned", reg)
	}

	var list leaseapi.ClusterList
	f.do(request{method: http.MethodGet, path: "/v1alpha1/clusters", token: tokenB}).decode(t, &list)
	wantList := leaseapi.ClusterList{Items: []leaseapi.Cluster{{
		ID: "cluster-a", Fingerprint: "fp-1", AgentVersion: "v0.1.0", LastSeen: epoch, Healthy: true, Cordoned: true, LeasesHeld: 2,
	}}}
	if diff := cmp.Diff(wantList, list); diff != "" {
		t.Fatalf("cluster list (-want +got):\n%s", diff)
	}

	res = f.do(request{method: http.MethodPost, path: "/v1alpha1/clusters/cluster-a/uncordon", token: tokenAdmin})
	if res.code != http.StatusOK {
		t.Fatalf("uncordon: %d %s", res.code, res.body)
	}
	if got := f.acquire(tokenA, "ns", "three", "cluster-a", 10); !got.Acquired {
		t.Fatalf("acquire after uncordon: %+v", got)
	}

	// A different fingerprint is refused while the registration is live,
	// and accepted once it is not.
	if res := put(tokenA, "cluster-a", `{"fingerprint":"fp-2"}`); res.code != http.StatusConflict {
		t.Fatalf("second fingerprint while live: %d %s, want 409", res.code, res.body)
	}
	f.clock.Step(31 * time.Second)
	if res := put(tokenA, "cluster-a", `{"fingerprint":"fp-2"}`); res.code != http.StatusOK {
		t.Fatalf("second fingerprint after the first went stale: %d %s, want 200", res.code, res.body)
	}
}

func TestPagination(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	var want []string
	for _, key := range []string{"a/l1", "a/l2", "a/l3", "b/l1", "b/l2", "c/l1", "c/l2"} {
		ns, name, _ := strings.Cut(key, "/")
		f.acquire(tokenA, ns, name, "cluster-a", 10)
		want = append(want, key)
	}
	cases := map[string]struct {
		query     string
		limit     int
		want      []string
		wantPages int
	}{
		"all, three a page":    {limit: 3, want: want, wantPages: 3},
		"all, one a page":      {limit: 1, want: want, wantPages: 7},
		"all, default page":    {want: want, wantPages: 1},
		"one namespace":        {query: "namespace=b", limit: 1, want: []string{"b/l1", "b/l2"}, wantPages: 2},
		"empty namespace":      {query: "namespace=z", limit: 2, wantPages: 1},
		"exactly a page":       {query: "namespace=a", limit: 3, want: []string{"a/l1", "a/l2", "a/l3"}, wantPages: 1},
		"page boundary at end": {query: "namespace=c", limit: 1, want: []string{"c/l1", "c/l2"}, wantPages: 2},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []string
			pages := 0
			cont := ""
			for {
				q := tc.query
				if tc.limit > 0 {
					q += fmt.Sprintf("&limit=%d", tc.limit)
				}
				if cont != "" {
					q += "&continue=" + cont
				}
				res := f.do(request{method: http.MethodGet, path: "/v1alpha1/leases?" + q, token: tokenB})
				if res.code != http.StatusOK {
					t.Fatalf("list %s: %d %s", q, res.code, res.body)
				}
				var page leaseapi.LeaseList
				res.decode(t, &page)
				if page.Items == nil {
					t.Fatalf("list %s: items is null, want a list", q)
				}
				for _, l := range page.Items {
					if l.Holder != "cluster-a" || l.FencingToken != 1 {
						t.Errorf("item %+v, want held by cluster-a with token 1", l)
					}
					got = append(got, l.Namespace+"/"+l.Name)
				}
				pages++
				if cont = page.Continue; cont == "" || pages > 10 {
					break
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			// The last page may be empty when the page before was full.
			if pages != tc.wantPages && pages != tc.wantPages+1 {
				t.Errorf("pages = %d, want %d", pages, tc.wantPages)
			}
		})
	}
}

func TestInternalError(t *testing.T) {
	cases := map[string]struct {
		op  string
		req request
	}{
		"acquire, write fails": {
			op:  "PutLease",
			req: request{method: http.MethodPost, path: leasePath("ns", "lease", "acquire"), token: tokenA, body: acquireA},
		},
		"acquire, read fails": {
			op:  "GetLease",
			req: request{method: http.MethodPost, path: leasePath("ns", "lease", "acquire"), token: tokenA, body: acquireA},
		},
		"renew, read fails": {
			op:  "GetLease",
			req: request{method: http.MethodPost, path: leasePath("ns", "lease", "renew"), token: tokenA, body: `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":5}`},
		},
		"release, read fails": {
			op:  "GetLease",
			req: request{method: http.MethodPost, path: leasePath("ns", "lease", "release"), token: tokenA, body: `{"holder":"cluster-a","fencingToken":1}`},
		},
		"get fails": {
			op:  "GetLease",
			req: request{method: http.MethodGet, path: leasePath("ns", "lease", ""), token: tokenA},
		},
		"list fails": {
			op:  "ListLeases",
			req: request{method: http.MethodGet, path: "/v1alpha1/leases", token: tokenA},
		},
		"register fails": {
			op:  "PutCluster",
			req: request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-a", token: tokenA, body: `{"fingerprint":"f"}`},
		},
		"cluster list fails": {
			op:  "ListClusters",
			req: request{method: http.MethodGet, path: "/v1alpha1/clusters", token: tokenA},
		},
		"cordon check fails": {
			op:  "GetCluster",
			req: request{method: http.MethodPost, path: leasePath("ns", "other", "acquire"), token: tokenA, body: acquireA},
		},
	}
	const detail = "disk controller on fire at sector 42"
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			f.store.failNext(tc.op, errors.New(detail))
			tc.req.header = map[string]string{leaseapi.RequestIDHeader: "caller-id-" + tc.op}
			res := f.do(tc.req)
			id := res.header.Get(leaseapi.RequestIDHeader)
			if res.code != http.StatusInternalServerError {
				t.Fatalf("status %d, want 500: %s", res.code, res.body)
			}
			if id != "caller-id-"+tc.op {
				t.Errorf("request id %q, want the caller's", id)
			}
			wantBody := fmt.Sprintf(`{"error":"internal error","requestId":%q}`, id)
			if diff := cmp.Diff(wantBody, strings.TrimSpace(string(res.body))); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			var logged bool
			for _, e := range f.logs.entries(t, "internal error") {
				if e["requestId"] == id && strings.Contains(fmt.Sprint(e["error"]), detail) {
					logged = true
				}
			}
			if !logged {
				t.Errorf("no internal error with request id %s and the detail in the log:\n%s", id, f.logs)
			}
			// The failure was one call: the same request now succeeds.
			tc.req.header = nil
			if res := f.do(tc.req); res.code >= 500 {
				t.Errorf("retry: %d %s", res.code, res.body)
			}
		})
	}
}

func TestRequestID(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	cases := map[string]struct {
		req      request
		incoming string
		wantEcho bool
		wantCode int
	}{
		"generated on success":        {req: request{method: http.MethodGet, path: "/healthz"}},
		"generated on 401":            {req: request{method: http.MethodGet, path: "/v1alpha1/leases"}},
		"generated on 404":            {req: request{method: http.MethodGet, path: "/nope"}},
		"generated on 204":            {req: request{method: http.MethodPost, path: leasePath("ns", "x", "release"), token: tokenA, body: `{"holder":"cluster-a","fencingToken":1}`}},
		"valid incoming echoed":       {req: request{method: http.MethodGet, path: "/healthz"}, incoming: "abc-DEF_1.2:3", wantEcho: true},
		"echoed on an error":          {req: request{method: http.MethodGet, path: "/v1alpha1/leases"}, incoming: "trace-77", wantEcho: true},
		"64 characters echoed":        {req: request{method: http.MethodGet, path: "/healthz"}, incoming: strings.Repeat("r", 64), wantEcho: true},
		"65 characters replaced":      {req: request{method: http.MethodGet, path: "/healthz"}, incoming: strings.Repeat("r", 65)},
		"space replaced":              {req: request{method: http.MethodGet, path: "/healthz"}, incoming: "two words"},
		"log injection replaced":      {req: request{method: http.MethodGet, path: "/healthz"}, incoming: `x" "status"=200`},
		"non-ASCII replaced":          {req: request{method: http.MethodGet, path: "/healthz"}, incoming: "idé"},
		"header-splitting attempt ok": {req: request{method: http.MethodGet, path: "/healthz"}, incoming: "a%0d%0aSet-Cookie:x"},
		"redirect of a doubled slash": {req: request{method: http.MethodGet, path: "/v1alpha1//leases"}, incoming: "redirected-1", wantEcho: true, wantCode: http.StatusTemporaryRedirect},
		"redirect of a dot-dot path":  {req: request{method: http.MethodPost, path: leasePath("ns", "x/../y", "acquire")}, wantCode: http.StatusTemporaryRedirect},
	}
	seen := map[string]bool{}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.incoming != "" {
				tc.req.header = map[string]string{leaseapi.RequestIDHeader: tc.incoming}
			}
			res := f.do(tc.req)
			if tc.wantCode != 0 && res.code != tc.wantCode {
				t.Fatalf("status %d, want %d", res.code, tc.wantCode)
			}
			id := res.header.Get(leaseapi.RequestIDHeader)
			if got := id == tc.incoming; got != tc.wantEcho {
				t.Fatalf("request id %q for incoming %q: echoed = %v, want %v", id, tc.incoming, got, tc.wantEcho)
			}
			if !validRequestID.MatchString(id) {
				t.Errorf("request id %q is not well formed", id)
			}
			if !tc.wantEcho {
				if seen[id] {
					t.Errorf("generated request id %q twice", id)
				}
				seen[id] = true
			}
		})
	}
}

func TestAccessLog(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	const badToken = "bad-token-never-to-be-logged"
	reqs := []request{
		{method: http.MethodPost, path: leasePath("ns", "lease", "acquire"), token: tokenA, body: acquireA, header: map[string]string{leaseapi.RequestIDHeader: "first"}},
		{method: http.MethodGet, path: "/v1alpha1/leases", token: badToken},
		{method: http.MethodGet, path: "/v1alpha1/clusters", token: tokenAdmin},
		{method: http.MethodGet, path: "/v1alpha1/leases", header: map[string]string{"Authorization": "Basic " + tokenB}},
	}
	for _, r := range reqs {
		f.do(r)
	}
	entries := f.logs.entries(t, "request")
	if len(entries) != len(reqs) {
		t.Fatalf("%d access-log lines for %d requests:\n%s", len(entries), len(reqs), f.logs)
	}
	type line struct {
		RequestID, Method, Route, Subject string
		Status                            float64
	}
	var got []line
	for _, e := range entries {
		got = append(got, line{RequestID: fmt.Sprint(e["requestId"]), Method: fmt.Sprint(e["method"]), Route: fmt.Sprint(e["route"]),
			Subject: fmt.Sprint(e["subject"]), Status: e["status"].(float64)})
	}
	got[1].RequestID, got[2].RequestID, got[3].RequestID = "", "", ""
	want := []line{
		{RequestID: "first", Method: "POST", Route: "/v1alpha1/namespaces/{namespace}/leases/{name}/acquire", Subject: "cluster-a", Status: 200},
		{Method: "GET", Route: "/v1alpha1/leases", Subject: "", Status: 401},
		{Method: "GET", Route: "/v1alpha1/clusters", Subject: "admin", Status: 200},
		{Method: "GET", Route: "/v1alpha1/leases", Subject: "", Status: 401},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access log (-want +got):\n%s", diff)
	}
	logs := f.logs.String()
	for _, secret := range []string{tokenA, tokenB, tokenAdmin, badToken} {
		if strings.Contains(logs, secret) {
			t.Errorf("log contains the token %q:\n%s", secret, logs)
		}
	}
}

func TestProbes(t *testing.T) {
	cases := map[string]struct {
		path     string
		failPing bool
		wantCode int
	}{
		"healthz":                 {path: "/healthz", wantCode: http.StatusOK},
		"healthz when store down": {path: "/healthz", failPing: true, wantCode: http.StatusOK},
		"readyz":                  {path: "/readyz", wantCode: http.StatusOK},
		"readyz when store down":  {path: "/readyz", failPing: true, wantCode: http.StatusServiceUnavailable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			if tc.failPing {
				f.store.failNext("Ping", errors.New("database is locked"))
			}
			// Probes need no credentials.
			res := f.do(request{method: http.MethodGet, path: tc.path})
			if res.code != tc.wantCode {
				t.Fatalf("%s: %d %s, want %d", tc.path, res.code, res.body, tc.wantCode)
			}
			if strings.Contains(string(res.body), "database is locked") {
				t.Errorf("probe body leaks the store error: %s", res.body)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	m := f.srv.Metrics
	acquirePath := leasePath("ns", "lease", "acquire")
	f.acquire(tokenA, "ns", "lease", "cluster-a", 10)                                             // acquired
	f.acquire(tokenB, "ns", "lease", "cluster-b", 10)                                             // held-by-other
	f.acquire(tokenA, "ns", "lease", "cluster-a", 10)                                             // renewed
	f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "renew"), token: tokenB, // lost
		body: `{"holder":"cluster-b","fencingToken":1,"ttlSeconds":5}`})
	f.do(request{method: http.MethodPost, path: acquirePath, token: "nope", body: acquireA})                                                          // unauthorized
	f.do(request{method: http.MethodPost, path: acquirePath, token: tokenB, body: acquireA})                                                          // unauthorized (403)
	f.do(request{method: http.MethodPost, path: acquirePath, token: tokenA, body: `{}`})                                                              // invalid
	f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "release"), token: tokenA, body: `{"holder":"cluster-a","fencingToken":9}`}) // conflict
	f.acquire(tokenA, "ns", "short", "cluster-a", 1)                                                                                                  // acquired
	f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "release"), token: tokenA, body: `{"holder":"cluster-a","fencingToken":1}`}) // released
	f.store.failNext("PutLease", errors.New("boom"))
	f.do(request{method: http.MethodPost, path: acquirePath, token: tokenA, body: acquireA}) // error
	f.do(request{method: http.MethodPut, path: "/v1alpha1/clusters/cluster-b", token: tokenB, body: `{"fingerprint":"f"}`})

	outcomes := map[string]float64{}
	for _, o := range []string{"acquired", "held-by-other", "renewed", "lost", "released", "conflict", "unauthorized", "invalid", "error"} {
		outcomes[o] = testutil.ToFloat64(m.outcomes.WithLabelValues(o))
	}
	wantOutcomes := map[string]float64{
		"acquired": 2, "held-by-other": 1, "renewed": 1, "lost": 1, "released": 1,
		"conflict": 1, "unauthorized": 2, "invalid": 1, "error": 1,
	}
	if diff := cmp.Diff(wantOutcomes, outcomes); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}

	const acquireRoute = "/v1alpha1/namespaces/{namespace}/leases/{name}/acquire"
	requests := map[string]float64{}
	for _, code := range []string{"200", "400", "401", "403", "500"} {
		requests[code] = testutil.ToFloat64(m.requests.WithLabelValues(acquireRoute, code))
	}
	if diff := cmp.Diff(map[string]float64{"200": 4, "400": 1, "401": 1, "403": 1, "500": 1}, requests); diff != "" {
		t.Errorf("acquire requests by code (-want +got):\n%s", diff)
	}
	transitions := map[string]float64{}
	for _, r := range []string{"acquired", "released", "expired"} {
		transitions[r] = testutil.ToFloat64(m.transitions.WithLabelValues(r))
	}
	if diff := cmp.Diff(map[string]float64{"acquired": 2, "released": 1, "expired": 0}, transitions); diff != "" {
		t.Errorf("transitions before the sweep (-want +got):\n%s", diff)
	}
	if n := testutil.CollectAndCount(m.storeDuration, "berth_leaseapi_store_duration_seconds"); n < 3 {
		t.Errorf("store latency series = %d, want one per operation used", n)
	}
	if n := testutil.CollectAndCount(m.requestDuration, "berth_leaseapi_request_duration_seconds"); n < 3 {
		t.Errorf("request latency series = %d, want one per route used", n)
	}

	// The sweep frees "short" after its second, and updates the gauges.
	f.clock.Step(time.Second)
	f.srv.sweep(t.Context())
	gauges := map[string]float64{
		"leasesHeld":       testutil.ToFloat64(m.leasesHeld),
		"expired":          testutil.ToFloat64(m.transitions.WithLabelValues("expired")),
		"clustersTotal":    testutil.ToFloat64(m.clustersTotal),
		"clustersHealthy":  testutil.ToFloat64(m.clustersHealthy),
		"clustersCordoned": testutil.ToFloat64(m.clustersCordoned),
	}
	wantGauges := map[string]float64{"leasesHeld": 0, "expired": 1, "clustersTotal": 1, "clustersHealthy": 1, "clustersCordoned": 0}
	if diff := cmp.Diff(wantGauges, gauges); diff != "" {
		t.Errorf("after the sweep (-want +got):\n%s", diff)
	}
	stored, err := f.backend.GetLease(t.Context(), "ns", "short")
	if err != nil || stored.Holder != "" || stored.FencingToken != 1 {
		t.Errorf("stored lease after the sweep: %+v %v, want free with token 1", stored, err)
	}

	// Everything is gatherable from the registry, as /metrics serves it.
	if _, err := m.Registry.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
}

func TestTokenFileReload(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	path := f.tokens.path
	list := func(token string) int {
		return f.do(request{method: http.MethodGet, path: "/v1alpha1/leases", token: token}).code
	}
	if code := list(tokenA); code != http.StatusOK {
		t.Fatalf("old token before reload: %d", code)
	}
	const rotated = "rotated-token-of-cluster-a"
	rewriteTokenFile(t, path, map[string]string{"cluster-a": rotated, "admin": tokenAdmin})
	if code := list(rotated); code != http.StatusUnauthorized {
		t.Fatalf("new token before reload: %d, want 401", code)
	}
	if err := f.tokens.Reload(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{"old": list(tokenA), "new": list(rotated), "removed subject": list(tokenB), "kept": list(tokenAdmin)}
	want := map[string]int{"old": 401, "new": 200, "removed subject": 401, "kept": 200}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("after reload (-want +got):\n%s", diff)
	}
	// The new token acts as its subject.
	if res := f.do(request{method: http.MethodPost, path: leasePath("ns", "lease", "acquire"), token: rotated, body: acquireA}); res.code != http.StatusOK {
		t.Fatalf("acquire with the rotated token: %d %s", res.code, res.body)
	}

	// A broken file is refused and the tokens in force stay.
	for name, content := range map[string]string{
		"no separator": "cluster-a\n",
		"not hex":      "cluster-a:zzzz\n",
		"short digest": "cluster-a:abcd\n",
		"no subject":   ":" + strings.Repeat("ab", 32) + "\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := f.tokens.Reload(); err == nil {
			t.Errorf("reload of a file with %s: no error", name)
		}
		if code := list(rotated); code != http.StatusOK {
			t.Errorf("after a failed reload (%s): token in force answered %d", name, code)
		}
	}
}
