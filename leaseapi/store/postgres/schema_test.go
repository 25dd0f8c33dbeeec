package postgres

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthfleet/berth/leaseapi/store"

	"github.com/berthfleet/berth/test/pgtest"
)

// TestUpgradeFromVersion1 opens a database as the first release left it (the
// schema of migration 1, a version table without min_reader) and finds it
// migrated: the version table extended, the triggers in place.
func TestUpgradeFromVersion1(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(t.Context()) }()
	for _, sql := range []string{migrations[0].sql, `CREATE TABLE berth_schema (version integer NOT NULL)`, `INSERT INTO berth_schema VALUES (1)`} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := verifyOnly(t, dsn); err == nil {
		t.Errorf("verify-only on a version 1 schema: no error")
	}
	s, err := Open(t.Context(), dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	var version, reader, triggers int
	if err := conn.QueryRow(t.Context(), `SELECT version, min_reader FROM berth_schema`).Scan(&version, &reader); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'berth_lease_%'`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if version != len(migrations) || reader != 1 || triggers != 6 {
		t.Errorf("after the upgrade: version %d, min_reader %d, %d triggers; want %d, 1, 6", version, reader, triggers, len(migrations))
	}
	if err := verifyOnly(t, dsn); err != nil {
		t.Errorf("verify-only after the upgrade: %v", err)
	}
}

func verifyOnly(t *testing.T, dsn string) error {
	s, err := Open(t.Context(), dsn, Options{VerifyOnly: true})
	if err == nil {
		_ = s.Close()
	}
	return err
}

// TestOlderReplicaClearsTheMark: a binary of schema version 2 writes leases
// without the revoked column. Its renewal leaves a revoked term's mark as it
// is; its release or new term clears it (migration 3's trigger), so that no
// later term inherits it.
func TestOlderReplicaClearsTheMark(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	s, err := Open(t.Context(), dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.PutLease(t.Context(), store.Lease{Namespace: "ns", Name: "a", Holder: "east", FencingToken: 1, Revoked: true}); err != nil {
		t.Fatal(err)
	}
	// The UPDATE of a version 2 binary, which does not know the column.
	older := func(holder string, token int32) {
		t.Helper()
		if _, err := s.pool.Exec(t.Context(), `UPDATE leases SET holder = $1, fencing_token = $2, version = version + 1
			WHERE namespace = 'ns' AND name = 'a'`, holder, token); err != nil {
			t.Fatal(err)
		}
	}
	revoked := func() bool {
		t.Helper()
		got, err := s.GetLease(t.Context(), "ns", "a")
		if err != nil {
			t.Fatal(err)
		}
		return got.Revoked
	}
	older("east", 1) // a renewal
	if !revoked() {
		t.Fatalf("an older replica's renewal cleared the mark")
	}
	older("", 1) // a release
	if revoked() {
		t.Fatalf("the mark outlived an older replica's release")
	}
	if _, err := s.pool.Exec(t.Context(), `UPDATE leases SET revoked = true`); err != nil {
		t.Fatal(err)
	}
	older("west", 2) // a new term on a record the sweep had not freed
	if revoked() {
		t.Fatalf("the mark outlived an older replica's new term")
	}
}

// TestOlderReplicaClearsMoveAndReservation: a binary of schema version 3
// writes leases without the move and reservation columns. Its renewal keeps
// a moving term's mark; its release clears it (migration 4's trigger); its
// new term clears a reservation it did not know of; and the newer binary's
// end of a moved term keeps the reservation it writes.
func TestOlderReplicaClearsMoveAndReservation(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	s, err := Open(t.Context(), dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	l, err := s.PutLease(t.Context(), store.Lease{Namespace: "ns", Name: "a", Holder: "east", FencingToken: 1, Revoked: true, Moving: true, MoveTo: "west"})
	if err != nil {
		t.Fatal(err)
	}
	older := func(holder string, token int32) {
		t.Helper()
		if _, err := s.pool.Exec(t.Context(), `UPDATE leases SET holder = $1, fencing_token = $2, revoked = false, version = version + 1
			WHERE namespace = 'ns' AND name = 'a'`, holder, token); err != nil {
			t.Fatal(err)
		}
	}
	get := func() store.Lease {
		t.Helper()
		got, err := s.GetLease(t.Context(), "ns", "a")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if _, err := s.pool.Exec(t.Context(), `UPDATE leases SET version = version + 1`); err != nil { // an older renewal
		t.Fatal(err)
	}
	if got := get(); !got.Moving || got.MoveTo != "west" {
		t.Fatalf("an older replica's renewal cleared the move: %+v", got)
	}
	older("", 1) // a release
	if got := get(); got.Moving || got.MoveTo != "" {
		t.Fatalf("the move outlived an older replica's release: %+v", got)
	}

	// The newer binary ends a moved term: the reservation it writes stays.
	l = get()
	l.Holder, l.Revoked, l.Moving, l.MoveTo = "east", true, true, "west"
	if l, err = s.PutLease(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	l.Holder, l.Revoked, l.Moving, l.MoveTo = "", false, false, ""
	l.Reserved = store.Reservation{For: "west", Until: l.ExpiresAt.Add(time.Hour).UTC().Truncate(time.Microsecond)}
	if l, err = s.PutLease(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	if got := get(); got.Reserved != l.Reserved {
		t.Fatalf("a newer replica's end of a moved term: reservation %+v, want %+v", got.Reserved, l.Reserved)
	}
	older("south", 2) // a new term, granted against the reservation it did not know
	if got := get(); !got.Reserved.IsZero() {
		t.Fatalf("the reservation outlived an older replica's new term: %+v", got)
	}
}
