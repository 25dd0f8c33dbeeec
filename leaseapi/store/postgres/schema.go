package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations bring the schema from version i to i+1. Append, never edit.
var migrations = []string{
	`CREATE TABLE leases (
		namespace     text        NOT NULL,
		name          text        NOT NULL,
		holder        text        NOT NULL,
		fencing_token integer     NOT NULL,
		ttl_micros    bigint      NOT NULL,
		acquired_at   timestamptz,
		renewed_at    timestamptz,
		expires_at    timestamptz,
		version       bigint      NOT NULL,
		PRIMARY KEY (namespace, name)
	);
	CREATE TABLE clusters (
		id            text        PRIMARY KEY,
		fingerprint   text        NOT NULL,
		agent_version text        NOT NULL,
		labels        jsonb       NOT NULL,
		cordoned      boolean     NOT NULL,
		registered_at timestamptz,
		last_seen     timestamptz,
		version       bigint      NOT NULL
	);`,
}

// migrationLock serialises migrations of replicas starting together.
const migrationLock = 0x6265727468 // "berth"

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
		return fmt.Errorf("lock for migration: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS berth_schema (version integer NOT NULL)`); err != nil {
		return fmt.Errorf("create schema version table: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM berth_schema`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary knows (%d): upgrade berth-leaseapi", current, len(migrations))
	}
	for v := current; v < len(migrations); v++ {
		if _, err := tx.Exec(ctx, migrations[v]); err != nil {
			return fmt.Errorf("migrate schema to version %d: %w", v+1, err)
		}
	}
	if current < len(migrations) {
		if _, err := tx.Exec(ctx, `DELETE FROM berth_schema`); err != nil {
			return fmt.Errorf("record schema version: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO berth_schema VALUES ($1)`, len(migrations)); err != nil {
			return fmt.Errorf("record schema version: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}
