package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthfleet/berth/leaseapi"
)

// BenchmarkRenewBatch serves batched renewals of 1,000 leases each through
// the whole handler chain on a real SQLite store, without the network:
// the server's cost per renewal (ns/op is per batch).
func BenchmarkRenewBatch(b *testing.B) {
	const size = 1000
	h := newFuzzHarness(b)
	leases := make([]leaseapi.BatchRenewal, size)
	for i := range leases {
		name := fmt.Sprintf("lease-%05d", i)
		req := httptest.NewRequest(http.MethodPost, leasePath("bench", name, "acquire"), strings.NewReader(`{"holder":"cluster-a","ttlSeconds":3600}`))
		req.Header.Set("Authorization", "Bearer "+tokenA)
		rec := httptest.NewRecorder()
		h.handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("acquire %s: %d %s", name, rec.Code, rec.Body)
		}
		leases[i] = renewal("bench", name, 1, 3600)
	}
	body := batchBodyB(b, "cluster-a", leases)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodPost, renewalsPath, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokenA)
		rec := httptest.NewRecorder()
		h.handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("batch: %d %s", rec.Code, rec.Body)
		}
	}
	b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "renewals/s")
}
