package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
)

// Store is the PostgreSQL store.
type Store struct {
	pool      *pgxpool.Pool
	clock     *refclock.Clock
	stopClock func()
}

var (
	_ store.Store           = (*Store)(nil)
	_ store.LeaseFeed       = (*Store)(nil)
	_ store.LeaseBatchStore = (*Store)(nil)
	_ store.TermStore       = (*Store)(nil)
)

// Options configures Open.
type Options struct {
	// VerifyOnly checks that the database holds exactly the schema this
	// binary needs and changes nothing, so that the server can run as a
	// role without rights to alter the schema; someone runs it once with
	// migrations on (or a newer release) first.
	VerifyOnly bool
	// Clock configures how the database's clock is followed (clock.go);
	// the zero value is the production setting.
	Clock refclock.Options
}

// Open connects to dsn, migrates the schema (or verifies it, with
// VerifyOnly) and returns the store.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse PostgreSQL DSN: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	prepare := migrate
	if opts.VerifyOnly {
		prepare = verify
	}
	if err := prepare(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	s := &Store{pool: pool}
	s.startClock(opts.Clock)
	return s, nil
}

const leaseColumns = `namespace, name, holder, fencing_token, ttl_micros, acquired_at, renewed_at, expires_at, revoked,
	moving, move_to, reserved_for, reserved_except, reserved_until, version`

// GetLease implements store.LeaseStore.
func (s *Store) GetLease(ctx context.Context, namespace, name string) (store.Lease, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+leaseColumns+` FROM leases WHERE namespace = $1 AND name = $2`, namespace, name)
	l, err := scanLease(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Lease{}, store.ErrNotFound
	}
	return l, err
}

// PutLease implements store.LeaseStore: an insert that must not collide for
// a new record, an update guarded by the version read for an existing one.
// A write that ends a term records it in the same transaction.
func (s *Store) PutLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	var (
		version int64
		err     error
	)
	args := []any{l.Namespace, l.Name, l.Holder, l.FencingToken, l.TTL.Microseconds(),
		nullTime(l.AcquiredAt), nullTime(l.RenewedAt), nullTime(l.ExpiresAt), l.Revoked,
		l.Moving, l.MoveTo, l.Reserved.For, l.Reserved.Except, nullTime(l.Reserved.Until), l.Version}
	switch {
	case l.Version == 0:
		err = s.pool.QueryRow(ctx, `INSERT INTO leases (`+leaseColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 + 1)
			ON CONFLICT (namespace, name) DO NOTHING RETURNING version`, args...).Scan(&version)
	case l.Ended == nil:
		err = s.pool.QueryRow(ctx, updateLease, args...).Scan(&version)
	default:
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, updateLease, args...).Scan(&version); err != nil {
				return err
			}
			return recordTerm(ctx, tx, l)
		})
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Lease{}, store.ErrConflict
	case err != nil:
		return store.Lease{}, fmt.Errorf("write lease %s/%s: %w", l.Namespace, l.Name, err)
	}
	l.Version = version
	l.Ended = nil
	return l, nil
}

// updateLease is PutLease's update of an existing record.
const updateLease = `UPDATE leases SET holder = $3, fencing_token = $4, ttl_micros = $5,
	acquired_at = $6, renewed_at = $7, expires_at = $8, revoked = $9,
	moving = $10, move_to = $11, reserved_for = $12, reserved_except = $13, reserved_until = $14, version = version + 1
	WHERE namespace = $1 AND name = $2 AND version = $15 RETURNING version`

// pruneTerms keeps the newest $3 ended terms of lease ($1, $2).
const pruneTerms = `DELETE FROM lease_terms WHERE namespace = $1 AND name = $2 AND fencing_token NOT IN
	(SELECT fencing_token FROM lease_terms WHERE namespace = $1 AND name = $2 ORDER BY fencing_token DESC LIMIT $3)`

// recordTerm records the term l's write ends, inside that write's
// transaction, and prunes the lease's history to its bound.
func recordTerm(ctx context.Context, tx pgx.Tx, l store.Lease) error {
	t := l.Ended
	if _, err := tx.Exec(ctx, `INSERT INTO lease_terms (namespace, name, fencing_token, holder, acquired_at, ended_at, ending)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
		l.Namespace, l.Name, t.FencingToken, t.Holder, nullTime(t.AcquiredAt), nullTime(t.EndedAt), string(t.Ending)); err != nil {
		return fmt.Errorf("record term %d: %w", t.FencingToken, err)
	}
	if _, err := tx.Exec(ctx, pruneTerms, l.Namespace, l.Name, t.Keep); err != nil {
		return fmt.Errorf("prune terms: %w", err)
	}
	return nil
}

// ListTerms implements store.TermStore.
func (s *Store) ListTerms(ctx context.Context, namespace, name string, limit int) ([]store.Term, error) {
	q := `SELECT holder, fencing_token, acquired_at, ended_at, ending FROM lease_terms
		WHERE namespace = $1 AND name = $2 ORDER BY fencing_token DESC`
	args := []any{namespace, name}
	if limit > 0 {
		q += ` LIMIT $3`
		args = append(args, limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list terms of lease %s/%s: %w", namespace, name, err)
	}
	defer rows.Close()
	var out []store.Term
	for rows.Next() {
		var (
			t               store.Term
			acquired, ended *time.Time
			ending          string
		)
		if err := rows.Scan(&t.Holder, &t.FencingToken, &acquired, &ended, &ending); err != nil {
			return nil, fmt.Errorf("list terms of lease %s/%s: %w", namespace, name, err)
		}
		t.AcquiredAt, t.EndedAt, t.Ending = utc(acquired), utc(ended), store.Ending(ending)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list terms of lease %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// GetLeases implements store.LeaseBatchStore: one query joins the keys,
// passed as two arrays, with the table.
func (s *Store) GetLeases(ctx context.Context, keys []store.LeaseKey) ([]store.Lease, error) {
	out := make([]store.Lease, len(keys))
	namespaces, names := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		out[i] = store.Lease{Namespace: k.Namespace, Name: k.Name}
		namespaces[i], names[i] = k.Namespace, k.Name
	}
	rows, err := s.pool.Query(ctx, `SELECT k.idx, `+leaseColumns+`
		FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(namespace, name, idx)
		JOIN leases USING (namespace, name)`, namespaces, names)
	if err != nil {
		return nil, fmt.Errorf("get %d leases: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		var idx int64
		l, err := scanLease(rows, &idx)
		if err != nil {
			return nil, fmt.Errorf("get %d leases: %w", len(keys), err)
		}
		out[idx-1] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("get %d leases: %w", len(keys), err)
	}
	return out, nil
}

// PutLeases implements store.LeaseBatchStore in one round trip: one UPDATE
// of the existing records, each guarded by its version, and one INSERT of
// the new ones that must not collide, both over arrays of the leases and
// sent as one pipelined batch. A key repeated in leases is refused with
// ErrConflict after its first write.
func (s *Store) PutLeases(ctx context.Context, leases []store.Lease) ([]store.Lease, []error, error) {
	written := slices.Clone(leases)
	errs := make([]error, len(leases))
	var updates, inserts leaseArrays
	first := make(map[store.LeaseKey]int, len(leases))
	for i, l := range leases {
		k := store.LeaseKey{Namespace: l.Namespace, Name: l.Name}
		if _, dup := first[k]; dup {
			errs[i] = store.ErrConflict
			continue
		}
		first[k] = i
		// Refused unless the database answers for it below.
		errs[i] = store.ErrConflict
		if l.Version == 0 {
			inserts.add(i, l)
		} else {
			updates.add(i, l)
		}
	}
	// The batch runs as one implicit transaction: the terms the updates
	// end are recorded (by the same statement, for the updates that land)
	// and pruned with them, or not at all.
	batch := &pgx.Batch{}
	if len(updates.idx) > 0 {
		batch.Queue(`WITH w AS (UPDATE leases AS l SET holder = u.holder, fencing_token = u.fencing_token,
				ttl_micros = u.ttl_micros, acquired_at = u.acquired_at, renewed_at = u.renewed_at,
				expires_at = u.expires_at, revoked = u.revoked, moving = u.moving, move_to = u.move_to,
				reserved_for = u.reserved_for, reserved_except = u.reserved_except, reserved_until = u.reserved_until,
				version = l.version + 1
				FROM `+leaseArraysTable+`
				WHERE l.namespace = u.namespace AND l.name = u.name AND l.version = u.version
				RETURNING u.idx, l.version),
			t AS (INSERT INTO lease_terms (namespace, name, fencing_token, holder, acquired_at, ended_at, ending)
				SELECT e.namespace, e.name, e.fencing_token, e.holder, e.acquired_at, e.ended_at, e.ending
				FROM `+endedArraysTable(len(updates.args())+1)+` JOIN w USING (idx)
				ON CONFLICT DO NOTHING)
			SELECT idx, version FROM w`, append(updates.args(), updates.ended.args()...)...)
		if len(updates.ended.idx) > 0 {
			batch.Queue(`DELETE FROM lease_terms AS t USING (
					SELECT namespace, name, fencing_token,
						row_number() OVER (PARTITION BY namespace, name ORDER BY fencing_token DESC) AS n
					FROM lease_terms WHERE (namespace, name) IN (SELECT * FROM unnest($1::text[], $2::text[]))) AS r,
					unnest($1::text[], $2::text[], $3::int4[]) AS k(namespace, name, keep)
				WHERE t.namespace = r.namespace AND t.name = r.name AND t.fencing_token = r.fencing_token
					AND k.namespace = r.namespace AND k.name = r.name AND r.n > k.keep`,
				updates.ended.namespaces, updates.ended.names, updates.ended.keep)
		}
	}
	if len(inserts.idx) > 0 {
		batch.Queue(`INSERT INTO leases (`+leaseColumns+`)
			SELECT namespace, name, holder, fencing_token, ttl_micros, acquired_at, renewed_at, expires_at, revoked,
				moving, move_to, reserved_for, reserved_except, reserved_until, 1
			FROM `+leaseArraysTable+`
			ON CONFLICT (namespace, name) DO NOTHING
			RETURNING namespace, name, version`, inserts.args()...)
	}
	if batch.Len() == 0 {
		return written, errs, nil
	}
	results := s.pool.SendBatch(ctx, batch)
	err := func() error {
		if len(updates.idx) > 0 {
			rows, _ := results.Query()
			var (
				idx     int32
				version int64
			)
			if _, err := pgx.ForEachRow(rows, []any{&idx, &version}, func() error {
				written[idx].Version, errs[idx] = version, nil
				return nil
			}); err != nil {
				return err
			}
			if len(updates.ended.idx) > 0 {
				if _, err := results.Exec(); err != nil {
					return err
				}
			}
		}
		if len(inserts.idx) > 0 {
			rows, _ := results.Query()
			var (
				k       store.LeaseKey
				version int64
			)
			if _, err := pgx.ForEachRow(rows, []any{&k.Namespace, &k.Name, &version}, func() error {
				i := first[k]
				written[i].Version, errs[i] = version, nil
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	}()
	if err = errors.Join(err, results.Close()); err != nil {
		return nil, nil, fmt.Errorf("write %d leases: %w", len(leases), err)
	}
	for i := range written {
		written[i].Ended = nil
	}
	return written, errs, nil
}

// leaseArraysTable reads leaseArrays.args as a table u of leases, each with
// the version it was read at and its index in the call.
const leaseArraysTable = `unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[],
	$6::timestamptz[], $7::timestamptz[], $8::timestamptz[], $9::bool[],
	$10::bool[], $11::text[], $12::text[], $13::text[], $14::timestamptz[], $15::int8[], $16::int4[])
	AS u(namespace, name, holder, fencing_token, ttl_micros, acquired_at, renewed_at, expires_at, revoked,
		moving, move_to, reserved_for, reserved_except, reserved_until, version, idx)`

// leaseArrays are leases column by column, as PostgreSQL's unnest reads them,
// and the terms their writes end.
type leaseArrays struct {
	namespaces, names, holders, moveTo, resFor, resExcept []string
	tokens, idx                                           []int32
	ttls, versions                                        []int64
	acquired, renewed, expires, resUntil                  []*time.Time
	revoked, moving                                       []bool
	ended                                                 endedArrays
}

func (a *leaseArrays) add(i int, l store.Lease) {
	a.namespaces, a.names, a.holders = append(a.namespaces, l.Namespace), append(a.names, l.Name), append(a.holders, l.Holder)
	a.tokens, a.idx = append(a.tokens, l.FencingToken), append(a.idx, int32(i))
	a.ttls, a.versions = append(a.ttls, l.TTL.Microseconds()), append(a.versions, l.Version)
	a.acquired = append(a.acquired, nullTime(l.AcquiredAt))
	a.renewed = append(a.renewed, nullTime(l.RenewedAt))
	a.expires = append(a.expires, nullTime(l.ExpiresAt))
	a.revoked, a.moving = append(a.revoked, l.Revoked), append(a.moving, l.Moving)
	a.moveTo, a.resFor, a.resExcept = append(a.moveTo, l.MoveTo), append(a.resFor, l.Reserved.For), append(a.resExcept, l.Reserved.Except)
	a.resUntil = append(a.resUntil, nullTime(l.Reserved.Until))
	if l.Ended != nil {
		a.ended.add(i, l)
	}
}

func (a *leaseArrays) args() []any {
	return []any{a.namespaces, a.names, a.holders, a.tokens, a.ttls, a.acquired, a.renewed, a.expires, a.revoked,
		a.moving, a.moveTo, a.resFor, a.resExcept, a.resUntil, a.versions, a.idx}
}

// endedArrays are the terms that writes of a batch end, column by column.
type endedArrays struct {
	namespaces, names, holders, endings []string
	idx, tokens, keep                   []int32
	acquired, ended                     []*time.Time
}

func (a *endedArrays) add(i int, l store.Lease) {
	t := l.Ended
	a.namespaces, a.names, a.holders = append(a.namespaces, l.Namespace), append(a.names, l.Name), append(a.holders, t.Holder)
	a.endings, a.idx, a.tokens = append(a.endings, string(t.Ending)), append(a.idx, int32(i)), append(a.tokens, t.FencingToken)
	a.keep = append(a.keep, int32(t.Keep))
	a.acquired, a.ended = append(a.acquired, nullTime(t.AcquiredAt)), append(a.ended, nullTime(t.EndedAt))
}

func (a *endedArrays) args() []any {
	return []any{a.idx, a.namespaces, a.names, a.tokens, a.holders, a.acquired, a.ended, a.endings}
}

// endedArraysTable reads endedArrays.args, from parameter $first on, as a
// table e of terms, each with the index of the write that ends it.
func endedArraysTable(first int) string {
	return fmt.Sprintf(`unnest($%d::int4[], $%d::text[], $%d::text[], $%d::int4[], $%d::text[], $%d::timestamptz[], $%d::timestamptz[], $%d::text[])
		AS e(idx, namespace, name, fencing_token, holder, acquired_at, ended_at, ending)`,
		first, first+1, first+2, first+3, first+4, first+5, first+6, first+7)
}

// ListLeases implements store.LeaseStore.
func (s *Store) ListLeases(ctx context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	afterNS, afterName, _ := strings.Cut(opts.After, "/")
	q := `SELECT ` + leaseColumns + ` FROM leases WHERE ($1 = '' OR namespace = $1) AND (namespace, name) > ($2, $3)
		ORDER BY namespace, name`
	args := []any{opts.Namespace, afterNS, afterName}
	if opts.Limit > 0 {
		q += ` LIMIT $4`
		args = append(args, opts.Limit+1)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, false, fmt.Errorf("list leases: %w", err)
	}
	defer rows.Close()
	var out []store.Lease
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, false, err
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list leases: %w", err)
	}
	if opts.Limit > 0 && len(out) > opts.Limit {
		return out[:opts.Limit], true, nil
	}
	return out, false, nil
}

const clusterColumns = `id, fingerprint, agent_version, labels, cordoned, registered_at, last_seen, version`

// GetCluster implements store.ClusterStore.
func (s *Store) GetCluster(ctx context.Context, id string) (store.Cluster, error) {
	c, err := scanCluster(s.pool.QueryRow(ctx, `SELECT `+clusterColumns+` FROM clusters WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Cluster{}, store.ErrNotFound
	}
	return c, err
}

// PutCluster implements store.ClusterStore.
func (s *Store) PutCluster(ctx context.Context, c store.Cluster) (store.Cluster, error) {
	labels, err := json.Marshal(c.Labels)
	if err != nil {
		return store.Cluster{}, fmt.Errorf("encode labels of cluster %s: %w", c.ID, err)
	}
	args := []any{c.ID, c.Fingerprint, c.AgentVersion, labels, c.Cordoned, nullTime(c.RegisteredAt), nullTime(c.LastSeen), c.Version}
	var version int64
	if c.Version == 0 {
		err = s.pool.QueryRow(ctx, `INSERT INTO clusters (`+clusterColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8 + 1)
			ON CONFLICT (id) DO NOTHING RETURNING version`, args...).Scan(&version)
	} else {
		err = s.pool.QueryRow(ctx, `UPDATE clusters SET fingerprint = $2, agent_version = $3, labels = $4, cordoned = $5,
			registered_at = $6, last_seen = $7, version = version + 1
			WHERE id = $1 AND version = $8 RETURNING version`, args...).Scan(&version)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Cluster{}, store.ErrConflict
	case err != nil:
		return store.Cluster{}, fmt.Errorf("write cluster %s: %w", c.ID, err)
	}
	c.Version = version
	return c, nil
}

// ListClusters implements store.ClusterStore.
func (s *Store) ListClusters(ctx context.Context) ([]store.Cluster, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+clusterColumns+` FROM clusters ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	defer rows.Close()
	var out []store.Cluster
	for rows.Next() {
		c, err := scanCluster(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping PostgreSQL: %w", err)
	}
	// A replica that cannot bound the database's clock must not serve.
	if _, err := s.clock.Now(ctx); err != nil {
		return fmt.Errorf("ping PostgreSQL: %w", err)
	}
	return nil
}

// FollowLeases implements store.LeaseFeed with LISTEN on a connection of its
// own (outside the pool, so that it takes no capacity from requests): the
// schema's triggers notify every lease creation and change of holder or
// token, whichever replica wrote it.
func (s *Store) FollowLeases(ctx context.Context, changed func(store.LeaseChange)) error {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("connect to follow lease changes: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+leaseChannel); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen for lease changes: %w", err)
	}
	changed(store.LeaseChange{All: true})
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("wait for lease changes: %w", err)
		}
		namespace, name, ok := strings.Cut(n.Payload, "/")
		if !ok {
			// Not ours to read: let every waiter look again.
			changed(store.LeaseChange{All: true})
			continue
		}
		changed(store.LeaseChange{Namespace: namespace, Name: name})
	}
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.stopClock()
	s.pool.Close()
	return nil
}

// scanLease reads the columns leaseColumns names, after those into before.
func scanLease(row pgx.Row, before ...any) (store.Lease, error) {
	var (
		l                          store.Lease
		ttl                        int64
		acquired, renewed, expires *time.Time
	)
	var reservedUntil *time.Time
	dest := append(before, &l.Namespace, &l.Name, &l.Holder, &l.FencingToken, &ttl, &acquired, &renewed, &expires, &l.Revoked,
		&l.Moving, &l.MoveTo, &l.Reserved.For, &l.Reserved.Except, &reservedUntil, &l.Version)
	if err := row.Scan(dest...); err != nil {
		return store.Lease{}, err
	}
	l.TTL = time.Duration(ttl) * time.Microsecond
	l.AcquiredAt, l.RenewedAt, l.ExpiresAt = utc(acquired), utc(renewed), utc(expires)
	l.Reserved.Until = utc(reservedUntil)
	return l, nil
}

func scanCluster(row pgx.Row) (store.Cluster, error) {
	var (
		c                    store.Cluster
		labels               []byte
		registered, lastSeen *time.Time
	)
	if err := row.Scan(&c.ID, &c.Fingerprint, &c.AgentVersion, &labels, &c.Cordoned, &registered, &lastSeen, &c.Version); err != nil {
		return store.Cluster{}, err
	}
	if err := json.Unmarshal(labels, &c.Labels); err != nil {
		return store.Cluster{}, fmt.Errorf("decode labels of cluster %s: %w", c.ID, err)
	}
	c.RegisteredAt, c.LastSeen = utc(registered), utc(lastSeen)
	return c, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
