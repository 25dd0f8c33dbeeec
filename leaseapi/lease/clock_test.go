package lease_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// fixedClock is a store clock that reads what the test sets.
type fixedClock struct {
	reading store.Reading
	err     error
}

func (c *fixedClock) Now(context.Context) (store.Reading, error) { return c.reading, c.err }

func openSQLite(t *testing.T) store.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "leases.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestStoreClockBounds: with a store clock known only within bounds, a
// term is granted from the earliest bound and lasts its TTL past the latest
// one, and every replica judges it by the earliest bound of its own
// reading, so no replica frees it before the TTL has passed on the store's
// clock; the server's own clock plays no part.
func TestStoreClockBounds(t *testing.T) {
	const ttl = 10 * time.Second
	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	at := func(earliest, latest time.Duration) store.Reading {
		return store.Reading{Earliest: t0.Add(earliest), Latest: t0.Add(latest)}
	}
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	cases := map[string]struct {
		// judged is the other replica's reading when another holder tries.
		judged      store.Reading
		wantOutcome lease.Outcome
	}{
		"latest bound past the expiry, earliest not":   {judged: at(11*time.Second, 13*time.Second), wantOutcome: lease.OutcomeHeldByOther},
		"earliest bound a microsecond before expiry":   {judged: at(12*time.Second-time.Microsecond, 12*time.Second), wantOutcome: lease.OutcomeHeldByOther},
		"earliest bound at the expiry":                 {judged: at(12*time.Second, 12*time.Second+time.Millisecond), wantOutcome: lease.OutcomeAcquired},
		"exact reading a TTL after the latest grant":   {judged: at(12*time.Second, 12*time.Second), wantOutcome: lease.OutcomeAcquired},
		"exact reading a TTL after the earliest grant": {judged: at(10*time.Second, 10*time.Second), wantOutcome: lease.OutcomeHeldByOther},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st := openSQLite(t)
			// The replicas' own clocks are far apart; they must not matter.
			granting := lease.NewService(st, lease.Options{
				Clock:      testingclock.NewFakeClock(t0.Add(time.Hour)),
				StoreClock: &fixedClock{reading: at(0, 2*time.Second)},
			})
			judging := lease.NewService(st, lease.Options{
				Clock:      testingclock.NewFakeClock(t0.Add(-time.Hour)),
				StoreClock: &fixedClock{reading: tc.judged},
			})
			d, err := granting.Acquire(t.Context(), key, "cluster-a", ttl)
			if err != nil || d.Outcome != lease.OutcomeAcquired {
				t.Fatalf("acquire by cluster-a: %v, %v", d.Outcome, err)
			}
			if got, want := d.Next.AcquiredAt, t0; !got.Equal(want) {
				t.Errorf("acquiredAt %s, want the earliest bound %s", got, want)
			}
			if got, want := d.Next.ExpiresAt, t0.Add(2*time.Second+ttl); !got.Equal(want) {
				t.Errorf("expiresAt %s, want a TTL past the latest bound, %s", got, want)
			}
			d, err = judging.Acquire(t.Context(), key, "cluster-b", ttl)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != tc.wantOutcome {
				t.Errorf("acquire by cluster-b at [%s, %s]: %s, want %s", tc.judged.Earliest, tc.judged.Latest, d.Outcome, tc.wantOutcome)
			}
		})
	}
}

// TestStoreClockRenewLengthens: a renewal too lasts its TTL past the latest
// bound.
func TestStoreClockRenewLengthens(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	clk := &fixedClock{reading: store.Reading{Earliest: t0, Latest: t0.Add(time.Second)}}
	svc := lease.NewService(openSQLite(t), lease.Options{StoreClock: clk})
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	d, err := svc.Acquire(t.Context(), key, "cluster-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clk.reading = store.Reading{Earliest: t0.Add(5 * time.Second), Latest: t0.Add(5*time.Second + 300*time.Millisecond)}
	d, err = svc.Renew(t.Context(), key, "cluster-a", d.Next.FencingToken, 10*time.Second)
	if err != nil || d.Outcome != lease.OutcomeRenewed {
		t.Fatalf("renew: %v, %v", d.Outcome, err)
	}
	if got, want := d.Next.ExpiresAt, t0.Add(15*time.Second+300*time.Millisecond); !got.Equal(want) {
		t.Errorf("expiresAt after renewal %s, want %s", got, want)
	}
}

// TestStoreClockFailureRefuses: without a reading of the store's clock the
// service judges nothing and writes nothing.
func TestStoreClockFailureRefuses(t *testing.T) {
	st := openSQLite(t)
	broken := errors.New("no usable sample of the store's clock")
	svc := lease.NewService(st, lease.Options{StoreClock: &fixedClock{err: broken}})
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	ctx := t.Context()
	if _, err := svc.Acquire(ctx, key, "cluster-a", 10*time.Second); !errors.Is(err, broken) {
		t.Errorf("acquire: %v, want the clock's error", err)
	}
	if _, err := svc.Renew(ctx, key, "cluster-a", 1, 10*time.Second); !errors.Is(err, broken) {
		t.Errorf("renew: %v, want the clock's error", err)
	}
	if _, err := svc.Release(ctx, key, "cluster-a", 1); !errors.Is(err, broken) {
		t.Errorf("release: %v, want the clock's error", err)
	}
	if _, err := svc.Sweep(ctx); err != nil {
		t.Errorf("sweep of an empty store: %v", err)
	}
	if _, err := svc.RegisterCluster(ctx, "cluster-a", leaseapi.ClusterRegistration{Fingerprint: "f"}); !errors.Is(err, broken) {
		t.Errorf("register: %v, want the clock's error", err)
	}
	if _, err := st.GetLease(ctx, key.Namespace, key.Name); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the store holds a record after every operation failed: %v", err)
	}
}
