package postgres

import (
	"testing"

	"github.com/jackc/pgx/v5"

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
	if version != len(migrations) || reader != 1 || triggers != 2 {
		t.Errorf("after the upgrade: version %d, min_reader %d, %d triggers; want %d, 1, 2", version, reader, triggers, len(migrations))
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
