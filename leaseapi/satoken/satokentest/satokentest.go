// Package satokentest makes what a cluster's kube-apiserver makes for
// service account tokens, for tests of the lease API: signing keys, their
// JWKS as /openid/v1/jwks serves it, and Pod-bound tokens signed with them.
package satokentest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/berthfleet/berth/leaseapi"
)

// Key is a cluster's service account signing key.
type Key struct {
	ID        string
	Algorithm jose.SignatureAlgorithm
	Private   crypto.Signer
}

// NewRSA makes a 2048-bit RSA key that signs RS256.
func NewRSA(t testing.TB, kid string) Key {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return Key{ID: kid, Algorithm: jose.RS256, Private: k}
}

// NewECDSA makes a P-256 key that signs ES256.
func NewECDSA(t testing.TB, kid string) Key {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Key{ID: kid, Algorithm: jose.ES256, Private: k}
}

// Public is the key as a kube-apiserver publishes it.
func (k Key) Public() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.Private.Public(), KeyID: k.ID, Algorithm: string(k.Algorithm), Use: "sig"}
}

// JWKS is the body of /openid/v1/jwks of a kube-apiserver with keys.
func JWKS(t testing.TB, keys ...Key) []byte {
	t.Helper()
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, k.Public())
	}
	data, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// WriteJWKS writes the JWKS of keys as cluster's file in dir, the layout of
// berth-leaseapi's --service-account-keys-dir.
func WriteJWKS(t testing.TB, dir, cluster string, keys ...Key) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, cluster+".json"), JWKS(t, keys...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Claims are the claims of a service account token.
type Claims struct {
	jwt.Claims
	// Kubernetes is the private claim "kubernetes.io".
	Kubernetes map[string]any `json:"kubernetes.io,omitempty"`
}

// PodClaims are the claims of the token the kubelet projects into Pod pod
// of service account "worker" in lease's namespace, with the audience of
// lease's confirmation, issued at now and valid for ten minutes.
func PodClaims(lease leaseapi.Key, pod string, now time.Time) Claims {
	ns := lease.Namespace
	return Claims{
		Claims: jwt.Claims{
			Issuer: "https://kubernetes.default.svc.cluster.local", Subject: "system:serviceaccount:" + ns + ":worker",
			Audience: jwt.Audience{leaseapi.ConfirmAudience(lease)}, IssuedAt: jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(10 * time.Minute)),
		},
		Kubernetes: map[string]any{
			"namespace":      ns,
			"pod":            map[string]string{"name": pod, "uid": pod + "-uid"},
			"serviceaccount": map[string]string{"name": "worker", "uid": "worker-uid"},
			"node":           map[string]string{"name": "node-1", "uid": "node-1-uid"},
		},
	}
}

// Sign signs c with k, as a kube-apiserver does (kid in the header).
func (k Key) Sign(t testing.TB, c Claims) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Algorithm, Key: k.Private},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), k.ID))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jwt.Signed(sig).Claims(c).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
