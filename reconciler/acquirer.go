package reconciler

import (
	"context"
	"sync"
	"sync/atomic"
)

// acquirers is how many acquisitions the acquirer has in flight at once;
// acquireQueue is how many BerthLeases may wait for one (beyond it, their
// reconciles acquire).
const (
	acquirers    = 32
	acquireQueue = 1 << 14
)

// acquirer takes over leases as soon as the change stream reports them
// free, outside the reconciles (takeover). A cluster that waits for
// thousands of leases held by a cluster that dies sees them all freed
// within a second or two; acquiring each through its reconcile would pace
// the takeover by the API server's rate limit (every reconcile writes
// status), so the last lease would move many seconds after the first.
type acquirer struct {
	// running: the acquirer runs (Start), so takeOver may queue.
	running atomic.Bool
	queue   chan *memory
}

// waitSpecFor is how the acquirer may take bl's lease over after this
// reconcile: while the cluster waits for another holder with nothing held,
// nothing running and nothing asking it to yield; nil otherwise.
func (r *BerthLeaseReconciler) waitSpecFor(p *observation, mem *memory, d Decision) *batchSpec {
	f := p.facts
	t := p.tenure
	if f.Term != nil || f.mustYield() || f.RecoverToken > 0 || f.ReleaseToken > 0 || f.RunningPods > 0 || f.PodsUnknown ||
		d.Call != CallAcquire || d.Pods != PodsNone || mem.gone || mem.superseded ||
		t.apiErr != nil || t.observed.Holder == "" || t.observed.Holder == p.holder {
		return nil
	}
	return p.batchSpec(mem.name.Namespace, mem.last.EffectiveLeaseName())
}

// setWaiting records, at the end of a reconcile, whether the acquirer may
// take the BerthLease's lease over (spec), or not (nil).
func (m *memory) setWaiting(spec *batchSpec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waiting = spec
}

// takeOver hands a BerthLease whose lease the stream reports free to the
// acquirer, and reports whether it did: only a BerthLease whose last
// reconcile left it waiting, and only while the acquirer runs and has room.
func (r *BerthLeaseReconciler) takeOver(m *memory) bool {
	m.mu.Lock()
	waiting := m.waiting != nil && m.tenure.term == nil
	m.mu.Unlock()
	if !waiting || !r.acquisitions.running.Load() {
		return false
	}
	select {
	case r.acquisitions.queue <- m:
		return true
	default:
		return false
	}
}

// acquire runs the acquirer until ctx ends.
func (r *BerthLeaseReconciler) acquire(ctx context.Context) {
	r.acquisitions.running.Store(true)
	defer r.acquisitions.running.Store(false)
	var wg sync.WaitGroup
	for range acquirers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-r.acquisitions.queue:
					r.acquireFor(ctx, m)
				}
			}
		})
	}
	wg.Wait()
}

// acquireFor sends the acquire a waiting BerthLease's reconcile would send,
// applies the answer with the same transition (afterAnswer) if the
// BerthLease still waits as it did (a reconcile since has the newer word),
// hands a term it got to the renewer, and wakes the reconcile, which writes
// status and ungates the Pods as ever. Acquiring runs no Pod: only a
// reconcile does that, on a term its facts show.
func (r *BerthLeaseReconciler) acquireFor(ctx context.Context, m *memory) {
	defer r.Wake(ctx, m.name)
	m.mu.Lock()
	spec := m.waiting
	ready := spec != nil && m.tenure.term == nil && !m.tenure.holds()
	m.mu.Unlock()
	if !ready || m.holdingOff(r.Clock.Now()) {
		return
	}
	if r.Membership != nil {
		if reason, _ := r.Membership(); reason != "" {
			return // cordoned, refused or leaving: the reconcile yields
		}
	}
	ctx, stop, leading := r.whileLeading(ctx)
	defer stop()
	if !leading {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	req := request{call: CallAcquire, holder: spec.holder, ttl: spec.ttl, heartbeat: spec.heartbeat, sent: r.Clock.Now()}
	res, err := r.LeaseClient.Acquire(cctx, spec.namespace, spec.lease, spec.holder, spec.ttl)
	now := r.Clock.Now()
	observeCall(CallAcquire, req.sent, now, err)
	if err != nil {
		// The reconcile it wakes tries again, and records the failure.
		r.Log.V(1).Info("takeover failed", "berthLease", m.name, "error", err.Error())
		return
	}
	m.mu.Lock()
	if m.waiting != spec || m.tenure.term != nil || m.tenure.holds() {
		// The reconcile decided otherwise meanwhile (the BerthLease is
		// deleted, cordoned, or acquired already). A term granted now is
		// left to expire: releasing it from here could free a term that a
		// BerthLease of the same lease runs under.
		m.mu.Unlock()
		if res.Acquired {
			r.Log.Info("a takeover came too late: its term is left to expire", "berthLease", m.name, "token", res.FencingToken)
		}
		return
	}
	m.tenure, _ = m.tenure.afterAnswer(req, res, nil, now)
	granted := m.tenure.term != nil
	m.waiting = nil
	m.mu.Unlock()
	if granted {
		// Renewed from now on, even before its reconcile runs.
		r.handOver(m, spec)
	}
}
