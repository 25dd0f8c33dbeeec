package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations brings a database from schema version i to i+1; the version is
// kept in PRAGMA user_version. Append, never edit.
var migrations = []string{
	`CREATE TABLE leases (
		namespace     TEXT    NOT NULL,
		name          TEXT    NOT NULL,
		holder        TEXT    NOT NULL,
		fencing_token INTEGER NOT NULL,
		ttl_micros    INTEGER NOT NULL,
		acquired_at   INTEGER NOT NULL,
		renewed_at    INTEGER NOT NULL,
		expires_at    INTEGER NOT NULL,
		version       INTEGER NOT NULL,
		PRIMARY KEY (namespace, name)
	) WITHOUT ROWID;
	CREATE TABLE clusters (
		id            TEXT    NOT NULL PRIMARY KEY,
		fingerprint   TEXT    NOT NULL,
		agent_version TEXT    NOT NULL,
		labels        TEXT    NOT NULL,
		cordoned      INTEGER NOT NULL,
		registered_at INTEGER NOT NULL,
		last_seen     INTEGER NOT NULL,
		version       INTEGER NOT NULL
	) WITHOUT ROWID;`,
	// Version 2: a term an administrator revoked (store.Lease.Revoked).
	`ALTER TABLE leases ADD COLUMN revoked INTEGER NOT NULL DEFAULT 0;`,
	// Version 3: moves and reservations (store.Lease.Moving, MoveTo,
	// Reserved) and the ended terms of every lease (store.TermStore), each
	// written in the transaction of the lease write that ended it. One
	// process owns the file (its lock), so no older binary writes beside a
	// newer one; an older binary refuses a file of a newer version.
	`ALTER TABLE leases ADD COLUMN moving INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE leases ADD COLUMN move_to TEXT NOT NULL DEFAULT '';
	ALTER TABLE leases ADD COLUMN reserved_for TEXT NOT NULL DEFAULT '';
	ALTER TABLE leases ADD COLUMN reserved_except TEXT NOT NULL DEFAULT '';
	ALTER TABLE leases ADD COLUMN reserved_until INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE lease_terms (
		namespace     TEXT    NOT NULL,
		name          TEXT    NOT NULL,
		fencing_token INTEGER NOT NULL,
		holder        TEXT    NOT NULL,
		acquired_at   INTEGER NOT NULL,
		ended_at      INTEGER NOT NULL,
		ending        TEXT    NOT NULL,
		PRIMARY KEY (namespace, name, fencing_token)
	) WITHOUT ROWID;`,
}

// migrate applies the migrations the database has not seen yet, each in its
// own transaction together with the version bump.
func migrate(ctx context.Context, db *sql.DB) error {
	var current int
	if err := db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary knows (%d): upgrade berth-leaseapi", current, len(migrations))
	}
	for v := current; v < len(migrations); v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin migration %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("migrate schema to version %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("record schema version %d: %w", v+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit migration %d: %w", v+1, err)
		}
	}
	return nil
}
