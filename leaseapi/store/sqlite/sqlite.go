package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/berthfleet/berth/leaseapi/store"
)

// maxBatch bounds how many writes share one transaction.
const maxBatch = 1024

// Store is the embedded SQLite store.
type Store struct {
	path string
	db   *sql.DB
	lock *flock.Flock
	// putLease, putLeases (rowsPerUpsert leases) and putCluster are the
	// writer's prepared upserts.
	putLease, putLeases, putCluster *sql.Stmt

	// mu guards the committed records; the writer takes it only to publish
	// a committed batch.
	mu       sync.RWMutex
	leases   map[string]store.Lease
	clusters map[string]store.Cluster
	// order holds every lease key in list order (records are never
	// deleted), so that a page costs its own length, not the store's.
	order []store.LeaseKey

	// closeMu orders Close after every in-flight enqueue.
	closeMu sync.RWMutex
	closed  bool
	writes  chan *write
	stopped chan struct{}
}

var (
	_ store.Store           = (*Store)(nil)
	_ store.LeaseBatchStore = (*Store)(nil)
	_ store.TermStore       = (*Store)(nil)
)

// write is one queued compare-and-swap, or a batch of them; exactly one of
// lease, cluster and leases is set.
type write struct {
	lease   *store.Lease
	cluster *store.Cluster
	// leases are the writes of PutLeases, committed in the same
	// transaction; errs[i] is set for those refused.
	leases []store.Lease
	errs   []error
	done   chan error
}

// ErrLocked is returned by Open when another process has the file open.
var ErrLocked = errors.New("store file is in use by another process")

// Open opens (creating if needed) the store at path, takes its lock, migrates
// the schema and loads the records.
func Open(ctx context.Context, path string) (*Store, error) {
	lock := flock.New(path + ".lock")
	ok, err := lock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Path(), err)
	}
	if !ok {
		return nil, fmt.Errorf("open %s: %w (lock %s is held; is another berth-leaseapi running?)", path, ErrLocked, lock.Path())
	}
	s, err := open(ctx, path, lock)
	if err != nil {
		_ = lock.Unlock()
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, path string, lock *flock.Flock) (*Store, error) {
	// WAL with synchronous=FULL syncs the log on every commit: an
	// acknowledged write is on disk.
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One connection: the writer is the only one that needs it.
	db.SetMaxOpenConns(1)
	s := &Store{
		path:     path,
		db:       db,
		lock:     lock,
		leases:   map[string]store.Lease{},
		clusters: map[string]store.Cluster{},
		writes:   make(chan *write, maxBatch),
		stopped:  make(chan struct{}),
	}
	if err := s.init(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	go s.writer()
	return s, nil
}

func (s *Store) init(ctx context.Context) error {
	var mode string
	if err := s.db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return fmt.Errorf("open %s: %w", s.path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("open %s: journal mode is %q, want wal", s.path, mode)
	}
	if err := migrate(ctx, s.db); err != nil {
		return fmt.Errorf("open %s: %w", s.path, err)
	}
	if err := s.load(ctx); err != nil {
		return fmt.Errorf("open %s: %w", s.path, err)
	}
	var err error
	if s.putLease, err = s.db.PrepareContext(ctx, upsertLease); err != nil {
		return fmt.Errorf("prepare lease upsert: %w", err)
	}
	if s.putLeases, err = s.db.PrepareContext(ctx, upsertLeaseRows(rowsPerUpsert)); err != nil {
		return fmt.Errorf("prepare lease upserts: %w", err)
	}
	if s.putCluster, err = s.db.PrepareContext(ctx, upsertCluster); err != nil {
		return fmt.Errorf("prepare cluster upsert: %w", err)
	}
	return nil
}

func (s *Store) load(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, `SELECT namespace, name, holder, fencing_token, ttl_micros, acquired_at, renewed_at, expires_at, revoked,
		moving, move_to, reserved_for, reserved_except, reserved_until, version FROM leases`)
	if err != nil {
		return fmt.Errorf("load leases: %w", err)
	}
	for rows.Next() {
		var (
			l                                      store.Lease
			ttl, acquired, renewed, expi, reserved int64
		)
		if err := rows.Scan(&l.Namespace, &l.Name, &l.Holder, &l.FencingToken, &ttl, &acquired, &renewed, &expi, &l.Revoked,
			&l.Moving, &l.MoveTo, &l.Reserved.For, &l.Reserved.Except, &reserved, &l.Version); err != nil {
			_ = rows.Close()
			return fmt.Errorf("load leases: %w", err)
		}
		l.TTL = time.Duration(ttl) * time.Microsecond
		l.AcquiredAt, l.RenewedAt, l.ExpiresAt = fromMicros(acquired), fromMicros(renewed), fromMicros(expi)
		l.Reserved.Until = fromMicros(reserved)
		s.leases[leaseKey(l.Namespace, l.Name)] = l
		s.order = append(s.order, store.LeaseKey{Namespace: l.Namespace, Name: l.Name})
	}
	slices.SortFunc(s.order, compareKeys)
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("load leases: %w", err)
	}

	rows, err = s.db.QueryContext(ctx, `SELECT id, fingerprint, agent_version, labels, cordoned, registered_at, last_seen, version FROM clusters`)
	if err != nil {
		return fmt.Errorf("load clusters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			c              store.Cluster
			labels         string
			registered, ls int64
		)
		if err := rows.Scan(&c.ID, &c.Fingerprint, &c.AgentVersion, &labels, &c.Cordoned, &registered, &ls, &c.Version); err != nil {
			return fmt.Errorf("load clusters: %w", err)
		}
		if err := json.Unmarshal([]byte(labels), &c.Labels); err != nil {
			return fmt.Errorf("load cluster %s labels: %w", c.ID, err)
		}
		c.RegisteredAt, c.LastSeen = fromMicros(registered), fromMicros(ls)
		s.clusters[c.ID] = c
	}
	return rows.Err()
}

// GetLease implements store.LeaseStore.
func (s *Store) GetLease(_ context.Context, namespace, name string) (store.Lease, error) {
	s.mu.RLock()
	l, ok := s.leases[leaseKey(namespace, name)]
	s.mu.RUnlock()
	if !ok {
		return store.Lease{}, store.ErrNotFound
	}
	return l, nil
}

// ListLeases implements store.LeaseStore: it starts at the first key of the
// page in the ordered keys and reads no further than the page.
func (s *Store) ListLeases(_ context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	var after store.LeaseKey
	if opts.After != "" {
		after.Namespace, after.Name, _ = strings.Cut(opts.After, "/")
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	start, _ := slices.BinarySearchFunc(s.order, after, compareKeys)
	if opts.Namespace != "" {
		first, _ := slices.BinarySearchFunc(s.order, store.LeaseKey{Namespace: opts.Namespace}, compareKeys)
		start = max(start, first)
	}
	var out []store.Lease
	for _, k := range s.order[start:] {
		if opts.Namespace != "" && k.Namespace != opts.Namespace {
			break
		}
		if !opts.Selects(k.Namespace, k.Name) {
			continue // After itself
		}
		if opts.Limit > 0 && len(out) == opts.Limit {
			return out, true, nil
		}
		out = append(out, s.leases[leaseKey(k.Namespace, k.Name)])
	}
	return out, false, nil
}

func compareKeys(a, b store.LeaseKey) int {
	return store.CompareKeys(a.Namespace, a.Name, b.Namespace, b.Name)
}

// addKeys merges the keys of leases new to the store into s.order; the
// caller holds mu for writing.
func (s *Store) addKeys(added []store.LeaseKey) {
	if len(added) == 0 {
		return
	}
	slices.SortFunc(added, compareKeys)
	merged := make([]store.LeaseKey, 0, len(s.order)+len(added))
	i, j := 0, 0
	for i < len(s.order) && j < len(added) {
		if compareKeys(s.order[i], added[j]) < 0 {
			merged = append(merged, s.order[i])
			i++
		} else {
			merged = append(merged, added[j])
			j++
		}
	}
	merged = append(append(merged, s.order[i:]...), added[j:]...)
	s.order = merged
}

// PutLease implements store.LeaseStore.
func (s *Store) PutLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	w := &write{lease: &l, done: make(chan error, 1)}
	if err := s.enqueue(ctx, w); err != nil {
		return store.Lease{}, err
	}
	l.Ended = nil
	return l, nil
}

// GetLeases implements store.LeaseBatchStore from the committed records.
func (s *Store) GetLeases(_ context.Context, keys []store.LeaseKey) ([]store.Lease, error) {
	out := make([]store.Lease, len(keys))
	s.mu.RLock()
	for i, k := range keys {
		l, ok := s.leases[leaseKey(k.Namespace, k.Name)]
		if !ok {
			l = store.Lease{Namespace: k.Namespace, Name: k.Name}
		}
		out[i] = l
	}
	s.mu.RUnlock()
	return out, nil
}

// PutLeases implements store.LeaseBatchStore: the writer checks every lease
// as PutLease's write and commits those it accepts in one transaction
// (with whatever else is queued then).
func (s *Store) PutLeases(ctx context.Context, leases []store.Lease) ([]store.Lease, []error, error) {
	w := &write{leases: slices.Clone(leases), errs: make([]error, len(leases)), done: make(chan error, 1)}
	if err := s.enqueue(ctx, w); err != nil {
		return nil, nil, err
	}
	for i := range w.leases {
		w.leases[i].Ended = nil
	}
	return w.leases, w.errs, nil
}

// ListTerms implements store.TermStore from the database (terms are not
// kept in memory: only history reads them).
func (s *Store) ListTerms(ctx context.Context, namespace, name string, limit int) ([]store.Term, error) {
	q := `SELECT holder, fencing_token, acquired_at, ended_at, ending FROM lease_terms
		WHERE namespace = ? AND name = ? ORDER BY fencing_token DESC`
	args := []any{namespace, name}
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list terms of lease %s/%s: %w", namespace, name, err)
	}
	defer rows.Close()
	var out []store.Term
	for rows.Next() {
		var (
			t               store.Term
			acquired, ended int64
		)
		if err := rows.Scan(&t.Holder, &t.FencingToken, &acquired, &ended, &t.Ending); err != nil {
			return nil, fmt.Errorf("list terms of lease %s/%s: %w", namespace, name, err)
		}
		t.AcquiredAt, t.EndedAt = fromMicros(acquired), fromMicros(ended)
		out = append(out, t)
	}
	return out, rows.Err()
}

// GetCluster implements store.ClusterStore.
func (s *Store) GetCluster(_ context.Context, id string) (store.Cluster, error) {
	s.mu.RLock()
	c, ok := s.clusters[id]
	s.mu.RUnlock()
	if !ok {
		return store.Cluster{}, store.ErrNotFound
	}
	c.Labels = maps.Clone(c.Labels)
	return c, nil
}

// ListClusters implements store.ClusterStore.
func (s *Store) ListClusters(context.Context) ([]store.Cluster, error) {
	s.mu.RLock()
	out := make([]store.Cluster, 0, len(s.clusters))
	for _, c := range s.clusters {
		c.Labels = maps.Clone(c.Labels)
		out = append(out, c)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b store.Cluster) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// PutCluster implements store.ClusterStore.
func (s *Store) PutCluster(ctx context.Context, c store.Cluster) (store.Cluster, error) {
	c.Labels = maps.Clone(c.Labels)
	w := &write{cluster: &c, done: make(chan error, 1)}
	if err := s.enqueue(ctx, w); err != nil {
		return store.Cluster{}, err
	}
	return c, nil
}

// Ping implements store.Store: it reads through the database connection, so
// it fails when the file cannot be read.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.QueryRowContext(ctx, `SELECT 1 FROM leases LIMIT 1`).Scan(&one); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("ping %s: %w", s.path, err)
	}
	return nil
}

// Close waits for queued writes to commit, then closes the database and
// releases the file lock.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.writes)
	s.closeMu.Unlock()
	<-s.stopped
	return errors.Join(s.db.Close(), s.lock.Unlock())
}

// errClosed is returned for writes after Close.
var errClosed = errors.New("store is closed")

// enqueue hands w to the writer and waits for its commit. A caller whose
// context ends first gets the context's error; its write may still land.
func (s *Store) enqueue(ctx context.Context, w *write) error {
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return errClosed
	}
	select {
	case s.writes <- w:
		s.closeMu.RUnlock()
	case <-ctx.Done():
		s.closeMu.RUnlock()
		return ctx.Err()
	}
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func leaseKey(namespace, name string) string { return namespace + "/" + name }

func toMicros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}
