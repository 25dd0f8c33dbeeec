package reconciler

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// wakes records the BerthLeases a reconciler wakes.
type wakes struct {
	mu    sync.Mutex
	names []string
}

func (w *wakes) wake(_ context.Context, n types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.names = append(w.names, n.Name)
}

// count is how many wake-ups there were since the last take.
func (w *wakes) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.names)
}

// take returns the names woken since the last take, sorted.
func (w *wakes) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.names
	w.names = nil
	slices.Sort(out)
	return out
}

// remember makes the reconciler remember a BerthLease named name that
// names lease, with tenure t.
func remember(r *BerthLeaseReconciler, name, lease string, t tenure) *memory {
	bl := &berthv1alpha1.BerthLease{Spec: berthv1alpha1.BerthLeaseSpec{LeaseName: lease}}
	bl.Namespace, bl.Name, bl.UID = "payments", name, types.UID("uid-"+name)
	m := r.memoryOf(bl)
	m.update(func(tenure) tenure { return t })
	return m
}

// TestChangeStreamWakesWhatItConcerns: a change of a lease wakes the
// BerthLeases that name it and do not already know what it says; a reset
// wakes every BerthLease that holds no term.
func TestChangeStreamWakesWhatItConcerns(t *testing.T) {
	w := &wakes{}
	r := &BerthLeaseReconciler{Wake: w.wake}
	r.defaults()
	remember(r, "waiting", "exporter", with(tenure{started: true}, saw(granted(other, 3))))
	remember(r, "also-waiting", "exporter", with(tenure{started: true}, saw(granted(other, 3))))
	remember(r, "holding", "scheduler", holding(grantedTerm(5)))
	remember(r, "unrelated", "billing", with(tenure{started: true}, saw(granted(other, 9))))
	ctx := t.Context()
	lease := func(name, holder string, token int32, revoked bool) leaseclient.LeaseEvent {
		return leaseclient.LeaseEvent{Lease: leaseapi.Lease{Namespace: "payments", Name: name, Holder: holder, FencingToken: token, Revoked: revoked}}
	}
	steps := []struct {
		what string
		ev   leaseclient.LeaseEvent
		want []string
	}{
		{"a reset wakes every BerthLease without a term", leaseclient.LeaseEvent{Reset: true}, []string{"also-waiting", "unrelated", "waiting"}},
		{"what the waiting ones already know wakes nothing", lease("exporter", other, 3, false), nil},
		{"a release wakes the BerthLeases naming the lease", lease("exporter", "", 3, false), []string{"also-waiting", "waiting"}},
		{"the holder's own term wakes nothing", lease("scheduler", us, 5, false), nil},
		{"its revocation wakes the holder", lease("scheduler", us, 5, true), []string{"holding"}},
		{"a lease nobody here names wakes nothing", lease("unknown", other, 1, false), nil},
		{"another namespace's lease of the same name wakes nothing", leaseclient.LeaseEvent{Lease: leaseapi.Lease{Namespace: "billing", Name: "exporter"}}, nil},
	}
	for _, step := range steps {
		r.leaseChanged(ctx, step.ev)
		if diff := cmp.Diff(step.want, w.take()); diff != "" {
			t.Errorf("%s: woken (-want +got):\n%s", step.what, diff)
		}
	}

	r.changes.up.Store(true)
	r.streamConnected(ctx, false)
	if diff := cmp.Diff([]string{"also-waiting", "unrelated", "waiting"}, w.take()); diff != "" {
		t.Errorf("a broken stream wakes the waiting BerthLeases to poll (-want +got):\n%s", diff)
	}
	r.forget("uid-waiting")
	r.leaseChanged(ctx, lease("exporter", other, 4, false))
	if diff := cmp.Diff([]string{"also-waiting"}, w.take()); diff != "" {
		t.Errorf("a forgotten BerthLease is not woken (-want +got):\n%s", diff)
	}
}

// TestWaitIntervalFollowsTheStream: a cluster waiting for another's lease
// only looks again at a backstop while the stream is connected, and at
// every heartbeat (or the holder's expiry) while it is not.
func TestWaitIntervalFollowsTheStream(t *testing.T) {
	r := &BerthLeaseReconciler{}
	p := &observation{holder: us, heartbeat: 10 * time.Second}
	waiting := with(tenure{started: true}, saw(granted(other, 3)))
	if got := r.waitInterval(p, waiting); got != p.heartbeat {
		t.Errorf("without the stream a waiting cluster looks again after %v, want a heartbeat", got)
	}
	r.changes.up.Store(true)
	if got := r.waitInterval(p, waiting); got < streamBackstop || got > streamBackstop*6/5 {
		t.Errorf("with the stream a waiting cluster looks again after %v, want the backstop of %v plus up to a fifth", got, streamBackstop)
	}
	failing := with(waiting, func(t *tenure) { t.apiErr = errors.New("unreachable") })
	if got := r.waitInterval(p, failing); got != retryInterval(p.heartbeat) {
		t.Errorf("after a failed call a waiting cluster retries after %v, want %v", got, retryInterval(p.heartbeat))
	}
}

// TestFailureBackoffStaysWithinTheStopPoll: however often a BerthLease's
// reconcile fails, it is retried within stopPollInterval, so that it still
// renews and stops its Pods at the local deadline.
func TestFailureBackoffStaysWithinTheStopPoll(t *testing.T) {
	limiter := failureBackoff()
	req := mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "payments", Name: "exporter"}}}
	var longest time.Duration
	for range 100 {
		longest = max(longest, limiter.When(req))
	}
	if longest != stopPollInterval {
		t.Errorf("after 100 failures a reconcile is retried after %v, want %v at the latest (and reached)", longest, stopPollInterval)
	}
	limiter.Forget(req)
	if first := limiter.When(req); first > 10*time.Millisecond {
		t.Errorf("the first retry after a success waits %v, want a few milliseconds", first)
	}
}

// TestReservationIsAWait: an acquire refused by a move's reservation (the
// lease free, reserved for another cluster) is waited out, not retried in a
// loop: the cluster looks again when the reservation runs out (or at a
// heartbeat, if sooner), and the stream's report of its end wakes it at once.
func TestReservationIsAWait(t *testing.T) {
	w := &wakes{}
	r := &BerthLeaseReconciler{Wake: w.wake}
	r.defaults()
	p := &observation{holder: us, heartbeat: 10 * time.Second}
	until := time.Now().Add(3 * time.Second)
	refused := leaseapi.AcquireResponse{FencingToken: 3, Reservation: leaseapi.Reservation{ReservedFor: other, ReservedUntil: until},
		Message: "lease is reserved for cluster " + other}
	waiting := with(tenure{started: true}, saw(refused))
	if got := r.waitInterval(p, waiting); got < 2*time.Second || got > 3100*time.Millisecond {
		t.Errorf("a cluster refused by a reservation looks again after %v, want about when it runs out (3s)", got)
	}
	if got := r.waitInterval(p, with(waiting, func(t *tenure) { t.observed.ReservedUntil = time.Now().Add(time.Hour) })); got != p.heartbeat {
		t.Errorf("a long reservation: looks again after %v, want a heartbeat", got)
	}
	remember(r, "waiting", "exporter", waiting)
	ctx := t.Context()
	r.leaseChanged(ctx, leaseclient.LeaseEvent{Lease: leaseapi.Lease{Namespace: "payments", Name: "exporter", FencingToken: 3,
		Reservation: leaseapi.Reservation{ReservedFor: other, ReservedUntil: until}}})
	if got := w.take(); len(got) != 0 {
		t.Errorf("the reservation it knows woke %v", got)
	}
	r.leaseChanged(ctx, leaseclient.LeaseEvent{Lease: leaseapi.Lease{Namespace: "payments", Name: "exporter", FencingToken: 3}})
	if diff := cmp.Diff([]string{"waiting"}, w.take()); diff != "" {
		t.Errorf("the end of the reservation: woken (-want +got):\n%s", diff)
	}
}
