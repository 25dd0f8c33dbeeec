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
	// Version 2: a notification on the channel leaseChannel, with payload
	// "namespace/name", when a lease is created or its holder or token
	// changes (renewals stay quiet), for FollowLeases.
	`CREATE FUNCTION berth_lease_changed() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_notify('berth_lease_changes', NEW.namespace || '/' || NEW.name);
		RETURN NULL;
	END $$;
	CREATE TRIGGER berth_lease_created AFTER INSERT ON leases
		FOR EACH ROW EXECUTE FUNCTION berth_lease_changed();
	CREATE TRIGGER berth_lease_holder_changed AFTER UPDATE ON leases
		FOR EACH ROW WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
		EXECUTE FUNCTION berth_lease_changed();`,
}

// leaseChannel is the notification channel of lease changes (migration 2).
const leaseChannel = "berth_lease_changes"

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

// verify checks that the schema is the version this binary needs.
func verify(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('berth_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return fmt.Errorf("the database holds no Berth schema (version %d needed): start berth-leaseapi once with --postgres-migrate", len(migrations))
	}
	var current int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM berth_schema`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	switch {
	case current < len(migrations):
		return fmt.Errorf("schema version %d is older than this binary needs (%d): start berth-leaseapi once with --postgres-migrate", current, len(migrations))
	case current > len(migrations):
		return fmt.Errorf("schema version %d is newer than this binary knows (%d): upgrade berth-leaseapi", current, len(migrations))
	}
	return nil
}
