package reconciler

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// LeaseStreamer is what a LeaseClient may also offer: one stream of the
// lease API's lease changes (leaseclient.Client.WatchLeases). With it, a
// cluster waiting for thousands of leases that other clusters hold keeps
// one connection, and looks at a lease only when it changes, instead of
// asking for each lease at every heartbeat.
type LeaseStreamer interface {
	WatchLeases(ctx context.Context, namespaces []string, handle func(leaseclient.LeaseEvent), connected func(bool)) error
}

// streamBackstop is how often a waiting BerthLease looks at its lease
// while the change stream is connected, in case a change was missed
// anyway; a fifth of it is added at random so that thousands of them
// spread out.
const streamBackstop = 10 * time.Minute

// stream is the state of the reconciler's change stream (follow).
type stream struct {
	// up: the stream is connected, so a waiting BerthLease needs no poll.
	up atomic.Bool
	mu sync.Mutex
	// byKey indexes the remembered BerthLeases by the lease they name.
	byKey map[string]map[*memory]struct{}
}

// Start runs, for as long as ctx lasts, what the reconciler does between
// reconciles: the batched renewals of its running terms (renew), the
// change stream that wakes its waiting BerthLeases (follow), and the
// takeover of the leases it reports free (acquire). The manager
// starts it (SetupWithManager adds it, so it runs on the leader only), and
// fleet mode starts it for each member cluster, for as long as the cluster
// is a member.
//
// A BerthLease reconciled before Start renewed its term on its own and
// polled, so Start wakes every BerthLease it remembers.
func (r *BerthLeaseReconciler) Start(ctx context.Context) error {
	r.defaults()
	var wg sync.WaitGroup
	wg.Go(func() { r.renew(ctx) })
	wg.Go(func() { r.acquire(ctx) })
	wg.Go(func() { r.follow(ctx) })
	for _, name := range r.remembered(func(tenure) bool { return true }) {
		r.Wake(ctx, name)
	}
	wg.Wait()
	return nil
}

// follow follows the lease API's change stream until ctx ends, if the
// client offers one.
func (r *BerthLeaseReconciler) follow(ctx context.Context) {
	ls, ok := r.LeaseClient.(LeaseStreamer)
	if !ok || r.Wake == nil {
		return
	}
	log := r.Log.WithName("changes")
	for {
		err := ls.WatchLeases(ctx, nil,
			func(ev leaseclient.LeaseEvent) { r.leaseChanged(ctx, ev) },
			func(up bool) { r.streamConnected(ctx, up) })
		r.changes.up.Store(false)
		retry := streamRetry
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, leaseclient.ErrNotSupported):
			// A lease API of an earlier release; it may be upgraded.
			log.Info("the lease API offers no change stream; waiting clusters poll at every heartbeat")
			retry = streamBackstop
		default:
			// Refused (a token being rotated, say): tried again.
			log.Error(err, "the lease API's change stream ended; waiting clusters poll at every heartbeat until it is back")
			r.wakeWaiting(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// streamRetry is how soon a change stream that ended with an error is
// opened again (the client itself reconnects after breaks).
const streamRetry = 30 * time.Second

// streamConnected records whether the change stream is connected. When it
// breaks, every waiting BerthLease is woken to poll until it is back; once
// it is back, its first event (a reset) wakes them again.
func (r *BerthLeaseReconciler) streamConnected(ctx context.Context, up bool) {
	if r.changes.up.Swap(up) && !up {
		r.wakeWaiting(ctx)
	}
}

// leaseChanged wakes the BerthLeases a change concerns: those naming the
// changed lease whose memory does not already know what the change says.
// A reset (changes may have been missed) wakes every waiting BerthLease.
func (r *BerthLeaseReconciler) leaseChanged(ctx context.Context, ev leaseclient.LeaseEvent) {
	if ev.Reset {
		leaseEvents.WithLabelValues(r.ClusterIdentity, "reset").Inc()
		r.wakeWaiting(ctx)
		return
	}
	leaseEvents.WithLabelValues(r.ClusterIdentity, "changed").Inc()
	key := leaseapi.Key{Namespace: ev.Lease.Namespace, Name: ev.Lease.Name}.String()
	r.changes.mu.Lock()
	mems := make([]*memory, 0, len(r.changes.byKey[key]))
	for m := range r.changes.byKey[key] {
		mems = append(mems, m)
	}
	r.changes.mu.Unlock()
	for _, m := range mems {
		if !news(m.read(), ev.Lease) {
			continue
		}
		leaseEvents.WithLabelValues(r.ClusterIdentity, "woken").Inc()
		// A lease come free is taken over at once by the acquirer, which
		// then wakes the reconcile; anything else wakes it now.
		if ev.Lease.Holder != "" || !r.takeOver(m) {
			r.Wake(ctx, m.name)
		}
	}
}

// news reports whether l says something about the lease that the tenure
// does not know: another holder, token or revocation than its term's, or,
// without a term, than the lease API's last answer, or the end of a
// reservation that answer showed (a move's), so that a cluster it held
// back asks again at once.
func news(t tenure, l leaseapi.Lease) bool {
	if t.term != nil {
		return l.Holder != t.term.Holder || l.FencingToken != t.term.Token || l.Revoked != t.revoked
	}
	return l.Holder != t.observed.Holder || l.FencingToken != t.observed.FencingToken || l.Revoked != t.observed.Revoked ||
		!l.ReservedUntil.Equal(t.observed.ReservedUntil)
}

// wakeWaiting wakes every remembered BerthLease that holds no term.
func (r *BerthLeaseReconciler) wakeWaiting(ctx context.Context) {
	for _, name := range r.remembered(func(t tenure) bool { return t.term == nil }) {
		r.Wake(ctx, name)
	}
}

// remembered lists the names of the remembered BerthLeases whose tenure
// matches.
func (r *BerthLeaseReconciler) remembered(match func(tenure) bool) []types.NamespacedName {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[types.NamespacedName]bool{}
	var out []types.NamespacedName
	for _, m := range r.memory {
		if !seen[m.name] && match(m.read()) {
			seen[m.name] = true
			out = append(out, m.name)
		}
	}
	return out
}

// index adds a remembered BerthLease to the stream's index, or removes it.
func (r *BerthLeaseReconciler) index(m *memory, add bool) {
	r.changes.mu.Lock()
	defer r.changes.mu.Unlock()
	if r.changes.byKey == nil {
		r.changes.byKey = map[string]map[*memory]struct{}{}
	}
	set := r.changes.byKey[m.key]
	switch {
	case add && set == nil:
		r.changes.byKey[m.key] = map[*memory]struct{}{m: {}}
	case add:
		set[m] = struct{}{}
	default:
		delete(set, m)
		if len(set) == 0 {
			delete(r.changes.byKey, m.key)
		}
	}
}

// waitBackstop is when a waiting BerthLease looks at its lease again while
// the change stream is connected.
func waitBackstop() time.Duration {
	return streamBackstop + rand.N(streamBackstop/5)
}

// Holding counts the BerthLeases whose memory keeps a term, or a token to
// recover or release: what the agent knows this cluster may still hold at
// the lease API, including a term the acquirer took whose reconcile has not
// run yet. Fleet mode reads it before it lets a leaving cluster go.
func (r *BerthLeaseReconciler) Holding() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.memory {
		if m.read().holds() {
			n++
		}
	}
	return n
}
