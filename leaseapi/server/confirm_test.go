package server

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/satoken"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
)

// confirmFixture is the fixture with service account tokens accepted:
// cluster-a's keys are aKey (RSA), cluster-b's bKey (ECDSA).
type confirmFixture struct {
	*fixture
	aKey, bKey satokentest.Key
}

func newConfirmFixture(t *testing.T) *confirmFixture {
	t.Helper()
	cf := &confirmFixture{aKey: satokentest.NewRSA(t, "a-1"), bKey: satokentest.NewECDSA(t, "b-1")}
	dir := t.TempDir()
	satokentest.WriteJWKS(t, dir, "cluster-a", cf.aKey)
	satokentest.WriteJWKS(t, dir, "cluster-b", cf.bKey)
	keys, err := satoken.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	tokens := writeTokenFile(t, filepath.Join(t.TempDir(), "tokens"), defaultTokens)
	auth := NewAuthenticator(tokens, false, []string{"admin"}).
		AcceptServiceAccounts(satoken.NewVerifier(keys, testingclock.NewFakePassiveClock(epoch)))
	cf.fixture = newFixture(t, fixtureOptions{auth: auth})
	cf.tokens = tokens
	return cf
}

func confirmPath(ns, name, holder string, token any) string {
	return fmt.Sprintf("%s?holder=%s&fencingToken=%v", leasePath(ns, name, "confirmation"), holder, token)
}

// TestConfirmation: who may read a lease's confirmation, and what it
// answers.
func TestConfirmation(t *testing.T) {
	f := newConfirmFixture(t)
	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	f.acquire(tokenA, "payments", "exporter", "cluster-a", 30)
	f.acquire(tokenA, "payments", "other", "cluster-a", 30)
	f.acquire(tokenB, "billing", "exporter", "cluster-b", 30)
	f.clock.Step(4500 * time.Millisecond)

	podToken := f.aKey.Sign(t, satokentest.PodClaims(exporter, "fence-0", epoch))
	with := func(key satokentest.Key, lease leaseapi.Key, change func(*satokentest.Claims)) string {
		c := satokentest.PodClaims(lease, "fence-0", epoch)
		if change != nil {
			change(&c)
		}
		return key.Sign(t, c)
	}
	confirmed := leaseapi.Confirmation{Confirmed: true, Holder: "cluster-a", FencingToken: 1, TTLSeconds: 30, RemainingMillis: 25500}
	held := leaseapi.Confirmation{Holder: "cluster-a", FencingToken: 1, TTLSeconds: 30}

	cases := map[string]struct {
		path, token string
		wantCode    int
		want        leaseapi.Confirmation
		// wantMsg is part of the error's message.
		wantMsg string
	}{
		"the Pod's token": {
			path: confirmPath("payments", "exporter", "cluster-a", 1), token: podToken,
			wantCode: http.StatusOK, want: confirmed,
		},
		"the Pod's token, another fencing token": {
			path: confirmPath("payments", "exporter", "cluster-a", 2), token: podToken,
			wantCode: http.StatusOK, want: held,
		},
		"the holder's own bearer token": {
			path: confirmPath("payments", "exporter", "cluster-a", 1), token: tokenA,
			wantCode: http.StatusOK, want: confirmed,
		},
		"an administrator": {
			path: confirmPath("payments", "exporter", "cluster-a", 1), token: tokenAdmin,
			wantCode: http.StatusOK, want: confirmed,
		},
		"another cluster's bearer token": {
			path: confirmPath("payments", "exporter", "cluster-a", 1), token: tokenB,
			wantCode: http.StatusForbidden, wantMsg: `may not act as holder "cluster-a"`,
		},
		"the other cluster's Pod asks whether it holds": {
			path: confirmPath("payments", "exporter", "cluster-b", 1), token: with(f.bKey, exporter, nil),
			wantCode: http.StatusOK, want: held,
		},
		"a Pod's token for the holder of another cluster": {
			path: confirmPath("payments", "exporter", "cluster-b", 1), token: podToken,
			wantCode: http.StatusUnauthorized, wantMsg: `not signed by a service account key of cluster "cluster-b"`,
		},
		"a cluster without keys": {
			path: confirmPath("payments", "exporter", "cluster-c", 1), token: podToken,
			wantCode: http.StatusUnauthorized, wantMsg: `no service account keys for cluster "cluster-c"`,
		},
		"a Pod's token for another lease": {
			path: confirmPath("payments", "other", "cluster-a", 1), token: podToken,
			wantCode: http.StatusForbidden, wantMsg: `audience does not include "berth-leaseapi/payments/other"`,
		},
		"a Pod's token of another namespace": {
			path:     confirmPath("payments", "exporter", "cluster-a", 1),
			token:    with(f.aKey, exporter, func(c *satokentest.Claims) { c.Kubernetes["namespace"] = "billing" }),
			wantCode: http.StatusForbidden, wantMsg: `namespace "billing" may not confirm lease payments/exporter`,
		},
		"a token not bound to a Pod": {
			path:     confirmPath("payments", "exporter", "cluster-a", 1),
			token:    with(f.aKey, exporter, func(c *satokentest.Claims) { delete(c.Kubernetes, "pod") }),
			wantCode: http.StatusForbidden, wantMsg: "not bound to a Pod",
		},
		"an expired token": {
			path:     confirmPath("payments", "exporter", "cluster-a", 1),
			token:    with(f.aKey, exporter, func(c *satokentest.Claims) { c.Expiry = c.IssuedAt }),
			wantCode: http.StatusUnauthorized, wantMsg: "expired",
		},
		"a lease never seen": {
			path: confirmPath("payments", "never", "cluster-a", 1), token: with(f.aKey, leaseapi.Key{Namespace: "payments", Name: "never"}, nil),
			wantCode: http.StatusNotFound, wantMsg: "not found",
		},
		"no credentials": {
			path: confirmPath("payments", "exporter", "cluster-a", 1), wantCode: http.StatusUnauthorized, wantMsg: "unauthorized",
		},
		"an unknown opaque token": {
			path: confirmPath("payments", "exporter", "cluster-a", 1), token: "not-a-known-token",
			wantCode: http.StatusUnauthorized, wantMsg: "missing or invalid credentials",
		},
		"no holder": {
			path: leasePath("payments", "exporter", "confirmation") + "?fencingToken=1", token: podToken,
			wantCode: http.StatusBadRequest, wantMsg: "holder: must not be empty",
		},
		"a holder too long": {
			path: confirmPath("payments", "exporter", strings.Repeat("h", leaseapi.MaxHolderBytes+1), 1), token: tokenAdmin,
			wantCode: http.StatusBadRequest, wantMsg: "holder: must be at most 253 bytes",
		},
		"no fencing token": {
			path: leasePath("payments", "exporter", "confirmation") + "?holder=cluster-a", token: tokenA,
			wantCode: http.StatusBadRequest, wantMsg: "fencingToken: must be an integer between 1 and 2147483647",
		},
		"fencing token zero": {
			path: confirmPath("payments", "exporter", "cluster-a", 0), token: podToken,
			wantCode: http.StatusBadRequest, wantMsg: "fencingToken",
		},
		"fencing token beyond int32": {
			path: confirmPath("payments", "exporter", "cluster-a", "2147483648"), token: tokenA,
			wantCode: http.StatusBadRequest, wantMsg: "fencingToken",
		},
		"a bad key": {
			path: confirmPath("Payments", "exporter", "cluster-a", 1), token: tokenA,
			wantCode: http.StatusBadRequest, wantMsg: "namespace:",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res := f.do(request{method: http.MethodGet, path: tc.path, token: tc.token})
			if res.code != tc.wantCode {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, res.code, res.body, tc.wantCode)
			}
			if tc.wantCode != http.StatusOK {
				if msg := res.errorMessage(t); !strings.Contains(msg, tc.wantMsg) {
					t.Errorf("error %q does not say %q", msg, tc.wantMsg)
				}
				if tc.token != "" && strings.Contains(string(res.body), tc.token) {
					t.Errorf("error body %s quotes the token", res.body)
				}
				return
			}
			if cc := res.header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q, want no-store: a confirmation served later would stretch a fence's deadline", cc)
			}
			var got leaseapi.Confirmation
			res.decode(t, &got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("confirmation (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServiceAccountTokensOnlyConfirm: a Pod's token, valid for the lease,
// is refused by every other route as any unknown bearer is (401), and the
// token file's tokens keep working beside it.
func TestServiceAccountTokensOnlyConfirm(t *testing.T) {
	f := newConfirmFixture(t)
	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	podToken := f.aKey.Sign(t, satokentest.PodClaims(exporter, "fence-0", epoch))
	cases := map[string]request{
		"acquire": {method: http.MethodPost, path: leasePath("payments", "exporter", "acquire"), body: `{"holder":"cluster-a","ttlSeconds":30}`},
		"renew":   {method: http.MethodPost, path: leasePath("payments", "exporter", "renew"), body: `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":30}`},
		"release": {method: http.MethodPost, path: leasePath("payments", "exporter", "release"), body: `{"holder":"cluster-a","fencingToken":1}`},
		"get":     {method: http.MethodGet, path: leasePath("payments", "exporter", "")},
		"list":    {method: http.MethodGet, path: "/v1alpha1/leases"},
		"register": {method: http.MethodPut, path: "/v1alpha1/clusters/cluster-a",
			body: `{"fingerprint":"f","agentVersion":"v"}`},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			req.token = podToken
			if res := f.do(req); res.code != http.StatusUnauthorized {
				t.Errorf("%s %s with a Pod's token: %d %s, want 401", req.method, req.path, res.code, res.body)
			}
		})
	}
	f.acquire(tokenA, "payments", "exporter", "cluster-a", 30)
	res := f.do(request{method: http.MethodGet, path: confirmPath("payments", "exporter", "cluster-a", 1), token: podToken})
	if res.code != http.StatusOK {
		t.Fatalf("confirmation with the Pod's token: %d %s", res.code, res.body)
	}
}

// TestConfirmationLogAndMetrics: the access log names the Pod's service
// account and Pod; confirmations are counted by result.
func TestConfirmationLogAndMetrics(t *testing.T) {
	f := newConfirmFixture(t)
	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	f.acquire(tokenA, "payments", "exporter", "cluster-a", 30)
	podToken := f.aKey.Sign(t, satokentest.PodClaims(exporter, "fence-0", epoch))
	for _, token := range []int{1, 1, 2} {
		if res := f.do(request{method: http.MethodGet, path: confirmPath("payments", "exporter", "cluster-a", token), token: podToken}); res.code != http.StatusOK {
			t.Fatalf("confirmation: %d %s", res.code, res.body)
		}
	}
	m := f.srv.Metrics
	got := map[string]float64{
		"confirmed":     testutil.ToFloat64(m.confirmations.WithLabelValues("confirmed")),
		"not-confirmed": testutil.ToFloat64(m.confirmations.WithLabelValues("not-confirmed")),
	}
	if diff := cmp.Diff(map[string]float64{"confirmed": 2, "not-confirmed": 1}, got); diff != "" {
		t.Errorf("confirmations (-want +got):\n%s", diff)
	}
	var logged []map[string]any
	for _, e := range f.logs.entries(t, "request") {
		if e["route"] == "/v1alpha1/namespaces/{namespace}/leases/{name}/confirmation" {
			logged = append(logged, e)
		}
	}
	if len(logged) != 3 {
		t.Fatalf("%d access-log lines of confirmations, want 3", len(logged))
	}
	e := logged[0]
	if e["subject"] != "system:serviceaccount:payments:worker@cluster-a" || e["pod"] != "payments/fence-0" || e["podUID"] != "fence-0-uid" {
		t.Errorf("access log of a Pod's confirmation: subject %v, pod %v, podUID %v", e["subject"], e["pod"], e["podUID"])
	}
	if strings.Contains(f.logs.String(), podToken) {
		t.Error("the log quotes the Pod's token")
	}
}

// TestServiceAccountTokensOff: without service account keys a Pod's token
// is an unknown bearer (401) on the confirmation too.
func TestServiceAccountTokensOff(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	f.acquire(tokenA, "payments", "exporter", "cluster-a", 30)
	podToken := satokentest.NewRSA(t, "a-1").Sign(t, satokentest.PodClaims(exporter, "fence-0", epoch))
	res := f.do(request{method: http.MethodGet, path: confirmPath("payments", "exporter", "cluster-a", 1), token: podToken})
	if res.code != http.StatusUnauthorized {
		t.Errorf("confirmation with a Pod's token and no keys: %d %s, want 401", res.code, res.body)
	}
}
