package postgres_test

import (
	"testing"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/postgres"
	"github.com/berthfleet/berth/leaseapi/store/storetest"
	"github.com/berthfleet/berth/test/pgtest"
)

func TestConformance(t *testing.T) {
	server := pgtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := postgres.Open(t.Context(), server.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestMigrationIsIdempotent(t *testing.T) {
	server := pgtest.Start(t)
	dsn := server.NewDatabase(t)
	for range 3 {
		s, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		if err := s.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
	}
}
