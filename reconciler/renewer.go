package reconciler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// BatchRenewer is what a LeaseClient may also offer: every running term of
// a holder renewed in one request (leaseclient.Client.RenewBatch). With it,
// a cluster holding thousands of leases sends one request per heartbeat,
// and a running term needs no reconcile at all while it is renewed.
type BatchRenewer interface {
	RenewBatch(ctx context.Context, holder string, renewals []leaseclient.Renewal) ([]leaseclient.AcquireResult, error)
}

// batchSpec is how the renewer renews one BerthLease's running term: the
// lease, the holder, and the spec's timing as the reconcile last read it.
type batchSpec struct {
	namespace, lease, holder string
	ttl, heartbeat           time.Duration
}

// batchSpec is the spec to renew, or take over, lease in namespace as this
// observation's holder with its timing.
func (p *observation) batchSpec(namespace, lease string) *batchSpec {
	return &batchSpec{namespace: namespace, lease: lease, holder: p.holder, ttl: p.ttl, heartbeat: p.heartbeat}
}

// renewer is the state of the reconciler's batched renewals (renew).
type renewer struct {
	// mu orders hand-overs with the renewer's start and end: a term is
	// handed over only while the renewer runs, and when it stops it gives
	// every term back (giveBack). Lock order: mu, then the reconciler's
	// mu, then a memory's.
	mu sync.Mutex
	// running: the renewer runs (Start), so a running term is left to it.
	running atomic.Bool
	// off: the lease API offers no batched renewals; every term is renewed
	// by its reconcile, one request each.
	off atomic.Bool
	// kick makes the renewer look again at once: a term was handed to it.
	kick chan struct{}
	// cutoff and cut are the batch in flight's: the local deadline it is
	// cut at, and how to cut it sooner (preempt).
	cutoff time.Time
	cut    context.CancelFunc
}

// batching reports whether running terms are renewed in batches now.
func (r *BerthLeaseReconciler) batching() bool {
	_, ok := r.LeaseClient.(BatchRenewer)
	return ok && r.renewals.running.Load() && !r.renewals.off.Load()
}

// handOver gives a BerthLease's running term to the renewer at the end of
// a reconcile, or takes it back (spec nil): while the decision is to run
// its Pods, the renewer renews the term and wakes the BerthLease when it
// ends, is revoked, fails to renew, or reaches its local deadline; at any
// other time the reconcile renews the term itself.
//
// Every hand-over kicks the renewer, not only the first: it may have planned
// its next look while the memory held no term, or one past its deadline,
// and so not for the term the reconcile hands over now.
//
// It reports whether the renewer took the term: not when it does not run
// (any more), and then the reconcile renews the term itself.
func (r *BerthLeaseReconciler) handOver(mem *memory, spec *batchSpec) bool {
	r.renewals.mu.Lock()
	defer r.renewals.mu.Unlock()
	if !r.renewals.running.Load() || r.renewals.off.Load() {
		spec = nil
	}
	mem.mu.Lock()
	mem.batch = spec
	term := mem.tenure.term
	mem.mu.Unlock()
	if spec == nil {
		return false
	}
	r.preemptLocked(term)
	select {
	case r.renewals.kick <- struct{}{}:
	default:
	}
	return true
}

// preemptLocked cuts the batch in flight when term's deadline comes before
// the batch's cutoff: the renewer blocks on its batch, and must look at
// the new term by its deadline. renewals.mu is held.
func (r *BerthLeaseReconciler) preemptLocked(term *Term) {
	if term != nil && r.renewals.cut != nil && term.Deadline.Before(r.renewals.cutoff) {
		r.renewals.cut()
		r.renewals.cut = nil
	}
}

// giveBack ends the renewer: it stops taking terms, and every term it had
// goes back to its reconcile, woken to renew it on its own.
func (r *BerthLeaseReconciler) giveBack(ctx context.Context) {
	r.renewals.mu.Lock()
	r.renewals.running.Store(false)
	var names []types.NamespacedName
	r.mu.Lock()
	for _, m := range r.memory {
		m.mu.Lock()
		if m.batch != nil {
			m.batch = nil
			names = append(names, m.name)
		}
		m.mu.Unlock()
	}
	r.mu.Unlock()
	r.renewals.mu.Unlock()
	for _, name := range names {
		r.Wake(ctx, name)
	}
}

// renewIdle is how long the renewer sleeps with no term to renew: a term
// handed over kicks it awake anyway.
const renewIdle = time.Minute

// renew renews the running terms handed to it in batches, until ctx ends.
// A batch goes out when the first term's renewal is due, and carries every
// term due within half its heartbeat, so that the terms of a cluster fall
// into step and a heartbeat costs one request. Each answer is applied to
// the term's tenure exactly as a single renewal's (afterAnswer), measured
// from when the batch was sent; only news (a term lost, revoked, failing,
// or healthy again) wakes the BerthLease. So does a local deadline that
// passes without a renewal: its reconcile then stops the Pods.
func (r *BerthLeaseReconciler) renew(ctx context.Context) {
	br, ok := r.LeaseClient.(BatchRenewer)
	if !ok {
		return
	}
	r.renewals.running.Store(true)
	defer r.giveBack(ctx)
	log := r.Log.WithName("renewer")
	for {
		next := r.renewDue(ctx, br, log)
		if r.renewals.off.Load() {
			return
		}
		timer := time.NewTimer(max(next.Sub(r.Clock.Now()), time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-r.renewals.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// dueTerm is one term a batch renews.
type dueTerm struct {
	mem  *memory
	spec batchSpec
	term *Term
}

// renewDue sends the batches that are due, wakes the BerthLeases whose
// local deadline passed, and returns when to look next.
func (r *BerthLeaseReconciler) renewDue(ctx context.Context, br BatchRenewer, log logr.Logger) time.Time {
	now := r.Clock.Now()
	next := now.Add(renewIdle)
	var (
		due, early       []dueTerm
		anyDue           bool
		fenced           []types.NamespacedName
		earliestDeadline time.Time
	)
	r.mu.Lock()
	for _, m := range r.memory {
		m.mu.Lock()
		spec, term := m.batch, m.tenure.term
		switch {
		case spec == nil || term == nil:
		case !now.Before(term.Deadline):
			// Past the deadline: the reconcile stops the Pods, once told.
			if m.fenceWoken != term {
				m.fenceWoken = term
				fenced = append(fenced, m.name)
			}
		default:
			if earliestDeadline.IsZero() || term.Deadline.Before(earliestDeadline) {
				earliestDeadline = term.Deadline
			}
			next = earliest(next, term.Deadline)
			t := dueTerm{mem: m, spec: *spec, term: term}
			switch {
			case !now.Before(term.RenewDue):
				anyDue = true
				due = append(due, t)
			case !now.Before(term.RenewDue.Add(-spec.heartbeat / 2)):
				early = append(early, t)
				next = earliest(next, term.RenewDue)
			default:
				next = earliest(next, term.RenewDue)
			}
		}
		m.mu.Unlock()
	}
	r.mu.Unlock()
	for _, name := range fenced {
		r.Wake(ctx, name)
	}
	if !anyDue {
		return next
	}
	ctx, cancel, leading := r.whileLeading(ctx)
	defer cancel()
	if !leading {
		return r.Clock.Now().Add(leadershipRetry)
	}
	byHolder := map[string][]dueTerm{}
	for _, t := range append(due, early...) {
		byHolder[t.spec.holder] = append(byHolder[t.spec.holder], t)
	}
	for holder, terms := range byHolder {
		r.renewBatch(ctx, br, log, holder, terms, earliestDeadline)
	}
	return r.Clock.Now()
}

// renewBatch renews terms for holder in one request (the client splits it
// at the lease API's limit), never past the earliest local deadline of any
// running term, and applies each answer.
func (r *BerthLeaseReconciler) renewBatch(ctx context.Context, br BatchRenewer, log logr.Logger, holder string, terms []dueTerm, deadline time.Time) {
	// One renewal per lease: two BerthLeases naming one lease share its
	// term for a moment (the newer is not yet seen as shadowed), and the
	// lease API refuses a batch that names a lease twice.
	var renewals []leaseclient.Renewal
	index := map[leaseclient.Renewal]int{}
	of := make([]int, len(terms))
	for i, t := range terms {
		rn := leaseclient.Renewal{Namespace: t.spec.namespace, Name: t.spec.lease, FencingToken: t.term.Token, TTL: t.spec.ttl}
		key := leaseclient.Renewal{Namespace: rn.Namespace, Name: rn.Name}
		j, seen := index[key]
		switch {
		case !seen:
			j = len(renewals)
			index[key] = j
			renewals = append(renewals, rn)
		case rn.FencingToken != renewals[j].FencingToken:
			// Not the same term: one of them is stale. Left out, it stays
			// due, and fences at its deadline if it is never renewed.
			of[i] = -1
			continue
		default:
			// One term: renewed for the longest TTL asked, so that it
			// lasts at least as long as each BerthLease reckons.
			renewals[j].TTL = max(renewals[j].TTL, rn.TTL)
		}
		of[i] = j
	}
	cctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	cctx, cancelAtDeadline := context.WithDeadline(cctx, r.wallDeadline(deadline))
	defer cancelAtDeadline()
	preempted, cut := context.WithCancel(cctx)
	defer cut()
	r.renewals.mu.Lock()
	r.renewals.cutoff, r.renewals.cut = deadline, cut
	r.renewals.mu.Unlock()
	sent := r.Clock.Now()
	results, err := br.RenewBatch(preempted, holder, renewals)
	now := r.Clock.Now()
	r.renewals.mu.Lock()
	r.renewals.cut = nil
	r.renewals.mu.Unlock()
	observeBatch(r.ClusterIdentity, sent, now, len(renewals), err)
	switch {
	case err != nil && preempted.Err() != nil && cctx.Err() == nil:
		// Cut for a term handed over meanwhile whose deadline comes
		// first: nothing is applied (each term keeps the deadline it
		// had, and is still due), and the renewer looks again at once.
		log.V(1).Info("batched renewal cut for a term with an earlier deadline", "leases", len(terms))
		return
	case errors.Is(err, leaseclient.ErrNotSupported):
		// A lease API of an earlier release: every term goes back to its
		// reconcile (giveBack, as the renewer ends), which renews it on
		// its own.
		log.Info("the lease API offers no batched renewals; renewing each lease on its own")
		r.renewals.off.Store(true)
		return
	case err == nil && len(results) != len(renewals):
		err = errors.New("batched renewal answered a different number of leases than it was sent")
	case ctx.Err() != nil:
		return
	}
	if err != nil {
		log.Error(err, "batched renewal failed", "leases", len(renewals))
	}
	for i, t := range terms {
		if of[i] < 0 {
			continue
		}
		var res leaseclient.AcquireResult
		if err == nil {
			res = results[of[i]]
		}
		if r.applyRenewal(log, t, res, err, sent, now) {
			r.Wake(ctx, t.mem.name)
		}
	}
}

// applyRenewal applies one answer of a batch to the term's tenure, if the
// term is still the tenure's (a reconcile that renewed, released or let go
// of it since has the newer word), and reports whether it is news for the
// reconcile: the term lost or revoked, or renewals failing or healthy again.
func (r *BerthLeaseReconciler) applyRenewal(log logr.Logger, t dueTerm, res leaseclient.AcquireResult, err error, sent, now time.Time) bool {
	req := request{call: CallRenew, holder: t.spec.holder, token: t.term.Token, ttl: t.spec.ttl, heartbeat: t.spec.heartbeat, sent: sent}
	m := t.mem
	m.mu.Lock()
	if m.tenure.term != t.term || m.batch == nil {
		m.mu.Unlock()
		return false
	}
	failing := m.tenure.apiErr != nil
	var o outcome
	m.tenure, o = m.tenure.afterAnswer(req, res, err, now)
	healthy := m.tenure.apiErr == nil
	// A batch cut at the deadline: the reconcile stops the Pods now, not
	// at the renewer's next look.
	fenced := m.tenure.term != nil && !now.Before(m.tenure.term.Deadline) && m.fenceWoken != m.tenure.term
	if fenced {
		m.fenceWoken = m.tenure.term
	}
	m.mu.Unlock()

	ns, name := m.name.Namespace, m.name.Name
	switch o.change {
	case changeRevoked:
		renewals.WithLabelValues(r.ClusterIdentity, "revoked").Inc()
		log.Info("lease revoked: stopping the Pods, then releasing", "berthLease", m.name, "token", o.token, "expiresAt", o.expiresAt)
	case changeLost:
		renewals.WithLabelValues(r.ClusterIdentity, "lost").Inc()
		log.Info("lease lost", "berthLease", m.name, "token", o.token, "currentHolder", o.holder)
	case changeFailed:
		renewals.WithLabelValues(r.ClusterIdentity, "error").Inc()
	default:
		renewals.WithLabelValues(r.ClusterIdentity, "renewed").Inc()
		renewTime.WithLabelValues(r.ClusterIdentity, ns, name).Set(float64(time.Now().Add(sent.Sub(now)).UnixMilli()) / 1000)
		deadlineRemaining.WithLabelValues(r.ClusterIdentity, ns, name).Set(max(0, LocalValidity(t.spec.ttl)-now.Sub(sent)).Seconds())
	}
	return fenced || o.change == changeLost || o.change == changeRevoked || failing == healthy
}
