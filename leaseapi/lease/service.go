package lease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// casAttempts bounds how often one operation re-reads and re-decides after
// losing a compare-and-swap race. Every lost race means another write landed,
// so this only runs out under pathological contention.
const casAttempts = 16

// DefaultClusterTTL is how long a cluster counts as healthy after its last
// heartbeat, and how long its registration blocks a different fingerprint.
const DefaultClusterTTL = 30 * time.Second

// ErrFingerprintConflict: another live registration holds the cluster id.
var ErrFingerprintConflict = errors.New("cluster id is registered by another cluster")

// Service applies the state machine to a store.
type Service struct {
	store      store.Store
	clock      clock.PassiveClock
	storeClock store.Clock
	clusterTTL time.Duration
	// historyTerms is how many ended terms of each lease are kept; zero
	// records none.
	historyTerms int
	changes      changes
	changeLog    *changeLog
}

// Options configures a Service.
type Options struct {
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// StoreClock, when set, judges lease terms instead of Clock: the clock
	// of a store that several servers share (store.Clock), so that all of
	// them agree when a term ends whatever their own clocks say.
	StoreClock store.Clock
	// ClusterTTL defaults to DefaultClusterTTL.
	ClusterTTL time.Duration
	// ChangeLogSize is how many recent changes watches can resume across;
	// it defaults to DefaultChangeLogSize.
	ChangeLogSize int
	// HistoryTerms is how many ended terms of each lease the store keeps
	// (store.TermStore): DefaultHistoryTerms when zero, none when negative.
	HistoryTerms int
}

// DefaultHistoryTerms is how many ended terms of each lease are kept unless
// configured otherwise.
const DefaultHistoryTerms = 20

// NewService returns a Service on s.
func NewService(s store.Store, opts Options) *Service {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ClusterTTL <= 0 {
		opts.ClusterTTL = DefaultClusterTTL
	}
	switch {
	case opts.HistoryTerms == 0:
		opts.HistoryTerms = DefaultHistoryTerms
	case opts.HistoryTerms < 0:
		opts.HistoryTerms = 0
	}
	return &Service{
		store: s, clock: opts.Clock, storeClock: opts.StoreClock, clusterTTL: opts.ClusterTTL,
		historyTerms: opts.HistoryTerms, changeLog: newChangeLog(opts.ChangeLogSize),
	}
}

// instant is when an operation happens on the clock that judges terms,
// truncated to what every backend can store. The server's own clock is read
// exactly; a shared store's clock is known only within bounds.
type instant struct{ earliest, latest time.Time }

// now reads the clock that judges terms: the store's when the service has
// one, else the server's own.
func (s *Service) now(ctx context.Context) (instant, error) {
	if s.storeClock == nil {
		t := s.clock.Now().UTC().Truncate(time.Microsecond)
		return instant{earliest: t, latest: t}, nil
	}
	r, err := s.storeClock.Now(ctx)
	if err != nil {
		return instant{}, err
	}
	latest := r.Latest.UTC()
	if t := latest.Truncate(time.Microsecond); t.Before(latest) {
		latest = t.Add(time.Microsecond)
	}
	return instant{earliest: r.Earliest.UTC().Truncate(time.Microsecond), latest: latest}, nil
}

// grant makes a term that d begins or extends (at at.earliest) end no
// earlier than a TTL after the latest time the clock may have shown. Every
// server judges expiry at the earliest time its clock may show, so none sees
// a term end before its TTL has passed on the judging clock; uncertainty
// only ever delays a takeover. A term the decision kept to its old, later
// end (a renewal with a lower TTL) is left there, so the uncertainty of
// each renewal does not add up.
func (at instant) grant(d Decision) Decision {
	if d.Write && d.Held() {
		if until := d.Next.RenewedAt.Add(d.Next.TTL).Add(at.latest.Sub(at.earliest)); until.After(d.Next.ExpiresAt) {
			d.Next.ExpiresAt = until
		}
	}
	return d
}

// Acquire takes the lease for holder, or renews it if holder already has it.
func (s *Service) Acquire(ctx context.Context, key leaseapi.Key, holder string, ttl time.Duration) (Decision, error) {
	at, err := s.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	now := at.earliest
	return s.updateLease(ctx, key, func(cur store.Lease) (Decision, error) {
		d, err := DecideAcquire(cur, holder, ttl, now)
		if err != nil || d.Outcome != OutcomeAcquired {
			return at.grant(d), err
		}
		if err := s.checkNotCordoned(ctx, holder); err != nil {
			return Decision{Next: cur, Outcome: OutcomeConflict}, err
		}
		return at.grant(d), nil
	})
}

// Renew extends holder's term if it still holds the lease with token.
func (s *Service) Renew(ctx context.Context, key leaseapi.Key, holder string, token int32, ttl time.Duration) (Decision, error) {
	at, err := s.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	now := at.earliest
	return s.updateLease(ctx, key, func(cur store.Lease) (Decision, error) {
		return at.grant(DecideRenew(cur, holder, token, ttl, now)), nil
	})
}

// Release frees the lease if holder holds it with token.
func (s *Service) Release(ctx context.Context, key leaseapi.Key, holder string, token int32) (Decision, error) {
	at, err := s.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	now := at.earliest
	return s.updateLease(ctx, key, func(cur store.Lease) (Decision, error) {
		return DecideRelease(cur, holder, token, now)
	})
}

// Revoke is a release of holder's term with token by someone who does not
// own holder (an administrator): a live term is marked revoked rather than
// freed, so that it moves only once its holder has stopped and released it,
// or at its expiry (DecideRevoke).
func (s *Service) Revoke(ctx context.Context, key leaseapi.Key, holder string, token int32) (Decision, error) {
	at, err := s.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	now := at.earliest
	return s.updateLease(ctx, key, func(cur store.Lease) (Decision, error) {
		return DecideRevoke(cur, holder, token, now)
	})
}

// Move moves holder's term with token to cluster to (empty: any cluster
// but the holder's), as DecideMove decides it. A named destination must be
// registered and not cordoned when the move is recorded (ErrMoveTarget):
// a reservation for a cluster that cannot take the lease would only hold
// the others back.
func (s *Service) Move(ctx context.Context, key leaseapi.Key, holder string, token int32, to string) (Decision, error) {
	at, err := s.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	now := at.earliest
	return s.updateLease(ctx, key, func(cur store.Lease) (Decision, error) {
		d, err := DecideMove(cur, holder, token, to, now)
		if err != nil || !d.Write || d.Outcome != OutcomeMoved || to == "" {
			return d, err
		}
		if err := s.checkMoveTarget(ctx, to); err != nil {
			return Decision{Next: cur, Outcome: OutcomeConflict}, err
		}
		return d, nil
	})
}

func (s *Service) checkMoveTarget(ctx context.Context, id string) error {
	c, err := s.store.GetCluster(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: cluster %s is not registered", ErrMoveTarget, id)
	case err != nil:
		return fmt.Errorf("get cluster %s: %w", id, err)
	case c.Cordoned:
		return fmt.Errorf("%w: cluster %s is cordoned", ErrMoveTarget, id)
	}
	return nil
}

// HistoryEntry is one term of a lease's history: an ended term, or the
// live one (Live, with EndedAt zero and no Ending).
type HistoryEntry struct {
	store.Term
	Live bool
}

// History returns the terms of a lease, newest first, at most limit: the
// live term, if any, then the ended terms the store keeps. A term that
// expired but was not swept yet shows as ended, as Get shows it. A lease
// never seen is store.ErrNotFound.
func (s *Service) History(ctx context.Context, key leaseapi.Key, limit int) ([]HistoryEntry, error) {
	raw, err := s.store.GetLease(ctx, key.Namespace, key.Name)
	if err != nil {
		return nil, fmt.Errorf("get lease %s: %w", key, err)
	}
	at, err := s.now(ctx)
	if err != nil {
		return nil, err
	}
	var out []HistoryEntry
	switch now := at.earliest; {
	case raw.Held(now):
		out = append(out, HistoryEntry{Term: store.Term{Holder: raw.Holder, FencingToken: raw.FencingToken, AcquiredAt: raw.AcquiredAt}, Live: true})
	case raw.Holder != "":
		_, ended := end(raw, now)
		out = append(out, HistoryEntry{Term: *ended})
	}
	var kept []store.Term
	if ts, ok := s.store.(store.TermStore); ok {
		if kept, err = ts.ListTerms(ctx, key.Namespace, key.Name, limit); err != nil {
			return nil, fmt.Errorf("list terms of lease %s: %w", key, err)
		}
	}
	// The lease was read first: a term that ended since is in kept as
	// well, and kept has the truth about it.
	if len(out) > 0 && len(kept) > 0 && kept[0].FencingToken == out[0].FencingToken {
		out = out[:0]
	}
	for _, t := range kept {
		out = append(out, HistoryEntry{Term: t})
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Get returns the lease as callers should see it: an expired term shows no
// holder even before the sweep has run.
func (s *Service) Get(ctx context.Context, key leaseapi.Key) (store.Lease, error) {
	l, err := s.store.GetLease(ctx, key.Namespace, key.Name)
	if err != nil {
		return store.Lease{}, fmt.Errorf("get lease %s: %w", key, err)
	}
	at, err := s.now(ctx)
	if err != nil {
		return store.Lease{}, err
	}
	return visible(l, at.earliest), nil
}

// List returns a page of leases as Get shows them.
func (s *Service) List(ctx context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	leases, more, err := s.store.ListLeases(ctx, opts)
	if err != nil {
		return nil, false, fmt.Errorf("list leases: %w", err)
	}
	at, err := s.now(ctx)
	if err != nil {
		return nil, false, err
	}
	now := at.earliest
	for i := range leases {
		leases[i] = visible(leases[i], now)
	}
	return leases, more, nil
}

// SweepResult counts what a sweep saw and did.
type SweepResult struct {
	// Held is the number of leases with a live holder after the sweep.
	Held int
	// Expired is the number of leases the sweep freed.
	Expired int
}

// sweepBatch bounds how many expired leases one batched write of a sweep
// frees.
const sweepBatch = 1000

// Sweep frees every lease whose term has ended. With a store that writes
// in batches, the leases found expired are freed a batch at a time, each
// on the version the list read (a lease written since, renewed or freed,
// is decided again on what it left), so that when a cluster with
// thousands of leases dies, they are all freed within one sweep, and
// waiting clusters hear of it together.
func (s *Service) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	batch, batched := s.store.(store.LeaseBatchStore)
	var expired []store.Lease
	flush := func() error {
		if len(expired) == 0 {
			return nil
		}
		n, err := s.expireBatch(ctx, batch, expired)
		res.Expired += n
		expired = expired[:0]
		return err
	}
	err := s.eachLease(ctx, func(l store.Lease) error {
		at, err := s.now(ctx)
		if err != nil {
			return err
		}
		if batched && DecideExpire(l, at.earliest).Write {
			expired = append(expired, l)
			if len(expired) < sweepBatch {
				return nil
			}
			return flush()
		}
		d, err := s.updateListed(ctx, l, func(cur store.Lease) Decision { return DecideExpire(cur, at.earliest) })
		switch {
		case err != nil:
			return err
		case d.Outcome == OutcomeExpired:
			res.Expired++
		case d.Next.Holder != "":
			res.Held++
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	return res, flush()
}

// expireBatch frees leases, each found expired as listed, in one batched
// write, and reports how many it freed. A lease whose compare-and-swap
// lost (written since it was listed) goes through updateListed, which
// reads it again.
func (s *Service) expireBatch(ctx context.Context, batch store.LeaseBatchStore, listed []store.Lease) (int, error) {
	at, err := s.now(ctx)
	if err != nil {
		return 0, err
	}
	decide := func(cur store.Lease) Decision { return DecideExpire(cur, at.earliest) }
	// Expired when listed, and time only moves on; a store clock whose
	// bounds moved back is the exception, and its leases stay as they are.
	listed = slices.DeleteFunc(slices.Clone(listed), func(l store.Lease) bool { return !decide(l).Write })
	if len(listed) == 0 {
		return 0, nil
	}
	writes := make([]store.Lease, len(listed))
	for i, l := range listed {
		d := decide(l)
		writes[i] = d.Next
		writes[i].Ended = s.record(d)
	}
	written, errs, err := batch.PutLeases(ctx, writes)
	if err != nil {
		return 0, fmt.Errorf("expire %d leases: %w", len(listed), err)
	}
	freed := 0
	for i, l := range listed {
		key := leaseapi.Key{Namespace: l.Namespace, Name: l.Name}
		switch {
		case errs[i] == nil:
			if decide(l).Outcome == OutcomeExpired {
				freed++ // not a reservation that ran out
			}
			written[i].Ended = nil
			s.changes.notify(key)
			if changed(l, written[i]) {
				s.changeLog.add(written[i])
			}
		case errors.Is(errs[i], store.ErrConflict):
			d, err := s.updateListed(ctx, l, decide)
			if err != nil {
				return freed, err
			}
			if d.Outcome == OutcomeExpired {
				freed++
			}
		default:
			return freed, fmt.Errorf("lease %s: %w", key, errs[i])
		}
	}
	return freed, nil
}

// record is the ended term a decision's write records with it: none when
// the write ends no term or the history keeps none.
func (s *Service) record(d Decision) *store.EndedTerm {
	if d.Ended == nil || s.historyTerms == 0 {
		return nil
	}
	return &store.EndedTerm{Term: *d.Ended, Keep: s.historyTerms}
}

// GrantGrace gives every current holder one full TTL from now to renew. Call
// it once when the server starts, before serving.
func (s *Service) GrantGrace(ctx context.Context) (int, error) {
	graced := 0
	err := s.eachLease(ctx, func(l store.Lease) error {
		at, err := s.now(ctx)
		if err != nil {
			return err
		}
		// A full TTL past the latest the clock may show: grace only delays.
		d, err := s.updateListed(ctx, l, func(cur store.Lease) Decision { return DecideGrace(cur, at.latest) })
		if d.Outcome == OutcomeGraced {
			graced++
		}
		return err
	})
	return graced, err
}

// updateListed applies decide to a lease as a list returned it. Only when
// that record calls for a write does it go through the compare-and-swap
// loop, which reads the lease again: a sweep of many quiet leases costs one
// list, not a read per lease.
func (s *Service) updateListed(ctx context.Context, l store.Lease, decide func(store.Lease) Decision) (Decision, error) {
	if d := decide(l); !d.Write {
		return d, nil
	}
	return s.updateLease(ctx, leaseapi.Key{Namespace: l.Namespace, Name: l.Name}, func(cur store.Lease) (Decision, error) {
		return decide(cur), nil
	})
}

// eachLease calls fn for every stored lease, a page at a time.
func (s *Service) eachLease(ctx context.Context, fn func(store.Lease) error) error {
	const pageSize = 500
	opts := store.ListOptions{Limit: pageSize}
	for {
		page, more, err := s.store.ListLeases(ctx, opts)
		if err != nil {
			return fmt.Errorf("list leases: %w", err)
		}
		for _, l := range page {
			if err := fn(l); err != nil {
				return err
			}
		}
		if !more || len(page) == 0 {
			return nil
		}
		last := page[len(page)-1]
		opts.After = leaseapi.Key{Namespace: last.Namespace, Name: last.Name}.String()
	}
}

func (s *Service) updateLease(ctx context.Context, key leaseapi.Key, decide func(store.Lease) (Decision, error)) (Decision, error) {
	var (
		d    Decision
		prev store.Lease // the record d was decided on
	)
	err := compareAndSwap(ctx,
		func(ctx context.Context) (store.Lease, error) {
			cur, err := s.store.GetLease(ctx, key.Namespace, key.Name)
			if errors.Is(err, store.ErrNotFound) {
				return store.Lease{Namespace: key.Namespace, Name: key.Name}, nil
			}
			return cur, err
		},
		func(cur store.Lease) (store.Lease, bool, error) {
			var err error
			prev = cur
			d, err = decide(cur)
			return d.Next, d.Write, err
		},
		func(ctx context.Context, next store.Lease) error {
			next.Ended = s.record(d)
			var err error
			d.Next, err = s.store.PutLease(ctx, next)
			d.Next.Ended = nil
			return err
		})
	if err != nil {
		return d, fmt.Errorf("lease %s: %w", key, err)
	}
	if d.Write {
		s.changes.notify(key)
		if changed(prev, d.Next) {
			s.changeLog.add(d.Next)
		}
	}
	return d, nil
}

// compareAndSwap reads, decides and writes until a write lands, the decision
// is to write nothing, or something other than a lost race fails.
func compareAndSwap[T any](
	ctx context.Context,
	get func(context.Context) (T, error),
	decide func(T) (next T, write bool, err error),
	put func(context.Context, T) error,
) error {
	for range casAttempts {
		cur, err := get(ctx)
		if err != nil {
			return err
		}
		next, write, err := decide(cur)
		if err != nil || !write {
			return err
		}
		if err := put(ctx, next); !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("gave up after %d attempts: %w", casAttempts, store.ErrConflict)
}

func (s *Service) checkNotCordoned(ctx context.Context, holder string) error {
	c, err := s.store.GetCluster(ctx, leaseapi.HolderCluster(holder))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("get cluster %s: %w", leaseapi.HolderCluster(holder), err)
	case c.Cordoned:
		return fmt.Errorf("%w: %s may not acquire leases until uncordoned", ErrCordoned, c.ID)
	}
	return nil
}

// RegisterCluster registers a cluster or records its heartbeat. A different
// fingerprint is refused while the current registration is live.
func (s *Service) RegisterCluster(ctx context.Context, id string, reg leaseapi.ClusterRegistration) (store.Cluster, error) {
	at, err := s.now(ctx)
	if err != nil {
		return store.Cluster{}, err
	}
	now := at.earliest
	var out store.Cluster
	err = compareAndSwap(ctx,
		func(ctx context.Context) (store.Cluster, error) {
			c, err := s.store.GetCluster(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				return store.Cluster{ID: id, RegisteredAt: now}, nil
			}
			return c, err
		},
		func(cur store.Cluster) (store.Cluster, bool, error) {
			if cur.Fingerprint != "" && cur.Fingerprint != reg.Fingerprint && s.healthy(cur, now) {
				return cur, false, fmt.Errorf("%w (fingerprint %q, last seen %s)", ErrFingerprintConflict, cur.Fingerprint, cur.LastSeen.Format(time.RFC3339))
			}
			next := cur
			if next.Fingerprint != reg.Fingerprint {
				next.RegisteredAt = now
			}
			next.Fingerprint = reg.Fingerprint
			next.AgentVersion = reg.AgentVersion
			next.Labels = maps.Clone(reg.Labels)
			next.LastSeen = now
			return next, true, nil
		},
		func(ctx context.Context, next store.Cluster) error {
			var err error
			out, err = s.store.PutCluster(ctx, next)
			return err
		})
	if err != nil {
		return store.Cluster{}, fmt.Errorf("register cluster %s: %w", id, err)
	}
	return out, nil
}

// SetCordoned cordons or uncordons a registered cluster.
func (s *Service) SetCordoned(ctx context.Context, id string, cordoned bool) (store.Cluster, error) {
	var out store.Cluster
	err := compareAndSwap(ctx,
		func(ctx context.Context) (store.Cluster, error) { return s.store.GetCluster(ctx, id) },
		func(cur store.Cluster) (store.Cluster, bool, error) {
			out = cur
			next := cur
			next.Cordoned = cordoned
			return next, cur.Cordoned != cordoned, nil
		},
		func(ctx context.Context, next store.Cluster) error {
			var err error
			out, err = s.store.PutCluster(ctx, next)
			return err
		})
	if err != nil {
		return store.Cluster{}, fmt.Errorf("set cordon of cluster %s: %w", id, err)
	}
	return out, nil
}

// ClusterStatus is a registration with what the service derives from it.
type ClusterStatus struct {
	store.Cluster
	Healthy    bool
	LeasesHeld int
}

// Clusters lists every registered cluster with its health and the number of
// leases its holders hold.
func (s *Service) Clusters(ctx context.Context) ([]ClusterStatus, error) {
	clusters, err := s.store.ListClusters(ctx)
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	at, err := s.now(ctx)
	if err != nil {
		return nil, err
	}
	now := at.earliest
	held := map[string]int{}
	err = s.eachLease(ctx, func(l store.Lease) error {
		if l.Held(now) {
			held[leaseapi.HolderCluster(l.Holder)]++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]ClusterStatus, 0, len(clusters))
	for _, c := range clusters {
		out = append(out, ClusterStatus{Cluster: c, Healthy: s.healthy(c, now), LeasesHeld: held[c.ID]})
	}
	return out, nil
}

func (s *Service) healthy(c store.Cluster, now time.Time) bool {
	return now.Sub(c.LastSeen) < s.clusterTTL
}
