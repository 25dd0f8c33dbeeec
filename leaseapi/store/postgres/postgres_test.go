package postgres_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/postgres"
	"github.com/berthfleet/berth/leaseapi/store/storetest"
	"github.com/berthfleet/berth/test/pgtest"
)

func TestConformance(t *testing.T) {
	server := pgtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := postgres.Open(t.Context(), server.NewDatabase(t), postgres.Options{})
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
		s, err := postgres.Open(t.Context(), dsn, postgres.Options{})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		if err := s.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
	}
}

// TestVerifyOnly: without migrations the server starts only on exactly the
// schema it needs, and says what to do otherwise.
func TestVerifyOnly(t *testing.T) {
	server := pgtest.Start(t)
	dsn := server.NewDatabase(t)
	verifyOnly := func() error {
		s, err := postgres.Open(t.Context(), dsn, postgres.Options{VerifyOnly: true})
		if err == nil {
			_ = s.Close()
		}
		return err
	}
	if err := verifyOnly(); err == nil || !strings.Contains(err.Error(), "no Berth schema") {
		t.Errorf("verify-only on an empty database: %v, want a refusal naming the missing schema", err)
	}
	s, err := postgres.Open(t.Context(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := verifyOnly(); err != nil {
		t.Errorf("verify-only on a migrated database: %v", err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(t.Context()) }()
	for version, want := range map[int]string{1: "older than this binary needs", 99: "newer than this binary knows"} {
		if _, err := conn.Exec(t.Context(), `UPDATE berth_schema SET version = $1, min_reader = $1`, version); err != nil {
			t.Fatal(err)
		}
		if err := verifyOnly(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("verify-only on schema version %d: %v, want %q", version, err, want)
		}
	}
}

// TestNewerAdditiveSchema: a schema that a newer release extended with
// additions only still serves this binary (a rolling upgrade, a rollback);
// one that needs a newer reader is refused, migrating or not.
func TestNewerAdditiveSchema(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	s, err := postgres.Open(t.Context(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(t.Context()) }()
	var current int
	if err := conn.QueryRow(t.Context(), `SELECT version FROM berth_schema`).Scan(&current); err != nil {
		t.Fatal(err)
	}
	newer := current + 2
	for _, tc := range []struct {
		version, minReader int
		ok                 bool
	}{{newer, current, true}, {newer, 1, true}, {newer, current + 1, false}} {
		if _, err := conn.Exec(t.Context(), `UPDATE berth_schema SET version = $1, min_reader = $2`, tc.version, tc.minReader); err != nil {
			t.Fatal(err)
		}
		for _, verifyOnly := range []bool{false, true} {
			s, err := postgres.Open(t.Context(), dsn, postgres.Options{VerifyOnly: verifyOnly})
			if err == nil {
				_ = s.Close()
			}
			if (err == nil) != tc.ok {
				t.Errorf("schema version %d readable from %d, verify-only %v: %v; want usable %v", tc.version, tc.minReader, verifyOnly, err, tc.ok)
			}
		}
	}
	var version int
	if err := conn.QueryRow(t.Context(), `SELECT version FROM berth_schema`).Scan(&version); err != nil || version != newer {
		t.Errorf("schema version after opening a newer schema: %d, %v; want it left at %d", version, err, newer)
	}
}
