package reconciler

import (
	"context"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

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

// Start runs the reconciler's long polls for as long as ctx lasts: the
// manager starts it (SetupWithManager adds it, so it runs on the leader
// only), and fleet mode starts it for each member cluster, for as long as
// the cluster is a member. No long poll runs before Start or after ctx ends.
//
// A BerthLease reconciled before Start found no context for its long poll,
// so Start wakes every BerthLease it remembers: the next reconcile starts
// the poll of each that still waits.
func (r *BerthLeaseReconciler) Start(ctx context.Context) error {
	r.mu.Lock()
	r.polls = ctx
	var early []types.NamespacedName
	for _, m := range r.memory {
		if !slices.Contains(early, m.name) {
			early = append(early, m.name)
		}
	}
	r.mu.Unlock()
	if r.Wake != nil {
		for _, name := range early {
			r.Wake(ctx, name)
		}
	}
	<-ctx.Done()
	return nil
}

// pollContext is the context long polls run under, nil before Start.
func (r *BerthLeaseReconciler) pollContext() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.polls
}

// watch makes sure a long poll runs for a BerthLease this cluster waits for,
// and stops it once the cluster holds or gives up the lease. A change wakes
// the BerthLease's reconcile through Wake.
func (r *BerthLeaseReconciler) watch(ctx context.Context, bl *berthv1alpha1.BerthLease, mem *memory, waiting bool) {
	if !waiting {
		mem.stopWatching()
		return
	}
	lw, ok := r.LeaseClient.(LeaseWatcher)
	base := r.pollContext()
	if !ok || r.Wake == nil || base == nil || base.Err() != nil || mem.stopWatch != nil {
		return
	}
	wctx, cancel := context.WithCancel(base)
	mem.stopWatch = cancel
	name := types.NamespacedName{Namespace: bl.Namespace, Name: bl.Name}
	go r.longPoll(wctx, logr.FromContextOrDiscard(ctx), lw, name, bl.EffectiveLeaseName(), mem.observed.Holder, mem.observed.FencingToken)
}

// longPoll waits for the lease to change from (holder, token), then wakes
// the reconcile and ends; the reconcile starts a new one if still waiting.
func (r *BerthLeaseReconciler) longPoll(ctx context.Context, log logr.Logger, lw LeaseWatcher, bl types.NamespacedName, lease, holder string, token int32) {
	for ctx.Err() == nil {
		l, err := lw.WatchLease(ctx, bl.Namespace, lease, holder, token, watchWait)
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
			r.Wake(ctx, bl)
			return
		}
	}
}

// stopWatching ends the BerthLease's long poll, if one runs.
func (m *memory) stopWatching() {
	if m.stopWatch != nil {
		m.stopWatch()
		m.stopWatch = nil
	}
}

// Holding counts the BerthLeases whose last reconcile ended keeping a term,
// or a token to recover or release: what the agent knows this cluster may
// still hold at the lease API. Fleet mode reads it before it lets a leaving
// cluster go.
func (r *BerthLeaseReconciler) Holding() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.holding)
}
