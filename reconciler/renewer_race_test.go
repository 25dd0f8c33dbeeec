package reconciler

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// hangingBatches: RenewBatch blocks until its context ends (a lease API that
// stopped answering: a partition beginning).
type hangingBatches struct {
	LeaseClient
	started chan struct{}
	once    sync.Once
}

func (h *hangingBatches) RenewBatch(ctx context.Context, holder string, rn []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
	h.once.Do(func() { close(h.started) })
	<-ctx.Done()
	return nil, ctx.Err()
}

type timedWakes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (w *timedWakes) wake(_ context.Context, n types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.at[n.Name]; !ok {
		w.at[n.Name] = time.Now()
	}
}

// TestRenewerFencesATermHandedOverDuringABatch: a term handed to the renewer
// while a batch for other terms hangs is still woken at its local deadline:
// the hand-over cuts the batch (its cutoff comes after the new deadline),
// and the renewer looks again at once.
func TestRenewerFencesATermHandedOverDuringABatch(t *testing.T) {
	h := &hangingBatches{started: make(chan struct{})}
	w := &timedWakes{at: map[string]time.Time{}}
	r := &BerthLeaseReconciler{LeaseClient: h, Wake: w.wake, Clock: clock.RealClock{}, CallTimeout: 3 * time.Second}
	r.defaults()
	r.renewals.running.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go r.renew(ctx)
	for !r.renewals.running.Load() {
		time.Sleep(time.Millisecond)
	}
	now := time.Now()
	// A term with a 1 h TTL, due now: the batch for it hangs.
	long := remember(r, "long", "long", holding(&Term{Holder: us, Token: 1, RenewDue: now, Deadline: now.Add(40 * time.Minute)}))
	r.handOver(long, &batchSpec{namespace: "payments", lease: "long", holder: us, ttl: time.Hour, heartbeat: 20 * time.Minute})
	<-h.started
	// A short term (TTL 3 s) is acquired and handed over while the batch hangs.
	now = time.Now()
	deadline := now.Add(300 * time.Millisecond)
	short := remember(r, "short", "short", holding(&Term{Holder: us, Token: 1, RenewDue: now.Add(time.Second), Deadline: deadline}))
	r.handOver(short, &batchSpec{namespace: "payments", lease: "short", holder: us, ttl: 3 * time.Second, heartbeat: time.Second})
	time.Sleep(3500 * time.Millisecond)
	w.mu.Lock()
	at, ok := w.at["short"]
	w.mu.Unlock()
	if !ok {
		t.Fatalf("the short term's deadline passed and its BerthLease was never woken")
	}
	if late := at.Sub(deadline); late > 50*time.Millisecond {
		t.Errorf("the short term's BerthLease was woken %v after its local deadline (its Pods run on, unfenced, that long)", late.Round(time.Millisecond))
	}
}

// oldLeaseAPI answers batched renewals as a lease API of an earlier release
// (or an old replica during a rolling upgrade or rollback) does.
type oldLeaseAPI struct{ LeaseClient }

func (oldLeaseAPI) RenewBatch(context.Context, string, []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
	return nil, leaseclient.ErrNotSupported
}

// TestRenewerGivesEveryTermBackWhenBatchesAreRefused: when a batch is
// answered ErrNotSupported, the renewer ends and gives every term back,
// those not in the batch too, waking their reconciles, which renew on their
// own.
func TestRenewerGivesEveryTermBackWhenBatchesAreRefused(t *testing.T) {
	w := &timedWakes{at: map[string]time.Time{}}
	r := &BerthLeaseReconciler{LeaseClient: oldLeaseAPI{}, Wake: w.wake, Clock: clock.RealClock{}}
	r.defaults()
	r.renewals.running.Store(true)
	now := time.Now()
	due := remember(r, "due", "due", holding(&Term{Holder: us, Token: 1, RenewDue: now, Deadline: now.Add(19 * time.Second)}))
	r.handOver(due, &batchSpec{namespace: "payments", lease: "due", holder: us, ttl: 30 * time.Second, heartbeat: 10 * time.Second})
	deadline := now.Add(700 * time.Millisecond)
	notDue := remember(r, "not-due", "not-due", holding(&Term{Holder: us, Token: 1, RenewDue: now.Add(600 * time.Millisecond), Deadline: deadline}))
	r.handOver(notDue, &batchSpec{namespace: "payments", lease: "not-due", holder: us, ttl: 30 * time.Second, heartbeat: 10 * time.Second})
	// not-due's RenewDue is within half a heartbeat, so make it later than that:
	notDue.update(func(tn tenure) tenure {
		c := *tn.term
		c.RenewDue = now.Add(6 * time.Second)
		c.Deadline = deadline
		tn.term = &c
		return tn
	})
	done := make(chan struct{})
	go func() { r.renew(t.Context()); close(done) }()
	<-done
	time.Sleep(time.Until(deadline) + 300*time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("woken: %v; renewer running=%v off=%v", w.at, r.renewals.running.Load(), r.renewals.off.Load())
	if _, ok := w.at["not-due"]; !ok {
		t.Errorf("a running term handed to the renewer was never woken, though its local deadline passed: the renewer ended (ErrNotSupported) waking only the terms of its last batch")
	}
}
