package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
	"github.com/berthfleet/berth/test/process"
)

// Environment variables of TestFrozenAgent (docs/testing.md shows the runs).
const (
	// envFrozenRuns is how many freezes each scenario makes (default 4).
	envFrozenRuns = "BERTH_FROZEN_RUNS"
	// envFrozenTiming "chart" runs the chart's timing (TTL 30, heartbeat 10,
	// client-go's default election) instead of the short one, so that an
	// agent without the election flags (an older release) can be judged too.
	envFrozenTiming = "BERTH_FROZEN_TIMING"
	// envFrozenAgent is the berth-agent program to judge instead of this
	// build's (an older release's, say).
	envFrozenAgent = "BERTH_FROZEN_AGENT"
)

// frozenTiming is the timing of one family of freezes.
type frozenTiming struct {
	ttl, heartbeat int32 // seconds
	// election is the replicas' leader election flags, and electionLease its
	// lease duration: how long into a freeze the other replica takes over.
	election      []string
	electionLease time.Duration
}

var (
	shortFreezes = frozenTiming{ttl: 10, heartbeat: 3, electionLease: 4 * time.Second,
		election: []string{"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=1500ms", "--leader-elect-retry-period=250ms"}}
	chartFreezes = frozenTiming{ttl: 30, heartbeat: 10, electionLease: 15 * time.Second}
)

// TestFrozenAgent freezes the holder's agent (SIGSTOP) until past its local validity,
// but not past the TTL at the lease API, and then lets it run on with what it remembered:
//
//   - a single agent: it wakes with its local deadline passed and a term the lease API
//     still holds for it, and nobody else can have started;
//   - the leader of two replicas (--leader-elect): the other replica takes leadership and
//     the term over during the freeze, and the woken one must not act on its stale
//     memory (releasing the term its successor runs under, issue 28).
//
// Each run waits for a renewal at the lease API and freezes at another phase of the
// heartbeat, for another length within the window. The history checker judges every
// run: never two clusters at once, tokens rising.
func TestFrozenAgent(t *testing.T) {
	timing := shortFreezes
	if os.Getenv(envFrozenTiming) == "chart" {
		timing = chartFreezes
	}
	runs := 4
	if v := os.Getenv(envFrozenRuns); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envFrozenRuns, v)
		}
		runs = n
	}
	w := workload
	w.TTLSeconds, w.HeartbeatSeconds = timing.ttl, timing.heartbeat
	r := startFleetWith(t, localfleet.Options{Clusters: 2, Workload: w, AgentBinary: os.Getenv(envFrozenAgent)})
	f := &freezer{run: r, timing: timing, ttl: time.Duration(timing.ttl) * time.Second, heartbeat: time.Duration(timing.heartbeat) * time.Second}

	t.Run("single agent", func(t *testing.T) {
		for i := range runs {
			f.freezeOnce(t, i, runs, false)
		}
	})
	if t.Failed() && os.Getenv(envFrozenAgent) == "" {
		return
	}
	// Every cluster's agent becomes two replicas with leader election, so that
	// whichever holds has a standby.
	for _, m := range r.Members {
		m.StopAgent()
		f.startReplicas(t, m)
	}
	t.Run("leader of two replicas", func(t *testing.T) {
		for i := range runs {
			f.freezeOnce(t, i, runs, true)
		}
	})
	t.Logf("frozen: single agent %d of %d runs overlapped; leader of two replicas %d of %d (TTL %ds, heartbeat %ds)",
		f.overlapped[false], runs, f.overlapped[true], runs, timing.ttl, timing.heartbeat)

	t.Run("agent without managed workloads after one with them", func(t *testing.T) {
		f.unmanagedSuccessor(t)
	})
}

// unmanagedSuccessor replaces the holder's agent with one started without
// --managed-workloads, as an agent run by hand or an older chart would be, and cordons
// the holder: the Pods the earlier agent ungated run under the term all the same, so the
// new one must stop them before it gives the term up (issue 28).
func (f *freezer) unmanagedSuccessor(t *testing.T) {
	ctx := t.Context()
	holder, _ := f.runner(t, 90*time.Second, "one cluster runs the workload")
	m := f.Member(holder)
	for _, p := range f.replicas[holder] {
		p.Kill()
	}
	p, err := m.StartAgentProcess(localfleet.AgentProcess{Unmanaged: true})
	if err != nil {
		t.Fatal(err)
	}
	m.Agent = p
	// It has recovered the term once its renewals reach the lease API.
	before := m.Lease(ctx)
	poll.For(t, 2*f.ttl, holder+"'s new agent renews the term", func() bool {
		l := m.Lease(ctx)
		return l.Holder == holder && l.FencingToken == before.FencingToken && l.RenewedAt.After(before.RenewedAt)
	})
	from := time.Now()
	if _, err := f.LeaseAPI.Admin.Cordon(ctx, holder); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := f.LeaseAPI.Admin.Uncordon(context.WithoutCancel(ctx), holder); err != nil {
			t.Error(err)
		}
	}()
	next, took := f.runner(t, 2*f.ttl+30*time.Second, "another cluster runs the workload after the cordon", holder)
	t.Logf("%s's agent without --managed-workloads handed the workload to %s in %s", holder, next, took.Round(time.Millisecond))
	if err := f.rec.Snapshot().Since(from).Check(); err != nil {
		t.Error(err)
	}
}

// freezer runs the freezes on one fleet.
type freezer struct {
	*run
	timing         frozenTiming
	ttl, heartbeat time.Duration
	// replicas are each cluster's two agent processes with --leader-elect: the
	// member's Agent, serving admission at the port the registrations name, and its
	// standby (localfleet's StartStandby).
	replicas   map[string]*[2]*process.Process
	overlapped map[bool]int // runs with an overlap, by scenario (replicas or not)
}

// startReplicas runs two agent processes for m with leader election.
func (f *freezer) startReplicas(t *testing.T, m *localfleet.Member) {
	t.Helper()
	if f.replicas == nil {
		f.replicas = map[string]*[2]*process.Process{}
	}
	f.replicas[m.Name] = &[2]*process.Process{}
	for slot := range 2 {
		f.startReplica(t, m, slot)
	}
}

// startReplica starts m's replica in slot (0: the member's Agent, 1: its standby).
func (f *freezer) startReplica(t *testing.T, m *localfleet.Member, slot int) {
	t.Helper()
	args := append([]string{"--leader-elect"}, f.timing.election...)
	var p *process.Process
	var err error
	if slot == 0 {
		p, err = m.StartAgentProcess(localfleet.AgentProcess{Args: args})
		m.Agent = p
	} else {
		p, err = m.StartStandby(args...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	f.replicas[m.Name][slot] = p
}

// freezeOnce makes run i of n: it waits for one cluster to run the workload and for a
// renewal of its term, freezes the agent (or the leader of its replicas) at phase i/n of
// the heartbeat until a point i/n into the window between the local validity and the
// TTL, lets it run on, and judges the history from the freeze until the fleet settles.
func (f *freezer) freezeOnce(t *testing.T, i, n int, replicas bool) {
	t.Helper()
	ctx := t.Context()
	holder := f.settle(t, 90*time.Second)
	m := f.Member(holder)
	agent := m.Agent
	if replicas {
		agent = f.leader(t, m)
	}
	before := f.Member(holder).Lease(ctx)

	// A renewal's arrival at the lease API starts the run: the agent's local deadline is
	// its send plus the validity, so this reading is a little late, never early.
	var renewed time.Time
	poll.For(t, 2*f.heartbeat+5*time.Second, "a renewal of "+holder+"'s term", func() bool {
		l := m.Lease(ctx)
		renewed = l.RenewedAt
		return l.Holder == holder && l.RenewedAt.After(before.RenewedAt)
	})
	seen := time.Now()
	validity := reconciler.LocalValidity(f.ttl)
	frac := (float64(i) + 0.5) / float64(n)
	phase := time.Duration(frac * float64(f.heartbeat))
	// Woken between the validity (plus a margin for the reading's lateness) and the
	// TTL, less a second for the Pods to go: the lease API holds the term for it still.
	lo, hi := validity+300*time.Millisecond, f.ttl-time.Second
	if replicas {
		// The standby must have taken over: past the election's lease.
		lo = max(lo, phase+f.timing.electionLease+time.Second)
		hi = max(hi, lo+time.Second)
	}
	wake := lo + time.Duration(float64(n-1-i)/float64(max(n-1, 1))*float64(hi-lo))
	const selfFence = "local deadline passed without a renewal: self-fencing"
	fencedBefore := len(agent.LogLines(selfFence))
	time.Sleep(time.Until(seen.Add(phase)))
	from := time.Now()
	if err := agent.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Meanwhile the lease API's record shows when the term was renewed next: by the
	// replica elected during the freeze, which must not leave it for a heartbeat.
	var next time.Time
	for time.Now().Before(seen.Add(wake)) {
		if l := m.Lease(ctx); next.IsZero() && l.Holder == holder && l.RenewedAt.After(renewed) {
			next = l.RenewedAt
		}
		time.Sleep(min(100*time.Millisecond, time.Until(seen.Add(wake))))
	}
	if err := agent.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := time.Now()

	f.settle(t, 2*f.ttl+60*time.Second)
	h := f.rec.Snapshot().Since(from.Add(-sweepInterval))
	lease := m.Lease(ctx)
	outcome := fmt.Sprintf("kept by %s with token %d", holder, lease.FencingToken)
	if lease.Holder != holder || lease.FencingToken != before.FencingToken {
		outcome = fmt.Sprintf("moved from %s (token %d) to %s (token %d)", holder, before.FencingToken, lease.Holder, lease.FencingToken)
	}
	what := "single agent"
	if replicas {
		what = "leader of two replicas"
	}
	t.Logf("frozen run %d/%d (%s): renewal at %s, frozen at +%s for %s (validity %s, TTL %s): %s",
		i+1, n, what, renewed.Format("15:04:05.000"), phase.Round(time.Millisecond), woke.Sub(from).Round(time.Millisecond),
		validity.Round(time.Millisecond), f.ttl, outcome)
	// The run proves something only if the freeze did what it was meant to: the single
	// agent woke past its local deadline; the leader lost its election meanwhile.
	if !replicas && len(agent.LogLines(selfFence)) == fencedBefore {
		t.Errorf("run %d/%d: the woken agent did not self-fence: the freeze did not pass its local deadline", i+1, n)
	}
	if err := h.Check(); err != nil {
		if f.overlapped == nil {
			f.overlapped = map[bool]int{}
		}
		f.overlapped[replicas]++
		t.Errorf("run %d/%d (%s): %v", i+1, n, what, err)
	}
	if replicas {
		f.checkTakeover(t, m, renewed, next)
		f.replaceFrozen(t, m, agent)
	}
}

// settle waits until one cluster has run every replica for a heartbeat and a stop
// budget on end: a woken agent that self-fenced stops its Pods (up to their grace
// period) and, when its term was still live, runs them again under it.
func (f *freezer) settle(t *testing.T, timeout time.Duration) string {
	t.Helper()
	span := f.heartbeat + reconciler.StopBudget(f.ttl)
	var runner string
	var since time.Time
	poll.For(t, timeout, "one cluster runs the workload, "+span.String()+" on end, after the freeze", func() bool {
		now := f.rec.Snapshot().Runner(int(workload.Replicas))
		if now == "" || now != runner {
			runner, since = now, time.Now()
			return false
		}
		return time.Since(since) >= span
	})
	return runner
}

// leader is the replica of m's agent that leads its election.
func (f *freezer) leader(t *testing.T, m *localfleet.Member) *process.Process {
	t.Helper()
	var found *process.Process
	poll.For(t, 30*time.Second, m.Name+"'s replicas have a leader", func() bool {
		found = m.Leader(t.Context(), f.replicas[m.Name][:]...)
		return found != nil
	})
	return found
}

// checkTakeover judges the replica elected during the freeze: it renewed the term
// (next, the first renewal after the frozen leader's last one) within a heartbeat of
// taking leadership over, as a recovering agent must: at once, not a heartbeat later.
func (f *freezer) checkTakeover(t *testing.T, m *localfleet.Member, renewed, next time.Time) {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := m.Client.Get(t.Context(), localfleet.ElectionLease, l); err != nil || l.Spec.AcquireTime == nil {
		t.Errorf("%s's election: %v", m.Name, err)
		return
	}
	elected := l.Spec.AcquireTime.Time
	switch {
	case !elected.After(renewed):
		t.Errorf("%s: no replica was elected during the freeze (the election was last acquired at %s)", m.Name, elected.Format("15:04:05.000"))
	case next.IsZero():
		t.Errorf("%s: the replica elected at %s did not renew the term before the frozen one woke", m.Name, elected.Format("15:04:05.000"))
	case next.Sub(elected) > f.heartbeat:
		t.Errorf("%s: the replica elected at %s renewed the term only %s later (heartbeat %s)", m.Name, elected.Format("15:04:05.000"), next.Sub(elected).Round(time.Millisecond), f.heartbeat)
	default:
		t.Logf("%s: the replica elected %s into the freeze renewed the term %s after its election", m.Name,
			elected.Sub(renewed).Round(time.Millisecond), next.Sub(elected).Round(time.Millisecond))
	}
}

// replaceFrozen waits for the frozen replica to exit, as a leader frozen past its
// election's lease does once it finds its leadership lost, and starts a standby in its
// place, serving admission where it did.
func (f *freezer) replaceFrozen(t *testing.T, m *localfleet.Member, frozen *process.Process) {
	t.Helper()
	// It notices within a renew deadline of waking; give it that and more.
	_, _ = poll.Until(t.Context(), f.timing.electionLease+10*time.Second, "the woken replica exits", poll.Condition(frozen.Exited))
	if !frozen.Exited() {
		t.Errorf("%s's frozen replica still runs after its election's lease: nobody took leadership over", m.Name)
		return
	}
	for slot, p := range f.replicas[m.Name] {
		if p == frozen {
			f.startReplica(t, m, slot)
		}
	}
}
