package reconciler

import (
	"context"
	"errors"
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

// renewer is the state of the reconciler's batched renewals (renew).
type renewer struct {
	// running: the renewer runs (Start), so a running term is left to it.
	running atomic.Bool
	// off: the lease API offers no batched renewals; every term is renewed
	// by its reconcile, one request each.
	off atomic.Bool
	// kick makes the renewer look again at once: a term was handed to it.
	kick chan struct{}
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
func (r *BerthLeaseReconciler) handOver(mem *memory, spec *batchSpec) {
	mem.mu.Lock()
	mem.batch = spec
	mem.mu.Unlock()
	if spec != nil {
		select {
		case r.renewals.kick <- struct{}{}:
		default:
		}
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
	defer r.renewals.running.Store(false)
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
	renewals := make([]leaseclient.Renewal, len(terms))
	for i, t := range terms {
		renewals[i] = leaseclient.Renewal{Namespace: t.spec.namespace, Name: t.spec.lease, FencingToken: t.term.Token, TTL: t.spec.ttl}
	}
	cctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	cctx, cancelAtDeadline := context.WithDeadline(cctx, r.wallDeadline(deadline))
	defer cancelAtDeadline()
	sent := r.Clock.Now()
	results, err := br.RenewBatch(cctx, holder, renewals)
	now := r.Clock.Now()
	observeBatch(r.ClusterIdentity, sent, now, len(terms), err)
	switch {
	case errors.Is(err, leaseclient.ErrNotSupported):
		// A lease API of an earlier release: every term goes back to its
		// reconcile, which renews it on its own.
		log.Info("the lease API offers no batched renewals; renewing each lease on its own")
		r.renewals.off.Store(true)
		for _, t := range terms {
			r.Wake(ctx, t.mem.name)
		}
		return
	case err == nil && len(results) != len(terms):
		err = errors.New("batched renewal answered a different number of leases than it was sent")
	case ctx.Err() != nil:
		return
	}
	if err != nil {
		log.Error(err, "batched renewal failed", "leases", len(terms))
	}
	for i, t := range terms {
		var res leaseclient.AcquireResult
		if err == nil {
			res = results[i]
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
