package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// describe is what a test compares of watch events: "RESET(cause)" or
// "ns/name holder#token" (with " revoked").
func describe(events []lease.Event) []string {
	var out []string
	for _, e := range events {
		if e.Reset != "" {
			out = append(out, fmt.Sprintf("RESET(%s)", e.Reset))
			continue
		}
		s := fmt.Sprintf("%s/%s %s#%d", e.Lease.Namespace, e.Lease.Name, e.Lease.Holder, e.Lease.FencingToken)
		if e.Lease.Revoked {
			s += " revoked"
		}
		out = append(out, s)
	}
	return out
}

// TestWatchSeesChangesNotRenewals runs every kind of write through a
// Service on SQLite and checks what a watcher is handed: each change of
// holder, token or revocation once, including an expiry freed by the
// sweep, and no renewal (neither renew nor the holder's own acquire).
func TestWatchSeesChangesNotRenewals(t *testing.T) {
	ctx := t.Context()
	clock := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	svc := lease.NewService(openSQLite(t), lease.Options{Clock: clock})
	w := svc.Watch(nil, "")
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	must := func(d lease.Decision, err error) lease.Decision {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := must(svc.Acquire(ctx, key, "east", 10*time.Second))
	must(svc.Renew(ctx, key, "east", d.Next.FencingToken, 10*time.Second))
	must(svc.Acquire(ctx, key, "east", 10*time.Second))
	must(svc.Acquire(ctx, key, "west", 10*time.Second)) // held by east: nothing
	must(svc.Revoke(ctx, key, "east", d.Next.FencingToken))
	must(svc.Release(ctx, key, "east", d.Next.FencingToken))
	d = must(svc.Acquire(ctx, key, "west", 10*time.Second))
	if _, err := svc.GrantGrace(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Step(time.Minute)
	if res, err := svc.Sweep(ctx); err != nil || res.Expired != 1 {
		t.Fatalf("sweep: %+v, %v; want one expiry", res, err)
	}
	must(svc.Acquire(ctx, key, "east", 10*time.Second))
	clock.Step(time.Minute)
	must(svc.Acquire(ctx, key, "west", 10*time.Second)) // a takeover before the sweep

	events, _ := w.Next(100)
	want := []string{
		"RESET(start)",
		"payments/exporter east#1",
		"payments/exporter east#1 revoked",
		"payments/exporter #1",
		"payments/exporter west#2",
		"payments/exporter #2",
		"payments/exporter east#3",
		"payments/exporter west#4",
	}
	if diff := cmp.Diff(want, describe(events)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	for _, e := range events[1:] {
		got, err := svc.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if e.Lease.Namespace != key.Namespace || e.Lease.Name != key.Name || e.Lease.TTL != 10*time.Second || e.Lease.AcquiredAt.IsZero() {
			t.Errorf("event record %+v is not a whole record (now %+v)", e.Lease, got)
		}
	}
	// The last event is the record as Get shows it.
	got, err := svc.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1].Lease
	if diff := cmp.Diff(got, last); diff != "" {
		t.Errorf("the last event is not the record Get answers (-get +event):\n%s", diff)
	}
}

// fakeFeed is a LeaseFeed that a test drives: it says that it follows, then
// passes on what the test sends.
type fakeFeed struct{ reports chan store.LeaseChange }

func (f *fakeFeed) FollowLeases(ctx context.Context, changed func(store.LeaseChange)) error {
	changed(store.LeaseChange{All: true})
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-f.reports:
			changed(c)
		}
	}
}

// TestWatchFollowsFeed: two services share one store, as replicas share
// PostgreSQL; the second follows a feed that reports the first one's
// writes by key. Its watcher is handed each write with the record read from
// the store, the feed's start as a reset, and a state it already logged
// (its own write, which the feed reports too) only once.
func TestWatchFollowsFeed(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	st := openSQLite(t)
	a := lease.NewService(st, lease.Options{})
	b := lease.NewService(st, lease.Options{})
	w := b.Watch([]string{"payments"}, "")
	feed := &fakeFeed{reports: make(chan store.LeaseChange)}
	wg.Go(func() { b.FollowFeed(ctx, feed, func(err error) { t.Errorf("feed broke: %v", err) }) })

	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	var got []string
	// report passes a write on through the feed and waits until the
	// watcher has what it should have by then: the feed's follower reads
	// the record when the report comes, so a write made before that would
	// be read in its place.
	report := func(want int) {
		feed.reports <- store.LeaseChange{Namespace: key.Namespace, Name: key.Name}
		deadline := time.After(10 * time.Second)
		for len(got) < want {
			events, more := w.Next(10)
			if got = append(got, describe(events)...); len(got) >= want {
				return
			}
			select {
			case <-more:
			case <-deadline:
				t.Fatalf("after 10 s the watcher has %q, want %d events", got, want)
			}
		}
	}
	d, err := a.Acquire(ctx, key, "east", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	report(3)
	if _, err := a.Release(ctx, key, "east", d.Next.FencingToken); err != nil {
		t.Fatal(err)
	}
	report(4)
	if _, err := b.Acquire(ctx, key, "west", time.Minute); err != nil {
		t.Fatal(err)
	}
	report(5) // b's own write, reported by the feed as well

	want := []string{"RESET(start)", "RESET(feed)", "payments/exporter east#1", "payments/exporter #1", "payments/exporter west#2"}
	// Let a duplicate, if any, arrive.
	time.Sleep(100 * time.Millisecond)
	events, _ := w.Next(10)
	got = append(got, describe(events)...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events at the second service (-want +got):\n%s", diff)
	}
}

// renewingStore writes one lease just before the sweep's first batched
// write lands, so that its compare-and-swap loses.
type renewingStore struct {
	store.Store
	renew func()
}

func (s *renewingStore) GetLeases(ctx context.Context, keys []store.LeaseKey) ([]store.Lease, error) {
	return s.Store.(store.LeaseBatchStore).GetLeases(ctx, keys)
}

func (s *renewingStore) PutLeases(ctx context.Context, leases []store.Lease) ([]store.Lease, []error, error) {
	if s.renew != nil {
		s.renew()
		s.renew = nil
	}
	return s.Store.(store.LeaseBatchStore).PutLeases(ctx, leases)
}

// TestSweepFreesInBatches: a sweep frees every expired lease, more than
// one batch of them, and a watcher hears of each; a lease taken over
// between the sweep's list and its write is decided again and stays held.
func TestSweepFreesInBatches(t *testing.T) {
	ctx := t.Context()
	clock := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st := &renewingStore{Store: openSQLite(t)}
	svc := lease.NewService(st, lease.Options{Clock: clock})
	const n = 2500
	for i := range n {
		key := leaseapi.Key{Namespace: "payments", Name: fmt.Sprintf("lease-%04d", i)}
		if _, err := svc.Acquire(ctx, key, "east", 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	w := svc.Watch(nil, "")
	clock.Step(11 * time.Second)
	taken := leaseapi.Key{Namespace: "payments", Name: "lease-0007"}
	st.renew = func() {
		// Expired, so anyone may take it: the listed version is gone.
		if d, err := svc.Acquire(ctx, taken, "west", 10*time.Second); err != nil || !d.Held() {
			t.Errorf("take %s over: %+v, %v", taken, d, err)
		}
	}
	res, err := svc.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Expired != n-1 {
		t.Errorf("sweep freed %d leases, want all %d but the one taken over meanwhile", res.Expired, n-1)
	}
	if l, err := svc.Get(ctx, taken); err != nil || l.Holder != "west" {
		t.Errorf("the lease taken over during the sweep: %+v, %v; want it held by west", l, err)
	}
	events, _ := w.Next(2 * n)
	// The watch's first event is its reset; then the takeover and every expiry.
	if got, want := len(describe(events)), 1+1+res.Expired; got != want {
		t.Errorf("the watcher has %d events, want %d", got, want)
	}
}

// TestWaitForChangeAnswersAReservationsEnd: a long poll on a free lease
// that a move's reservation withholds answers when the sweep clears the
// reservation, though its holder and token stay as they were; and watches
// see the move, the reservation and its end.
func TestWaitForChangeAnswersAReservationsEnd(t *testing.T) {
	ctx := t.Context()
	clock := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	svc := lease.NewService(openSQLite(t), lease.Options{Clock: clock})
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	d, err := svc.Acquire(ctx, key, "east", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := svc.Watch(nil, "")
	if _, err := svc.Move(ctx, key, "east", d.Next.FencingToken, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Release(ctx, key, "east", d.Next.FencingToken); err != nil {
		t.Fatal(err)
	}
	answered := make(chan store.Lease, 1)
	go func() {
		l, err := svc.WaitForChange(ctx, key, "", d.Next.FencingToken, 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		answered <- l
	}()
	time.Sleep(100 * time.Millisecond) // let the poll start waiting
	select {
	case l := <-answered:
		t.Fatalf("the poll answered %+v while the reservation lasts", l)
	default:
	}
	clock.Step(10 * time.Second)
	if _, err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-answered:
		if !l.Reserved.IsZero() || l.Holder != "" {
			t.Errorf("the poll answered %+v, want the free lease without its reservation", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the poll did not answer the reservation's end")
	}
	events, _ := w.Next(10)
	var got []string
	for _, e := range events {
		if e.Reset == "" {
			got = append(got, fmt.Sprintf("moving=%v reserved=%q", e.Lease.Moving, e.Lease.Reserved.Except))
		}
	}
	want := []string{`moving=true reserved=""`, `moving=false reserved="east"`, `moving=false reserved=""`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("watch events (-want +got):\n%s", diff)
	}
}
