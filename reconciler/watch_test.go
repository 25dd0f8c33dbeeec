package reconciler

import (
	"context"
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

// watchingLeases answers every long poll with a change after it was asked,
// and fails every other call: only the long poll matters here.
type watchingLeases struct {
	LeaseClient
	mu      sync.Mutex
	watched []string
}

func (w *watchingLeases) WatchLease(ctx context.Context, _, name, _ string, token int32, _ time.Duration) (leaseapi.Lease, error) {
	w.mu.Lock()
	w.watched = append(w.watched, name)
	w.mu.Unlock()
	return leaseapi.Lease{Holder: "west", FencingToken: token + 1}, nil
}

// TestLongPollWaitsForStart: a BerthLease that waits before Start runs no
// long poll (there is no context for it yet), but Start wakes it, so that
// its next reconcile starts one; a long poll started after Start wakes its
// BerthLease when the lease changes.
func TestLongPollWaitsForStart(t *testing.T) {
	woken := make(chan types.NamespacedName, 4)
	leases := &watchingLeases{}
	r := &BerthLeaseReconciler{LeaseClient: leases, Wake: func(_ context.Context, n types.NamespacedName) { woken <- n }}
	r.defaults()
	bl := &berthv1alpha1.BerthLease{}
	bl.Namespace, bl.Name, bl.UID = "payments", "exporter", "uid-1"
	mem := r.memoryOf(bl)
	mem.observed = leaseclient.AcquireResult{Holder: "east", FencingToken: 3}

	r.watch(t.Context(), bl, mem, true)
	if mem.stopWatch != nil {
		t.Fatal("a long poll started before Start")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = r.Start(ctx) }()
	want := types.NamespacedName{Namespace: "payments", Name: "exporter"}
	select {
	case got := <-woken:
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Start woke (-want +got):\n%s", diff)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not wake the BerthLease that waited before it")
	}

	r.watch(t.Context(), bl, mem, true) // the reconcile Start asked for
	select {
	case got := <-woken:
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the long poll woke (-want +got):\n%s", diff)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the long poll started after Start did not wake its BerthLease")
	}
	leases.mu.Lock()
	defer leases.mu.Unlock()
	if diff := cmp.Diff([]string{"exporter"}, leases.watched); diff != "" {
		t.Errorf("long polls (-want +got):\n%s", diff)
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
