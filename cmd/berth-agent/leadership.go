package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// electionTiming is the leader election's timing (--leader-elect-lease-duration,
// --leader-elect-renew-deadline, --leader-elect-retry-period). The agent's own bound
// (leadership.Until) is derived from it.
type electionTiming struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// defaultElectionTiming is client-go's and controller-runtime's default.
var defaultElectionTiming = electionTiming{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}

// electionMargin is how much sooner than any other replica could lead a leader stops
// acting, beyond the second client-go's records round away: room for calls in flight
// at Until and for the replicas' clock rates.
const electionMargin = time.Second

// validate checks what client-go's leader election demands (it panics otherwise), and
// what Until's promise rests on. client-go writes the lease duration into the record in
// whole seconds, which a standby waits out, and a standby sees a renewal only when the
// record's JSON changes, where the renew time has whole seconds too: a renewal within
// the second of the one before it goes unseen. So a standby may take over as soon as
// the lease duration, less a second, after the leader's last write; the renew deadline
// must end before that, by electionMargin.
func (e electionTiming) validate() error {
	switch {
	case e.RetryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period must be above 0")
	case float64(e.RenewDeadline) <= leaderelection.JitterFactor*float64(e.RetryPeriod):
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must exceed %.1f × --leader-elect-retry-period (%s)", e.RenewDeadline, leaderelection.JitterFactor, e.RetryPeriod)
	case e.LeaseDuration%time.Second != 0:
		return fmt.Errorf("--leader-elect-lease-duration (%s) must be whole seconds: the election's record keeps whole seconds", e.LeaseDuration)
	case e.RenewDeadline > e.LeaseDuration-time.Second-electionMargin:
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must end %s before --leader-elect-lease-duration (%s) less the second the election's record rounds away, at most %s",
			e.RenewDeadline, electionMargin, e.LeaseDuration, e.LeaseDuration-time.Second-electionMargin)
	}
	return nil
}

// leadership is the leader election's lock, watched: it knows until when this process is
// certainly the only replica of the agent that acts.
//
// A candidate takes the election lease over only once the record it last saw has stood
// unchanged for the lease duration on its own clock, and it can have seen the leader's
// latest renewal no earlier than that renewal was sent; but client-go compares records
// with their renew times in whole seconds, so the candidate's clock may have started at
// an earlier renewal within the same second. So no other replica leads before (the send
// of this process's last successful write) + the lease duration − 1 s. The leader itself
// gives up after the renew deadline without a successful write; Until is that instant,
// leaving the difference (4 s by default, at least electionMargin: validate) for calls
// still in flight and for clock rates.
// client-go does not stop a leader that was frozen past it (kubernetes#44887): on waking,
// the process still believes it leads until its next renewal fails, up to a renew deadline
// later. The reconciler asks Until before it acts, and bounds every call by it, so a
// replica that woke after another took over does nothing at all before it exits.
type leadership struct {
	resourcelock.Interface
	clock clock.PassiveClock
	// renewDeadline is how long after a successful write's send this process is
	// certainly the leader.
	renewDeadline time.Duration

	mu    sync.Mutex
	until time.Time
}

// newLeadership makes the election's lock (a coordination.k8s.io Lease named name in
// namespace) under a fresh identity, as controller-runtime would.
func newLeadership(cfg *rest.Config, namespace, name string, timing electionTiming) (*leadership, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("leader election identity: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return nil, err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, name, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: host + "_" + string(uuid.NewUUID())})
	if err != nil {
		return nil, fmt.Errorf("leader election lock: %w", err)
	}
	return &leadership{Interface: lock, clock: clock.RealClock{}, renewDeadline: timing.RenewDeadline}, nil
}

// Until is the instant (on the process's monotonic clock) before which this process is
// certainly the leader; zero when it is not, or no longer sure.
func (l *leadership) Until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// Get reads the record; one that names another holder ends this process's certainty at
// once, before client-go concludes anything from it.
func (l *leadership) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	if err == nil && rec.HolderIdentity != l.Identity() {
		l.set(time.Time{})
	}
	return rec, raw, err
}

func (l *leadership) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, l.Interface.Create)
}

func (l *leadership) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, l.Interface.Update)
}

// write makes one write of the record and moves the certainty: a write that names this
// process extends it to the write's send plus the renew deadline; a write naming no one
// (the release on shutdown) ends it. A failed write changes nothing: its deadline stands.
func (l *leadership) write(ctx context.Context, rec resourcelock.LeaderElectionRecord, write func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	sent := l.clock.Now()
	if rec.HolderIdentity != l.Identity() {
		l.set(time.Time{}) // before the write: a release may land however it ends
	}
	err := write(ctx, rec)
	if err == nil && rec.HolderIdentity == l.Identity() {
		l.set(sent.Add(l.renewDeadline))
	}
	return err
}

func (l *leadership) set(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = until
}
