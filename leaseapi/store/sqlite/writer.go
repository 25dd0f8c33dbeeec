package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berthfleet/berth/leaseapi/store"
)

// commitTimeout bounds one group commit.
const commitTimeout = 30 * time.Second

// writer is the only goroutine that writes. Each turn it takes every write
// queued so far (up to maxBatch) and commits them together.
func (s *Store) writer() {
	defer close(s.stopped)
	batch := make([]*write, 0, maxBatch)
	for w := range s.writes {
		batch = append(batch[:0], w)
	drain:
		for len(batch) < maxBatch {
			select {
			case w, ok := <-s.writes:
				if !ok {
					break drain
				}
				batch = append(batch, w)
			default:
				break drain
			}
		}
		s.commit(batch)
	}
}

// commit checks each write's version against the committed state plus the
// writes accepted before it in the batch, writes the accepted ones in one
// transaction, and publishes them only once that transaction is durable.
func (s *Store) commit(batch []*write) {
	leases := map[string]store.Lease{}
	clusters := map[string]store.Cluster{}
	accepted := make([]*write, 0, len(batch))
	var rows pending

	s.mu.RLock()
	for _, w := range batch {
		var err error
		switch {
		case w.lease != nil:
			if err = s.accept(w.lease, leases); err == nil {
				rows.leases = append(rows.leases, w.lease)
			}
		case w.cluster != nil:
			if err = s.acceptCluster(w.cluster, clusters); err == nil {
				rows.clusters = append(rows.clusters, w.cluster)
			}
		default:
			// A batch is accepted whole; its leases are refused one by one.
			for i := range w.leases {
				if w.errs[i] = s.accept(&w.leases[i], leases); w.errs[i] == nil {
					rows.leases = append(rows.leases, &w.leases[i])
				}
			}
		}
		if err != nil {
			w.done <- err
			continue
		}
		accepted = append(accepted, w)
	}
	s.mu.RUnlock()
	if len(accepted) == 0 {
		return
	}

	var err error
	if len(rows.leases) > 0 || len(rows.clusters) > 0 {
		err = s.persist(rows)
	}
	if err == nil {
		s.mu.Lock()
		var added []store.LeaseKey
		for k, l := range leases {
			if _, ok := s.leases[k]; !ok {
				added = append(added, store.LeaseKey{Namespace: l.Namespace, Name: l.Name})
			}
			s.leases[k] = l
		}
		s.addKeys(added)
		for id, c := range clusters {
			s.clusters[id] = c
		}
		s.mu.Unlock()
	}
	for _, w := range accepted {
		w.done <- err
	}
}

// pending are the rows of one commit, in the order they were accepted, so
// that writes of one key land one version after another.
type pending struct {
	leases   []*store.Lease
	clusters []*store.Cluster
}

// accept checks a lease write against the newest state (batch first, then
// committed) and gives it the next version.
func (s *Store) accept(l *store.Lease, batch map[string]store.Lease) error {
	k := leaseKey(l.Namespace, l.Name)
	cur, ok := batch[k]
	if !ok {
		cur = s.leases[k]
	}
	if cur.Version != l.Version {
		return store.ErrConflict
	}
	l.Version = cur.Version + 1
	kept := *l
	kept.Ended = nil // written once, with this write, never again
	batch[k] = kept
	return nil
}

func (s *Store) acceptCluster(c *store.Cluster, batch map[string]store.Cluster) error {
	cur, ok := batch[c.ID]
	if !ok {
		cur = s.clusters[c.ID]
	}
	if cur.Version != c.Version {
		return store.ErrConflict
	}
	c.Version = cur.Version + 1
	batch[c.ID] = *c
	return nil
}

// The upserts repeat the version check in SQL, so that a write can never land
// on a row that changed behind the in-memory state.
const (
	upsertLease = `INSERT INTO leases (namespace, name, holder, fencing_token, ttl_micros, acquired_at, renewed_at, expires_at, revoked,
			moving, move_to, reserved_for, reserved_except, reserved_until, version)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (namespace, name) DO UPDATE SET
			holder = excluded.holder, fencing_token = excluded.fencing_token, ttl_micros = excluded.ttl_micros,
			acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
			revoked = excluded.revoked, moving = excluded.moving, move_to = excluded.move_to,
			reserved_for = excluded.reserved_for, reserved_except = excluded.reserved_except,
			reserved_until = excluded.reserved_until, version = excluded.version
		WHERE leases.version = excluded.version - 1`
	// insertTerm records an ended term; pruneTerms then keeps the newest
	// (namespace, name, keep) of its lease.
	insertTerm = `INSERT OR IGNORE INTO lease_terms (namespace, name, fencing_token, holder, acquired_at, ended_at, ending)
		VALUES (?, ?, ?, ?, ?, ?, ?)`
	pruneTerms = `DELETE FROM lease_terms WHERE namespace = ?1 AND name = ?2 AND fencing_token NOT IN
		(SELECT fencing_token FROM lease_terms WHERE namespace = ?1 AND name = ?2 ORDER BY fencing_token DESC LIMIT ?3)`
	upsertCluster = `INSERT INTO clusters (id, fingerprint, agent_version, labels, cordoned, registered_at, last_seen, version)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			fingerprint = excluded.fingerprint, agent_version = excluded.agent_version, labels = excluded.labels,
			cordoned = excluded.cordoned, registered_at = excluded.registered_at, last_seen = excluded.last_seen,
			version = excluded.version
		WHERE clusters.version = excluded.version - 1`
)

func (s *Store) persist(rows pending) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin commit: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	putLease, putLeases, putCluster := tx.StmtContext(ctx, s.putLease), tx.StmtContext(ctx, s.putLeases), tx.StmtContext(ctx, s.putCluster)
	leases := rows.leases
	for ; len(leases) >= rowsPerUpsert; leases = leases[rowsPerUpsert:] {
		if err = expectRows(rowsPerUpsert)(putLeases.ExecContext(ctx, leaseArgs(leases[:rowsPerUpsert])...)); err != nil {
			return err
		}
	}
	for _, l := range leases {
		if err = expectRows(1)(putLease.ExecContext(ctx, leaseArgs([]*store.Lease{l})...)); err != nil {
			return err
		}
	}
	// The terms these writes end, in the same transaction: recorded if and
	// only if the writes land.
	for _, l := range rows.leases {
		if l.Ended == nil {
			continue
		}
		t := l.Ended
		if _, err = tx.ExecContext(ctx, insertTerm, l.Namespace, l.Name, t.FencingToken, t.Holder,
			toMicros(t.AcquiredAt), toMicros(t.EndedAt), string(t.Ending)); err != nil {
			return fmt.Errorf("record term %d of lease %s/%s: %w", t.FencingToken, l.Namespace, l.Name, err)
		}
		if _, err = tx.ExecContext(ctx, pruneTerms, l.Namespace, l.Name, t.Keep); err != nil {
			return fmt.Errorf("prune terms of lease %s/%s: %w", l.Namespace, l.Name, err)
		}
	}
	for _, c := range rows.clusters {
		labels, jerr := json.Marshal(c.Labels)
		if jerr != nil {
			return fmt.Errorf("encode labels of cluster %s: %w", c.ID, jerr)
		}
		if err = expectRows(1)(putCluster.ExecContext(ctx, c.ID, c.Fingerprint, c.AgentVersion, string(labels),
			c.Cordoned, toMicros(c.RegisteredAt), toMicros(c.LastSeen), c.Version)); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// expectRows returns the error of an upsert of n rows: its own, or rows
// that did not take it because their version moved behind the store.
func expectRows(n int64) func(sql.Result, error) error {
	return func(res sql.Result, err error) error {
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if got, rerr := res.RowsAffected(); rerr != nil || got != n {
			return fmt.Errorf("write: row version moved behind the store (rows affected %d of %d, %v)", got, n, rerr)
		}
		return nil
	}
}

// rowsPerUpsert is how many leases one statement of a large commit writes:
// a statement per lease costs more than the lease's own write.
const rowsPerUpsert = 64

// upsertLeaseRows is upsertLease for n leases.
func upsertLeaseRows(n int) string {
	const row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
	values := strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
	return strings.Replace(upsertLease, row, values, 1)
}

// leaseArgs are the arguments of upsertLeaseRows(len(leases)).
func leaseArgs(leases []*store.Lease) []any {
	args := make([]any, 0, 15*len(leases))
	for _, l := range leases {
		args = append(args, l.Namespace, l.Name, l.Holder, l.FencingToken,
			l.TTL.Microseconds(), toMicros(l.AcquiredAt), toMicros(l.RenewedAt), toMicros(l.ExpiresAt), l.Revoked,
			l.Moving, l.MoveTo, l.Reserved.For, l.Reserved.Except, toMicros(l.Reserved.Until), l.Version)
	}
	return args
}
