package postgres_test

import (
	"testing"

	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/postgres"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
	"github.com/berthfleet/berth/leaseapi/store/storetest"
	"github.com/berthfleet/berth/test/pgtest"
)

// TestReplicaClocks: two replicas on one database, one with its clock 20 s
// ahead, agree on when a term ends: both judge by the database's clock.
func TestReplicaClocks(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	storetest.RunReplicaClocks(t, func(t *testing.T, local clock.Clock) store.Store {
		s, err := postgres.Open(t.Context(), dsn, postgres.Options{Clock: refclock.Options{Clock: local}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestClockReadsDatabase: the store's clock is the database's, known to
// within about a round trip, and readiness checks it.
func TestClockReadsDatabase(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	s, err := postgres.Open(t.Context(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	r, err := s.Now(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Uncertainty(); u <= 0 || u > postgres.ClockMaxUncertainty {
		t.Errorf("uncertainty %v, want positive and at most %v", u, postgres.ClockMaxUncertainty)
	}
	if _, _, ok := s.Clock().Estimate(); !ok {
		t.Error("no estimate after a reading")
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("ping: %v", err)
	}
}
