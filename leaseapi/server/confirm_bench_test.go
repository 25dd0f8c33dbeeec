package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/satoken"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// BenchmarkConfirm serves confirmations of one held lease through the whole
// handler chain on a real SQLite store, without the network, from every
// core at once: what a fenced container's confirmation costs the lease API
// with each credential. A kube-apiserver signs service account tokens with
// RS256 unless told otherwise.
func BenchmarkConfirm(b *testing.B) {
	dir := b.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "berth-bench-"); err == nil {
		dir = shm
		b.Cleanup(func() { _ = os.RemoveAll(shm) })
	}
	backend, err := sqlite.Open(context.Background(), filepath.Join(dir, "leases.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = backend.Close() })

	rsa, ecdsa := satokentest.NewRSA(b, "rsa-1"), satokentest.NewECDSA(b, "ecdsa-1")
	keysDir := b.TempDir()
	satokentest.WriteJWKS(b, keysDir, "cluster-a", rsa, ecdsa)
	keys, err := satoken.LoadDir(keysDir)
	if err != nil {
		b.Fatal(err)
	}
	tokens := writeTokenFile(b, filepath.Join(b.TempDir(), "tokens"), defaultTokens)
	h := New(Config{
		Service: lease.NewService(backend, lease.Options{}),
		Store:   backend,
		Auth:    NewAuthenticator(tokens, false, []string{"admin"}).AcceptServiceAccounts(satoken.NewVerifier(keys, clock.RealClock{})),
		Log:     logr.Discard(),
	}).Handler()

	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	acquire := httptest.NewRequest(http.MethodPost, leasePath("payments", "exporter", "acquire"), strings.NewReader(`{"holder":"cluster-a","ttlSeconds":3600}`))
	acquire.Header.Set("Authorization", "Bearer "+tokenA)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, acquire)
	if rec.Code != http.StatusOK {
		b.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	path := confirmPath("payments", "exporter", "cluster-a", 1)
	claims := satokentest.PodClaims(exporter, "fence-0", time.Now())

	for _, bc := range []struct{ name, bearer string }{
		{"token file", tokenA},
		{"service account RS256", rsa.Sign(b, claims)},
		{"service account ES256", ecdsa.Sign(b, claims)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodGet, path, nil)
					req.Header.Set("Authorization", "Bearer "+bc.bearer)
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"confirmed":true`) {
						b.Errorf("confirmation: %d %s", rec.Code, rec.Body)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "confirmations/s")
		})
	}
}
