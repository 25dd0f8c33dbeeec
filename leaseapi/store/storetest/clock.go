package storetest

import (
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// ReplicaOpenFunc opens one replica of a shared store: every store it
// returns reaches the same records. local is the replica's own clock, which
// the store's clock may use only for the time elapsed between its readings.
// The suite closes the store.
type ReplicaOpenFunc func(t *testing.T, local clock.Clock) store.Store

// OffsetClock is the real clock shifted by a fixed offset: a replica whose
// clock is wrong by that much.
type OffsetClock struct {
	clock.RealClock
	Offset time.Duration
}

// Now is the real time shifted by the offset.
func (c OffsetClock) Now() time.Time { return c.RealClock.Now().Add(c.Offset) }

// Since is the time elapsed since t on this clock.
func (c OffsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// RunReplicaClocks checks a store that several servers share (a store.Clock)
// with two replicas whose own clocks are 20 s apart: a term granted through
// either lasts its TTL on both, because both judge it by the store's clock.
// It runs in real time, about one TTL.
func RunReplicaClocks(t *testing.T, open ReplicaOpenFunc) {
	const (
		offset = 20 * time.Second
		ttl    = 3 * time.Second
		// slack bounds how much later than its TTL a term may end: the
		// uncertainty of both replicas' readings, and polling.
		slack = 5 * time.Second
	)
	replica := func(offset time.Duration) *lease.Service {
		local := OffsetClock{Offset: offset}
		s := open(t, local)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
		sc, ok := s.(store.Clock)
		if !ok {
			t.Fatalf("%T is shared but offers no store.Clock", s)
		}
		return lease.NewService(s, lease.Options{Clock: local, StoreClock: sc})
	}
	onTime, ahead := replica(0), replica(offset)
	ctx := t.Context()

	for name, tc := range map[string]struct{ granting, judging *lease.Service }{
		"granted on time, judged ahead": {granting: onTime, judging: ahead},
		"granted ahead, judged on time": {granting: ahead, judging: onTime},
	} {
		t.Run(name, func(t *testing.T) {
			k := leaseapi.Key{Namespace: "clocks", Name: map[bool]string{true: "on-time", false: "ahead"}[tc.granting == onTime]}
			sent := time.Now()
			d, err := tc.granting.Acquire(ctx, k, "cluster-a", ttl)
			if err != nil || d.Outcome != lease.OutcomeAcquired {
				t.Fatalf("acquire by cluster-a: %v, %v", d.Outcome, err)
			}
			granted := time.Now()

			l, err := tc.judging.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if l.Holder != "cluster-a" {
				t.Errorf("the other replica shows holder %q at once, want cluster-a", l.Holder)
			}
			if res, err := tc.judging.Sweep(ctx); err != nil || res.Expired != 0 {
				t.Errorf("the other replica's sweep at once: %+v, %v; want nothing expired", res, err)
			}
			// cluster-b tries through the other replica until it wins.
			for {
				d, err := tc.judging.Acquire(ctx, k, "cluster-b", ttl)
				if err != nil {
					t.Fatalf("acquire by cluster-b: %v", err)
				}
				now := time.Now()
				if d.Outcome == lease.OutcomeAcquired {
					if early := sent.Add(ttl).Sub(now); early > 0 {
						t.Fatalf("cluster-b took over %v after cluster-a sent its acquire, %v before its TTL of %v ran out", now.Sub(sent), early, ttl)
					}
					t.Logf("cluster-b took over %v after cluster-a's acquire was answered (TTL %v)", now.Sub(granted), ttl)
					break
				}
				if d.Outcome != lease.OutcomeHeldByOther || d.Next.Holder != "cluster-a" {
					t.Fatalf("acquire by cluster-b: %s with holder %q, want held-by-other cluster-a", d.Outcome, d.Next.Holder)
				}
				if now.Sub(granted) > ttl+slack {
					t.Fatalf("cluster-b could not take over %v after cluster-a's term began (TTL %v)", now.Sub(granted), ttl)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
