package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migration is one step of the schema, from version i to i+1.
type migration struct {
	sql string
	// additive: binaries that know only the earlier versions still work on
	// the schema it makes (it adds what they do not use and changes
	// nothing they do), so replicas of the previous release keep starting
	// during a rolling upgrade and after a rollback.
	additive bool
}

// migrations bring the schema from version 0 to len(migrations). Append,
// never edit.
var migrations = []migration{
	{sql: `CREATE TABLE leases (
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
	);`},
	// Version 2: a notification on the channel leaseChannel, with payload
	// "namespace/name", when a lease is created or its holder or token
	// changes (renewals stay quiet), for FollowLeases.
	{additive: true, sql: `CREATE FUNCTION berth_lease_changed() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_notify('berth_lease_changes', NEW.namespace || '/' || NEW.name);
		RETURN NULL;
	END $$;
	CREATE TRIGGER berth_lease_created AFTER INSERT ON leases
		FOR EACH ROW EXECUTE FUNCTION berth_lease_changed();
	CREATE TRIGGER berth_lease_holder_changed AFTER UPDATE ON leases
		FOR EACH ROW WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
		EXECUTE FUNCTION berth_lease_changed();`},
	// Version 3: the mark of a revoked term (store.Lease.Revoked).
	//
	// Additive: binaries of version 2 keep starting on it, because what
	// they do without knowing the column is still safe. They neither read
	// nor write it, so a term they update keeps the mark it had: one of
	// them may renew a revoked term for its holder, which only delays the
	// handover (the holder learns of the revocation from a newer replica,
	// or the term ends); none of them grants a term to another holder any
	// earlier than before, since the mark only ever withholds a grant. An
	// administrator's release served by an older replica frees the term
	// at once, as it did in that release. The trigger clears the mark
	// whenever the holder or the token changes, so that it never outlives
	// its term whichever replica writes: an older replica's release or new
	// term does not leave a stale mark that would make a newer replica
	// refuse the next holder's renewals.
	{additive: true, sql: `ALTER TABLE leases ADD COLUMN revoked boolean NOT NULL DEFAULT false;
	CREATE FUNCTION berth_lease_unrevoke() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		NEW.revoked := false;
		RETURN NEW;
	END $$;
	CREATE TRIGGER berth_lease_term_changed BEFORE UPDATE ON leases
		FOR EACH ROW WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
		EXECUTE FUNCTION berth_lease_unrevoke();`},
	// Version 4: moves and reservations (store.Lease.Moving, MoveTo,
	// Reserved), and lease_terms, the ended terms of every lease
	// (store.TermStore), each written in the transaction of the lease
	// write that ended it.
	//
	// Additive: binaries of version 3 keep starting on it, and what they do
	// without knowing the columns is still safe. A move also sets revoked,
	// so they treat a moving term as the revoked term it is: they renew it
	// for its holder and never grant it to anyone else. They never set a
	// reservation, and one of them granting a reserved lease to a cluster
	// the reservation holds back only makes the grant as it was before
	// moves existed: a reservation only ever withholds a grant from a free
	// lease, so ignoring one cannot overlap two terms. Triggers keep the
	// marks to their term whichever replica writes: the move mark is
	// cleared when the holder or token changes (as version 3's does for
	// revoked), and a reservation when the token changes (a new term used
	// or ignored it); the end of a term by a newer replica changes the
	// holder and sets the reservation in the same update, which the
	// triggers leave alone. A reservation's change (the sweep clearing one
	// that ran out) notifies leaseChannel like a change of holder, so that
	// every replica's long polls wake the clusters it held back. Terms that
	// a version 3 replica ends are missing from the history.
	{additive: true, sql: `ALTER TABLE leases
		ADD COLUMN moving boolean NOT NULL DEFAULT false,
		ADD COLUMN move_to text NOT NULL DEFAULT '',
		ADD COLUMN reserved_for text NOT NULL DEFAULT '',
		ADD COLUMN reserved_except text NOT NULL DEFAULT '',
		ADD COLUMN reserved_until timestamptz;
	CREATE TABLE lease_terms (
		namespace     text        NOT NULL,
		name          text        NOT NULL,
		fencing_token integer     NOT NULL,
		holder        text        NOT NULL,
		acquired_at   timestamptz,
		ended_at      timestamptz,
		ending        text        NOT NULL,
		PRIMARY KEY (namespace, name, fencing_token)
	);
	CREATE FUNCTION berth_lease_unmove() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		NEW.moving := false;
		NEW.move_to := '';
		RETURN NEW;
	END $$;
	CREATE TRIGGER berth_lease_move_ended BEFORE UPDATE ON leases
		FOR EACH ROW WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
		EXECUTE FUNCTION berth_lease_unmove();
	CREATE FUNCTION berth_lease_unreserve() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		NEW.reserved_for := '';
		NEW.reserved_except := '';
		NEW.reserved_until := NULL;
		RETURN NEW;
	END $$;
	CREATE TRIGGER berth_lease_reservation_used BEFORE UPDATE ON leases
		FOR EACH ROW WHEN (OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
		EXECUTE FUNCTION berth_lease_unreserve();
	CREATE TRIGGER berth_lease_reservation_changed AFTER UPDATE ON leases
		FOR EACH ROW WHEN (OLD.holder IS NOT DISTINCT FROM NEW.holder AND OLD.fencing_token IS NOT DISTINCT FROM NEW.fencing_token
			AND OLD.reserved_until IS DISTINCT FROM NEW.reserved_until)
		EXECUTE FUNCTION berth_lease_changed();`},
}

// minReader is the oldest schema version a binary may know and still work
// on a schema of version v: the last version that was not additive.
func minReader(v int) int {
	for ; v > 1 && migrations[v-1].additive; v-- {
	}
	return v
}

// leaseChannel is the notification channel of lease changes (migration 2).
const leaseChannel = "berth_lease_changes"

// migrationLock serialises migrations of replicas starting together.
const migrationLock = 0x6265727468 // "berth"

// schemaTable records the schema's version and the oldest version a binary
// may know to work on it (min_reader, added after version 1 shipped: empty
// means the version itself).
const schemaTable = `CREATE TABLE IF NOT EXISTS berth_schema (version integer NOT NULL);
	ALTER TABLE berth_schema ADD COLUMN IF NOT EXISTS min_reader integer`

// schemaVersion reads the schema's version and oldest reader (0, 0 before
// the first migration). It reads min_reader through the row's JSON so that
// the same query works on a table from before that column (then the
// version itself is the oldest reader).
func schemaVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (version, reader int, err error) {
	err = q.QueryRow(ctx, `SELECT coalesce(max(version), 0),
		coalesce(max(coalesce((to_jsonb(s)->>'min_reader')::integer, version)), 0) FROM berth_schema s`).Scan(&version, &reader)
	if err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	return version, reader, nil
}

// usable says whether this binary can work on a schema of version (with its
// oldest reader), and what to do if not.
func usable(version, reader int) error {
	switch {
	case version < len(migrations):
		return fmt.Errorf("schema version %d is older than this binary needs (%d): start berth-leaseapi once with --postgres-migrate", version, len(migrations))
	case reader > len(migrations):
		return fmt.Errorf("schema version %d is newer than this binary knows (%d) and needs at least version %d: upgrade berth-leaseapi", version, len(migrations), reader)
	}
	return nil
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
		return fmt.Errorf("lock for migration: %w", err)
	}
	if _, err := tx.Exec(ctx, schemaTable); err != nil {
		return fmt.Errorf("create schema version table: %w", err)
	}
	current, reader, err := schemaVersion(ctx, tx)
	if err != nil {
		return err
	}
	if current >= len(migrations) {
		// Up to date, or newer: a newer schema made only of additions
		// serves this binary as it is.
		return usable(current, reader)
	}
	for v := current; v < len(migrations); v++ {
		if _, err := tx.Exec(ctx, migrations[v].sql); err != nil {
			return fmt.Errorf("migrate schema to version %d: %w", v+1, err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM berth_schema`); err != nil {
		return fmt.Errorf("record schema version: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO berth_schema (version, min_reader) VALUES ($1, $2)`, len(migrations), minReader(len(migrations))); err != nil {
		return fmt.Errorf("record schema version: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}

// verify checks, changing nothing, that this binary can work on the schema.
func verify(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('berth_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return fmt.Errorf("the database holds no Berth schema (version %d needed): start berth-leaseapi once with --postgres-migrate", len(migrations))
	}
	current, reader, err := schemaVersion(ctx, pool)
	if err != nil {
		return err
	}
	return usable(current, reader)
}
