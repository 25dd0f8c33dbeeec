package reconciler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/test/poll"
)

// batches is a BatchRenewer that records each batch and answers it with
// answer (by default: every lease renewed with its own token).
type batches struct {
	LeaseClient
	mu     sync.Mutex
	sent   [][]string
	answer func(renewals []leaseclient.Renewal) ([]leaseclient.AcquireResult, error)
}

func (b *batches) RenewBatch(_ context.Context, holder string, renewals []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
	b.mu.Lock()
	var names []string
	for _, r := range renewals {
		names = append(names, r.Name)
	}
	b.sent = append(b.sent, names)
	b.mu.Unlock()
	if b.answer != nil {
		return b.answer(renewals)
	}
	out := make([]leaseclient.AcquireResult, len(renewals))
	for i, r := range renewals {
		out[i] = leaseclient.AcquireResult{Acquired: true, Holder: holder, FencingToken: r.FencingToken}
	}
	return out, nil
}

func (b *batches) take() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.sent
	b.sent = nil
	return out
}

// unreachable answers every batch as a lease API that cannot be reached.
func unreachable([]leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
	return nil, errors.New("unreachable")
}

// renewing is a reconciler whose renewer runs (without its loop: the test
// calls renewDue), at t0 on a fake clock.
func renewing(b *batches) (*BerthLeaseReconciler, *wakes, *clocktesting.FakeClock) {
	w := &wakes{}
	clk := clocktesting.NewFakeClock(t0)
	r := &BerthLeaseReconciler{LeaseClient: b, Wake: w.wake, Clock: clk}
	r.defaults()
	r.renewals.running.Store(true)
	return r, w, clk
}

// handed remembers a BerthLease whose running term (token 7, renewal due
// at renewIn, deadline at deadlineIn) the reconcile handed to the renewer.
func handed(r *BerthLeaseReconciler, name string, renewIn, deadlineIn time.Duration) *memory {
	m := remember(r, name, name, holding(term(renewIn, deadlineIn)))
	r.handOver(m, &batchSpec{namespace: "payments", lease: name, holder: us, ttl: memTTL, heartbeat: memHeartbeat})
	return m
}

// TestRenewerBatchesWhatIsDue: one request carries every term that is due
// and every term due within half a heartbeat; a term renewed gets its
// deadline from when the batch was sent and wakes nothing; a term lost
// wakes its BerthLease.
func TestRenewerBatchesWhatIsDue(t *testing.T) {
	b := &batches{}
	r, w, clk := renewing(b)
	due := handed(r, "due", -time.Second, 10*time.Second)
	early := handed(r, "early", memHeartbeat/2-time.Second, 10*time.Second)
	later := handed(r, "later", memHeartbeat/2+time.Second, 10*time.Second)
	lost := handed(r, "lost", 0, 10*time.Second)
	b.answer = func(renewals []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
		clk.Step(100 * time.Millisecond) // the round trip
		out := make([]leaseclient.AcquireResult, len(renewals))
		for i, rn := range renewals {
			out[i] = leaseclient.AcquireResult{Acquired: true, Holder: us, FencingToken: rn.FencingToken}
			if rn.Name == "lost" {
				out[i] = leaseclient.AcquireResult{Holder: other, FencingToken: 8}
			}
		}
		return out, nil
	}

	next := r.renewDue(t.Context(), b, r.Log)
	sent := b.take()
	if len(sent) != 1 {
		t.Fatalf("sent %d batches, want 1: %v", len(sent), sent)
	}
	got := map[string]bool{}
	for _, n := range sent[0] {
		got[n] = true
	}
	if diff := cmp.Diff(map[string]bool{"due": true, "early": true, "lost": true}, got); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
	for _, m := range []*memory{due, early} {
		tm := m.read().term
		if want := t0.Add(LocalValidity(memTTL)); !tm.Deadline.Equal(want) {
			t.Errorf("%s: deadline %v after t0, want %v: measured from when the batch was sent", m.name.Name, tm.Deadline.Sub(t0), want.Sub(t0))
		}
		if want := t0.Add(memHeartbeat); !tm.RenewDue.Equal(want) {
			t.Errorf("%s: renewal due %v after t0, want a heartbeat after the batch was sent", m.name.Name, tm.RenewDue.Sub(t0))
		}
	}
	if tm := later.read().term; !tm.RenewDue.Equal(t0.Add(memHeartbeat/2 + time.Second)) {
		t.Errorf("a term not yet due was renewed")
	}
	if lt := lost.read(); lt.term != nil || lt.observed.Holder != other {
		t.Errorf("the lost term is still held: %+v", lt)
	}
	if diff := cmp.Diff([]string{"lost"}, w.take()); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
	if want := clk.Now(); next.After(want) {
		t.Errorf("after a batch the renewer looks again at %v, want at once", next.Sub(t0))
	}
	if next := r.renewDue(t.Context(), b, r.Log); !next.Equal(t0.Add(memHeartbeat/2 + time.Second)) {
		t.Errorf("the renewer looks again %v after t0, want when the next term is due", next.Sub(t0))
	}
	if sent := b.take(); len(sent) != 0 {
		t.Errorf("sent %v with nothing due", sent)
	}
}

// TestRenewerFailures: a failed batch keeps every term, retries it soon,
// and wakes each BerthLease once when renewals start failing and once when
// they succeed again; a deadline that passes wakes its BerthLease once.
func TestRenewerFailures(t *testing.T) {
	b := &batches{}
	r, w, clk := renewing(b)
	m := handed(r, "exporter", 0, 10*time.Second)
	b.answer = unreachable
	r.renewDue(t.Context(), b, r.Log)
	tm := m.read()
	if tm.term == nil || tm.apiErr == nil {
		t.Fatalf("after a failed batch: %+v, want the term kept and the failure recorded", tm)
	}
	if want := t0.Add(retryInterval(memHeartbeat)); !tm.term.RenewDue.Equal(want) {
		t.Errorf("retry due %v after t0, want %v", tm.term.RenewDue.Sub(t0), want.Sub(t0))
	}
	if diff := cmp.Diff([]string{"exporter"}, w.take()); diff != "" {
		t.Errorf("the first failure wakes (-want +got):\n%s", diff)
	}
	clk.Step(retryInterval(memHeartbeat))
	r.renewDue(t.Context(), b, r.Log)
	if got := w.take(); len(got) != 0 {
		t.Errorf("a second failure woke %v again", got)
	}
	b.answer = nil
	clk.Step(retryInterval(memHeartbeat))
	r.renewDue(t.Context(), b, r.Log)
	if diff := cmp.Diff([]string{"exporter"}, w.take()); diff != "" {
		t.Errorf("renewing again wakes (-want +got):\n%s", diff)
	}

	if sent := b.take(); len(sent) != 3 {
		t.Errorf("batches %v, want 3: two failed, one renewed", sent)
	}
	b.answer = unreachable
	clk.Step(LocalValidity(memTTL))
	r.renewDue(t.Context(), b, r.Log)
	r.renewDue(t.Context(), b, r.Log)
	if diff := cmp.Diff([]string{"exporter"}, w.take()); diff != "" {
		t.Errorf("a passed deadline wakes once (-want +got):\n%s", diff)
	}
	if sent := b.take(); len(sent) != 0 {
		t.Errorf("batches %v: a term past its deadline is left to its reconcile", sent)
	}
}

// TestRenewerKeepsTheNewerWord: an answer for a term the reconcile has
// replaced or let go of meanwhile changes nothing.
func TestRenewerKeepsTheNewerWord(t *testing.T) {
	b := &batches{}
	r, w, _ := renewing(b)
	m := handed(r, "exporter", 0, 10*time.Second)
	b.answer = func([]leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
		m.update(func(t tenure) tenure { t.term = nil; return t }) // released meanwhile
		return []leaseclient.AcquireResult{{Acquired: true, Holder: us, FencingToken: 7}}, nil
	}
	r.renewDue(t.Context(), b, r.Log)
	if tm := m.read().term; tm != nil {
		t.Errorf("a renewal answered after the release made the term %+v again", tm)
	}
	if got := w.take(); len(got) != 0 {
		t.Errorf("woke %v", got)
	}
}

// TestRenewerOnAnOlderLeaseAPI: a lease API without batched renewals turns
// batching off; as the renewer ends it gives every term back, the ones not
// yet due too, and wakes their reconciles, which renew on their own; a
// term handed over afterwards is not taken.
func TestRenewerOnAnOlderLeaseAPI(t *testing.T) {
	b := &batches{}
	r, w, _ := renewing(b)
	due := handed(r, "exporter", 0, 10*time.Second)
	notDue := handed(r, "scheduler", 9*time.Second, 10*time.Second)
	b.answer = func([]leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
		return nil, leaseclient.ErrNotSupported
	}
	if !r.batching() {
		t.Fatal("batching is off before the first batch")
	}
	r.renewDue(t.Context(), b, r.Log)
	if r.batching() {
		t.Error("batching is still on after the lease API refused a batch")
	}
	r.giveBack(t.Context()) // as the renewer's loop ends
	if diff := cmp.Diff([]string{"exporter", "scheduler"}, w.take()); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
	for _, m := range []*memory{due, notDue} {
		m.mu.Lock()
		if m.batch != nil {
			t.Errorf("%s: still handed over after the renewer ended", m.name.Name)
		}
		m.mu.Unlock()
	}
	if r.handOver(due, &batchSpec{namespace: "payments", lease: "exporter", holder: us, ttl: memTTL, heartbeat: memHeartbeat}) {
		t.Error("a term was handed over to a renewer that ended")
	}
}

// acquires is a lease client whose Acquire grants the lease with token
// 9 to whoever asks, and counts the calls.
type acquires struct {
	batches
	calls atomic.Int32
}

func (a *acquires) Acquire(_ context.Context, _, _, holder string, _ time.Duration) (leaseclient.AcquireResult, error) {
	a.calls.Add(1)
	return leaseclient.AcquireResult{Acquired: true, Holder: holder, FencingToken: 9}, nil
}

// TestAcquirerTakesFreedLeasesOver: a lease the stream reports free is
// acquired at once for the BerthLease that waits for it, its term is
// handed to the renewer (measured from when the acquire was sent), and
// the reconcile is woken; a BerthLease whose reconcile no longer waits is
// only woken.
func TestAcquirerTakesFreedLeasesOver(t *testing.T) {
	a := &acquires{}
	w := &wakes{}
	clk := clocktesting.NewFakeClock(t0)
	r := &BerthLeaseReconciler{LeaseClient: a, Wake: w.wake, Clock: clk}
	r.defaults()
	r.renewals.running.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go r.acquire(ctx)
	poll.For(t, 5*time.Second, "the acquirer runs", r.acquisitions.running.Load)
	waitingFor := func(name string) *memory {
		m := remember(r, name, name, with(tenure{started: true}, saw(granted(other, 3))))
		m.setWaiting(&batchSpec{namespace: "payments", lease: name, holder: us, ttl: memTTL, heartbeat: memHeartbeat})
		return m
	}
	m := waitingFor("exporter")
	gone := waitingFor("scheduler")
	gone.setWaiting(nil) // its reconcile decided otherwise since
	free := func(name string) leaseclient.LeaseEvent {
		return leaseclient.LeaseEvent{Lease: leaseapi.Lease{Namespace: "payments", Name: name, FencingToken: 3}}
	}
	r.leaseChanged(t.Context(), free("exporter"))
	r.leaseChanged(t.Context(), free("scheduler"))
	poll.For(t, 5*time.Second, "both BerthLeases woken", func() bool { return w.count() == 2 })
	if diff := cmp.Diff([]string{"exporter", "scheduler"}, w.take()); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
	if got := a.calls.Load(); got != 1 {
		t.Errorf("%d acquires, want 1: only the BerthLease that still waits", got)
	}
	m.mu.Lock()
	tm, batch, waiting := m.tenure.term, m.batch, m.waiting
	m.mu.Unlock()
	if tm == nil || tm.Token != 9 || !tm.Deadline.Equal(t0.Add(LocalValidity(memTTL))) {
		t.Errorf("term after the takeover: %+v, want token 9 with its deadline a validity after the acquire was sent", tm)
	}
	if batch == nil || waiting != nil {
		t.Errorf("after the takeover the renewer has %v and the acquirer %v, want the renewer to renew it and the acquirer done", batch, waiting)
	}
	if gt := gone.read(); gt.term != nil {
		t.Errorf("a BerthLease that no longer waits was given a term: %+v", gt.term)
	}
}
