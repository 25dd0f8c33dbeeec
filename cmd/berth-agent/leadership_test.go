package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"
)

// recordLock is a resourcelock.Interface in memory: the record, who it is, and the error
// its next write returns.
type recordLock struct {
	id       string
	rec      resourcelock.LeaderElectionRecord
	writeErr error
}

func (l *recordLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r := l.rec
	return &r, []byte(r.HolderIdentity), nil
}
func (l *recordLock) Create(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.put(r)
}
func (l *recordLock) Update(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.put(r)
}
func (l *recordLock) put(r resourcelock.LeaderElectionRecord) error {
	if l.writeErr != nil {
		return l.writeErr
	}
	l.rec = r
	return nil
}
func (l *recordLock) RecordEvent(string) {}
func (l *recordLock) Identity() string   { return l.id }
func (l *recordLock) Describe() string   { return "test/lock" }

func TestLeadershipUntil(t *testing.T) {
	ctx := context.Background()
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakePassiveClock(start)
	lock := &recordLock{id: "a"}
	l := &leadership{Interface: lock, clock: clk, renewDeadline: defaultElectionTiming.RenewDeadline}
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "a"}

	if got := l.Until(); !got.IsZero() {
		t.Fatalf("before any write: Until %v, want zero", got)
	}
	if err := l.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Until(), start.Add(defaultElectionTiming.RenewDeadline); !got.Equal(want) {
		t.Fatalf("after acquiring: Until %v, want the write's send plus the renew deadline %v", got, want)
	}

	// A renewal that fails extends nothing: the last success's bound stands.
	clk.SetTime(start.Add(4 * time.Second))
	lock.writeErr = errors.New("apiserver unreachable")
	if err := l.Update(ctx, mine); err == nil {
		t.Fatal("want the write's error")
	}
	if got, want := l.Until(), start.Add(defaultElectionTiming.RenewDeadline); !got.Equal(want) {
		t.Fatalf("after a failed renewal: Until %v, want %v", got, want)
	}
	lock.writeErr = nil
	if err := l.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Until(), start.Add(4*time.Second+defaultElectionTiming.RenewDeadline); !got.Equal(want) {
		t.Fatalf("after a renewal: Until %v, want %v", got, want)
	}

	// A process woken from a freeze reads a record another replica wrote: its
	// certainty ends at once, whatever its last renewal promised.
	lock.rec.HolderIdentity = "b"
	if _, _, err := l.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if got := l.Until(); !got.IsZero() {
		t.Fatalf("after reading another holder: Until %v, want zero", got)
	}

	// The release on shutdown (a record naming no one) ends it before it is
	// sent, even when it fails.
	if err := l.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	lock.writeErr = errors.New("timeout")
	_ = l.Update(ctx, resourcelock.LeaderElectionRecord{})
	if got := l.Until(); !got.IsZero() {
		t.Fatalf("after a release: Until %v, want zero", got)
	}
}
