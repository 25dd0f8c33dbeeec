package sqlite_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// BenchmarkRenew measures durable renew writes from 500 concurrent holders,
// each writing its own lease, as the lease API does under load.
func BenchmarkRenew(b *testing.B) {
	s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "leases.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	const holders = 500
	leases := make([]store.Lease, holders)
	for i := range leases {
		if leases[i], err = s.PutLease(b.Context(), store.Lease{Namespace: "bench", Name: fmt.Sprintf("lease-%d", i), Holder: "h", FencingToken: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/holders + 1
	for i := range holders {
		wg.Go(func() {
			l := leases[i]
			for range per {
				l.ExpiresAt = time.Now().Add(30 * time.Second)
				var err error
				if l, err = s.PutLease(b.Context(), l); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(per*holders)/b.Elapsed().Seconds(), "writes/s")
}
