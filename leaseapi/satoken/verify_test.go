package satoken_test

import (
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/satoken"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newClaims(ns, aud string) satokentest.Claims {
	c := satokentest.PodClaims(leaseapi.Key{Namespace: ns, Name: "x"}, "fence-0", epoch.Add(-time.Minute))
	c.Audience = jwt.Audience{aud}
	return c
}

// handMade signs header.payload with HMAC-SHA256 or nothing ("none"):
// what go-jose will not make, and must not accept.
func handMade(t testing.TB, alg, kid string, c satokentest.Claims, secret []byte) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": alg, "kid": kid, "typ": "JWT"})
	p, _ := json.Marshal(c)
	enc := base64.RawURLEncoding.EncodeToString
	signing := enc(h) + "." + enc(p)
	if alg == "none" {
		return signing + "."
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signing))
	return signing + "." + enc(mac.Sum(nil))
}

func writeKeys(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestVerify(t *testing.T) {
	east, eastEC, west := satokentest.NewRSA(t, "east-rsa"), satokentest.NewECDSA(t, "east-ec"), satokentest.NewRSA(t, "west-rsa")
	// westSameKid signs with west's key under the kid of east's key.
	westSameKid := west
	westSameKid.ID = "east-rsa"
	dir := t.TempDir()
	writeKeys(t, dir, map[string][]byte{"east.json": satokentest.JWKS(t, east, eastEC), "west.json": satokentest.JWKS(t, west)})
	keys, err := satoken.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := satoken.NewVerifier(keys, testingclock.NewFakePassiveClock(epoch))

	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	aud := leaseapi.ConfirmAudience(key)
	good := newClaims("payments", aud)
	with := func(f func(*satokentest.Claims)) satokentest.Claims {
		c := newClaims("payments", aud)
		f(&c)
		return c
	}
	rsaPub := east.Public().Key.(*rsa.PublicKey)
	pubDER, err := x509.MarshalPKIXPublicKey(rsaPub)
	if err != nil {
		t.Fatal(err)
	}
	wantID := satoken.Identity{Cluster: "east", Namespace: "payments", ServiceAccount: "worker", PodName: "fence-0", PodUID: "fence-0-uid", Lease: key}

	cases := map[string]struct {
		token   string
		cluster string
		wantErr error
		// wantMsg is part of the error's message.
		wantMsg string
	}{
		"good RSA token":   {token: east.Sign(t, good), cluster: "east"},
		"good ECDSA token": {token: eastEC.Sign(t, good), cluster: "east"},
		"one of several audiences": {token: east.Sign(t, with(func(c *satokentest.Claims) {
			c.Audience = jwt.Audience{"https://kubernetes.default.svc", aud}
		})), cluster: "east"},
		"nbf and iat within the leeway": {token: east.Sign(t, with(func(c *satokentest.Claims) {
			c.NotBefore, c.IssuedAt = jwt.NewNumericDate(epoch.Add(30*time.Second)), jwt.NewNumericDate(epoch.Add(30*time.Second))
		})), cluster: "east"},
		"expired": {token: east.Sign(t, with(func(c *satokentest.Claims) { c.Expiry = jwt.NewNumericDate(epoch) })), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "expired"},
		"no expiry": {token: east.Sign(t, with(func(c *satokentest.Claims) { c.Expiry = nil })), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "no expiry"},
		"not valid yet": {token: east.Sign(t, with(func(c *satokentest.Claims) { c.NotBefore = jwt.NewNumericDate(epoch.Add(2 * time.Minute)) })), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not valid before"},
		"issued in the future": {token: east.Sign(t, with(func(c *satokentest.Claims) {
			c.NotBefore, c.IssuedAt = nil, jwt.NewNumericDate(epoch.Add(2*time.Minute))
		})), cluster: "east", wantErr: satoken.ErrUnverified, wantMsg: "issued in the future"},
		"another lease's audience": {token: east.Sign(t, with(func(c *satokentest.Claims) {
			c.Audience = jwt.Audience{leaseapi.ConfirmAudience(leaseapi.Key{Namespace: "payments", Name: "other"})}
		})), cluster: "east", wantErr: satoken.ErrNotAllowed, wantMsg: "audience"},
		"the Kubernetes API's audience": {token: east.Sign(t, with(func(c *satokentest.Claims) {
			c.Audience = jwt.Audience{"https://kubernetes.default.svc"}
		})), cluster: "east", wantErr: satoken.ErrNotAllowed, wantMsg: "audience"},
		"another namespace": {token: east.Sign(t, with(func(c *satokentest.Claims) { c.Kubernetes["namespace"] = "billing" })), cluster: "east",
			wantErr: satoken.ErrNotAllowed, wantMsg: `namespace "billing"`},
		"no pod claim": {token: east.Sign(t, with(func(c *satokentest.Claims) { delete(c.Kubernetes, "pod") })), cluster: "east",
			wantErr: satoken.ErrNotAllowed, wantMsg: "not bound to a Pod"},
		"no kubernetes.io claim": {token: east.Sign(t, with(func(c *satokentest.Claims) { c.Kubernetes = nil })), cluster: "east",
			wantErr: satoken.ErrNotAllowed, wantMsg: "not a Kubernetes service account token"},
		"signed by another cluster's key": {token: west.Sign(t, good), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not signed by"},
		"another cluster's key under a kid of this cluster": {token: westSameKid.Sign(t, good), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not signed by"},
		"verified against the holder's cluster, not the signer's": {token: east.Sign(t, good), cluster: "west",
			wantErr: satoken.ErrUnverified, wantMsg: "not signed by"},
		"a cluster without keys": {token: east.Sign(t, good), cluster: "north",
			wantErr: satoken.ErrUnverified, wantMsg: `no service account keys for cluster "north"`},
		"unknown kid": {token: satokentest.Key{ID: "rotated-away", Algorithm: jose.RS256, Private: east.Private}.Sign(t, good), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not signed by"},
		"no kid": {token: satokentest.Key{Algorithm: jose.RS256, Private: east.Private}.Sign(t, good), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "names no signing key"},
		"PS256 with a key published for RS256": {token: satokentest.Key{ID: "east-rsa", Algorithm: jose.PS256, Private: east.Private}.Sign(t, good), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not signed by"},
		"alg none": {token: handMade(t, "none", "east-rsa", good, nil), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not a JWT signed with"},
		"HS256 with the public key as secret": {token: handMade(t, "HS256", "east-rsa", good, pubDER), cluster: "east",
			wantErr: satoken.ErrUnverified, wantMsg: "not a JWT signed with"},
		"tampered payload": {token: func() string {
			parts := strings.Split(east.Sign(t, good), ".")
			other := strings.Split(east.Sign(t, with(func(c *satokentest.Claims) { c.Kubernetes["namespace"] = "billing" })), ".")
			return parts[0] + "." + other[1] + "." + parts[2]
		}(), cluster: "east", wantErr: satoken.ErrUnverified, wantMsg: "not signed by"},
		"malformed":       {token: "not.a.jwt", cluster: "east", wantErr: satoken.ErrUnverified, wantMsg: "not a JWT"},
		"an opaque token": {token: "token-of-cluster-a-5f1e", cluster: "east", wantErr: satoken.ErrUnverified, wantMsg: "not a JWT"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			id, err := v.Verify(tc.token, tc.cluster, key)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				if diff := cmp.Diff(wantID, id); diff != "" {
					t.Errorf("identity (-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("verify: %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
			for _, part := range strings.Split(tc.token, ".") {
				if len(part) > 8 && strings.Contains(err.Error(), part) {
					t.Errorf("error %q quotes the token", err)
				}
			}
		})
	}
	if got, want := wantID.Subject(), "system:serviceaccount:payments:worker@east"; got != want {
		t.Errorf("subject %q, want %q", got, want)
	}
}

func TestLooksLikeJWT(t *testing.T) {
	cases := map[string]bool{
		"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln": true,
		"token-of-cluster-a-5f1e":                   false,
		"a.b":                                       false,
		"a..c":                                      false,
		"a.b.c.d":                                   false,
		"a.b+.c":                                    false,
		"":                                          false,
	}
	for s, want := range cases {
		if got := satoken.LooksLikeJWT(s); got != want {
			t.Errorf("LooksLikeJWT(%q) = %t, want %t", s, got, want)
		}
	}
}
