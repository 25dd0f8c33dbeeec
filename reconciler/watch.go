package reconciler

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
)

// LeaseWatcher is what a LeaseClient may also offer: a long poll that
// answers when a lease's holder or token change. With it, a waiting cluster
// takes over a released lease at once instead of at its next poll.
type LeaseWatcher interface {
	WatchLease(ctx context.Context, namespace, name, holder string, fencingToken int32, wait time.Duration) (leaseapi.Lease, error)
}

// watchWait is how long one long poll waits.
const watchWait = 30 * time.Second

// watch makes sure a long poll runs for a BerthLease this cluster waits for,
// and stops it once the cluster holds or gives up the lease. A change wakes
// the BerthLease's reconcile through the controller's event channel.
func (r *BerthLeaseReconciler) watch(ctx context.Context, bl *berthv1alpha1.BerthLease, mem *memory, waiting bool) {
	lw, ok := r.LeaseClient.(LeaseWatcher)
	if !ok || r.wake == nil || r.isStopped() {
		return
	}
	if !waiting {
		if mem.stopWatch != nil {
			mem.stopWatch()
			mem.stopWatch = nil
		}
		return
	}
	if mem.stopWatch != nil {
		return
	}
	wctx, cancel := context.WithCancel(context.Background())
	mem.stopWatch = cancel
	obj := &berthv1alpha1.BerthLease{}
	obj.Namespace, obj.Name, obj.UID = bl.Namespace, bl.Name, bl.UID
	holder, token := mem.observed.Holder, mem.observed.FencingToken
	go r.longPoll(wctx, logr.FromContextOrDiscard(ctx), lw, obj, bl.EffectiveLeaseName(), holder, token)
}

// longPoll waits for the lease to change from (holder, token), then wakes
// the reconcile and ends; the reconcile starts a new one if still waiting.
func (r *BerthLeaseReconciler) longPoll(ctx context.Context, log logr.Logger, lw LeaseWatcher, obj *berthv1alpha1.BerthLease, name, holder string, token int32) {
	for ctx.Err() == nil {
		l, err := lw.WatchLease(ctx, obj.Namespace, name, holder, token, watchWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.V(1).Info("lease watch failed; polling continues", "error", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if l.Holder != holder || l.FencingToken != token {
			log.V(1).Info("lease changed", "holder", l.Holder, "token", l.FencingToken)
			select {
			case r.wake <- event.GenericEvent{Object: obj}:
			case <-ctx.Done():
			}
			return
		}
	}
}

// stopWatching ends the long poll of a forgotten BerthLease.
func (m *memory) stopWatching() {
	if m.stopWatch != nil {
		m.stopWatch()
		m.stopWatch = nil
	}
}

// WakeAll reconciles every BerthLease now: the fleet calls it when this
// cluster's membership changes (cordoned, uncordoned, refused), so that a
// handover starts at once rather than at the next heartbeat.
func (r *BerthLeaseReconciler) WakeAll(ctx context.Context) {
	if r.wake == nil {
		return
	}
	list := &berthv1alpha1.BerthLeaseList{}
	if err := r.List(ctx, list); err != nil {
		r.Log.Error(err, "list BerthLeases to wake them")
		return
	}
	for i := range list.Items {
		// The controller may not run here (not the leader): never wait long.
		select {
		case r.wake <- event.GenericEvent{Object: &list.Items[i]}:
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
			return
		}
	}
}

// Wakes returns the channel by which the reconciler asks for a BerthLease to
// be reconciled now (its long polls, WakeAll). SetupWithManager wires it
// into its controller; a caller that runs Reconcile under a controller of
// its own (fleet mode) forwards the events, and must call it before the
// first Reconcile.
func (r *BerthLeaseReconciler) Wakes() <-chan event.GenericEvent {
	if r.wake == nil {
		r.wake = make(chan event.GenericEvent)
	}
	return r.wake
}

// HandedOver reports whether this cluster holds no lease any more: no
// reconcile is running, none ended keeping a term or a token to recover or
// release, and no BerthLease's status (read from the API server) says held.
// Fleet mode waits for it before it lets a leaving cluster go. Call it only
// once Membership asks for a handover: a reconcile that starts after that
// acquires nothing, so once none runs, what is held can only shrink.
func (r *BerthLeaseReconciler) HandedOver(ctx context.Context) (bool, error) {
	if r.inflight.Load() > 0 {
		return false, nil
	}
	r.mu.Lock()
	holding := len(r.holding)
	r.mu.Unlock()
	if holding > 0 {
		return false, nil
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	list := &berthv1alpha1.BerthLeaseList{}
	if err := reader.List(ctx, list); err != nil {
		return false, fmt.Errorf("list BerthLeases: %w", err)
	}
	for i := range list.Items {
		if list.Items[i].Status.LeaseState == StateHeld {
			return false, nil
		}
	}
	return true, nil
}

// Stop ends every long poll and forgets every BerthLease, without touching
// a lease or a Pod: fleet mode calls it when a cluster leaves the agent,
// whose Pods are then out of its reach. No long poll starts afterwards.
func (r *BerthLeaseReconciler) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for uid, m := range r.memory {
		m.stopWatching()
		delete(r.memory, uid)
	}
	clear(r.holding)
}

func (r *BerthLeaseReconciler) isStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}
