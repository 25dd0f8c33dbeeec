package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// The placement suite's fleet: cluster-1 is the preferred site (by the labels
// its agent registers), the others are backups; every agent heartbeats its
// cluster every second and looks at the fleet every second, and a cluster
// counts as healthy for clusterTTL after a heartbeat, so that one cut off
// turns unhealthy within seconds.
const (
	preferredCluster = "cluster-1"
	// stabilization is spec.placement.failback.stabilizationSeconds.
	stabilization = 8 * time.Second
	clusterTTL    = 3 * time.Second
	// unreadyFor is spec.failover.unreadySeconds; maxMoves and
	// failoverWindow its maxMoves and windowSeconds.
	unreadyFor     = 5 * time.Second
	maxMoves       = 2
	failoverWindow = 60 * time.Second
)

// The agent's Events on a BerthLease when placement moves its lease
// (reconciler's ReasonFailingBack, ReasonFailingOver, ReasonFailoverLimited).
const (
	reasonFailingBack     = "FailingBack"
	reasonFailingOver     = "FailingOver"
	reasonFailoverLimited = "FailoverLimited"
	reasonFailbackHeld    = "FailbackHeld"
)

// placement is what the suite sets as spec.placement: the clusters labelled
// site=primary first, failing back after stabilization.
func placement() *berthv1alpha1.Placement {
	return &berthv1alpha1.Placement{
		Preferred: []berthv1alpha1.ClusterPreference{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "primary"}}}},
		Failback:  &berthv1alpha1.Failback{StabilizationSeconds: int32(stabilization / time.Second)},
	}
}

// TestPlacement proves issue 17's placement and failover on three clusters:
// a holder whose Pods never become Ready hands the lease over, and stops
// moving once the lease moved maxMoves times in the window (FailoverLimited);
// an administrator's move to a named cluster lands there; the lease fails
// back to the preferred cluster once it has been healthy for the
// stabilization window after it returns, and not while it flaps; a
// failback that its destination did not take holds the next one off; and
// the lease API's term history is the one the recorder saw. The recorder judges
// every handover (no two clusters at once). One fleet serves the scenarios
// in turn.
func TestPlacement(t *testing.T) {
	w := workload
	w.Failover = &berthv1alpha1.Failover{UnreadySeconds: int32(unreadyFor / time.Second), MaxMoves: maxMoves, WindowSeconds: int32(failoverWindow / time.Second)}
	labels := map[string][]string{}
	for _, c := range []string{"cluster-1", "cluster-2", "cluster-3"} {
		site := "backup"
		if c == preferredCluster {
			site = "primary"
		}
		labels[c] = []string{"--cluster-labels", "site=" + site + ",suite=placement"}
	}
	r := startFleetWith(t, localfleet.Options{
		Workload:        w,
		AgentArgs:       []string{"--fleet-view-interval", "1s"},
		MemberAgentArgs: labels,
		LeaseAPIArgs:    []string{"--cluster-ttl", clusterTTL.String()},
	})
	p := &placementRun{run: r, probes: startProbes(t, r), moves: watchMoves(t, r)}
	holder, took := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	t.Logf("%s runs the workload %s after the fleet started", holder, took.Round(time.Millisecond))

	steps := []struct {
		name string
		step func(t *testing.T)
	}{
		{"unready workload fails over, then is limited", p.unready},
		{"move to a named cluster", p.moveTo},
		{"failback once the preferred cluster returns", p.failback},
		{"a flapping preferred cluster gets nothing", p.flapping},
		{"a failback not taken holds the next one off", p.notTaken},
		{"the lease API's history is the recorder's", p.history},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.step) {
			return // the next scenario starts from where this one should have left the fleet
		}
	}
}

// placementRun is the placement suite's fleet and what it learnt on the way.
type placementRun struct {
	*run
	probes *probes
	moves  *moveWatch
	// moved lists the terms the suite moved (or saw moved), by token, in
	// order: the lease API's history must end each of them "moved".
	moved []int32
}

// unready: the holder's Pods never become Ready (its kubelets' readiness
// probes fail), so after unreadySeconds it moves the lease to another
// cluster, whose Pods are Ready: the lease stays there. Then every cluster's
// Pods fail: the lease moves once more, after twice unreadySeconds (one move
// in a row brought it there, and its Pods were Ready for less than the
// window), and, after maxMoves moves in a row, stays where it is with a
// FailoverLimited Event, even once the first move is older than the
// window: it stays until its Pods have been Ready for the window.
func (p *placementRun) unready(t *testing.T) {
	from := p.lease(t)
	failed := time.Now()
	p.probes.fail(from.Holder)
	next, took := p.runner(t, unreadyFor+60*time.Second, "another cluster runs once "+from.Holder+"'s Pods stay unready", from.Holder)
	p.moved = append(p.moved, from.FencingToken)
	p.awaitEvent(t, from.Holder, corev1.EventTypeWarning, reasonFailingOver, failed)
	decided := p.movedAt(t, from.FencingToken, "")
	// The term began long before its Pods failed: the failover is due at once.
	t.Logf("%s's Pods unready (its term %d began %s before): %s moved the lease %s later, %s ran both replicas %s later",
		from.Holder, from.FencingToken, failed.Sub(from.AcquiredAt).Round(time.Millisecond), from.Holder,
		decided.Sub(failed).Round(time.Millisecond), next, took.Round(time.Millisecond))
	p.wantEnded(t, from.FencingToken, leaseapi.TermMoved)
	// next's Pods are Ready: it keeps the lease past unreadySeconds.
	p.stable(t, next, unreadyFor+3*time.Second)
	p.record(t, "failover of an unready workload", took)

	// Now the workload fails everywhere.
	second := p.lease(t)
	failed = time.Now()
	for _, m := range p.Members {
		p.probes.fail(m.Name)
	}
	third, took := p.runner(t, unreadyFor+60*time.Second, "another cluster runs once "+next+"'s Pods stay unready", next)
	p.moved = append(p.moved, second.FencingToken)
	ran := time.Now()
	p.awaitEvent(t, next, corev1.EventTypeWarning, reasonFailingOver, failed)
	// One move within the window: the failover backs off to twice
	// unreadySeconds (less a second: the Ready condition's time is kept in
	// whole seconds).
	if d := p.movedAt(t, second.FencingToken, "").Sub(failed); d < 2*unreadyFor-time.Second {
		t.Errorf("%s moved its term %d %s after its Pods turned unready, before the back-off (twice %s)", next, second.FencingToken, d, unreadyFor)
	} else {
		t.Logf("%s moved its term %d %s after its Pods turned unready (unreadySeconds %s, backed off by one move to %s)", next, second.FencingToken,
			d.Round(time.Millisecond), unreadyFor, 2*unreadyFor)
	}
	// third's Pods are unready from its term's start: it would move after
	// unreadySeconds, but the lease moved maxMoves times in the window.
	limited := p.awaitEvent(t, third, corev1.EventTypeWarning, reasonFailoverLimited, ran)
	if limited.IsZero() {
		t.FailNow()
	}
	last := p.lease(t)
	t.Logf("every cluster's Pods unready: %s moved the lease to %s, %s ran %s later; %s's term %d began at %s, limited %s later (maxMoves %d)",
		next, third, third, took.Round(time.Millisecond), third, last.FencingToken, last.AcquiredAt.Format("15:04:05.000"),
		limited.Sub(last.AcquiredAt).Round(time.Millisecond), maxMoves)
	if limited.Sub(last.AcquiredAt) < unreadyFor {
		t.Errorf("%s said FailoverLimited %s after its term began, before its Pods were unready for %s", third, limited.Sub(last.AcquiredAt), unreadyFor)
	}
	// A limit counted over a sliding window would let the lease go once the
	// first move left it; counted for the term, it holds while the Pods
	// stay unready.
	until := decided.Add(failoverWindow + unreadyFor + 3*time.Second)
	p.stable(t, third, max(unreadyFor+3*time.Second, time.Until(until)))
	if l := p.lease(t); l.Holder != third || l.FencingToken != last.FencingToken || l.Move != nil {
		t.Errorf("lease after FailoverLimited: %+v, want %s's term %d, not moving", l, third, last.FencingToken)
	} else {
		t.Logf("%s kept the lease, its Pods unready, %s after the first move in a row (window %s)", third, time.Since(decided).Round(time.Millisecond), failoverWindow)
	}
	if n := movedSince(p.terms(t), decided.Add(-time.Second)); n != maxMoves {
		t.Errorf("%d terms ended moved since the first failover, want maxMoves (%d)", n, maxMoves)
	}

	// The kubelets report the Pods Ready again; the failover policy goes.
	for _, m := range p.Members {
		p.probes.pass(m.Name)
	}
	p.setSpec(t, func(s *berthv1alpha1.BerthLeaseSpec) { s.Failover = nil })
}

// moveTo: an administrator moves the lease with berthctl to a named cluster
// (not the preferred one, which the next scenario fails back to), and waits
// for it: it lands there, even though the third cluster waits too.
func (p *placementRun) moveTo(t *testing.T) {
	from := p.lease(t)
	to := "cluster-2"
	if from.Holder == to {
		to = "cluster-3"
	}
	moved := time.Now()
	cmd := exec.Command(binaries.Path("berthctl"), "leases", "move", workload.Namespace+"/"+workload.Name, "--to", to, "--wait", "--timeout", "60s")
	cmd.Env = []string{"HOME=" + t.TempDir(), "BERTH_SERVER=" + p.LeaseAPI.URL, "BERTH_TOKEN_FILE=" + p.LeaseAPI.TokenFiles[localfleet.AdminSubject]}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("berthctl leases move --to %s --wait: %v\n%s", to, err, out)
	}
	t.Logf("berthctl: %s", strings.TrimSpace(string(out)))
	if want := "handed over: " + to + " holds it"; !strings.Contains(string(out), want) {
		t.Errorf("berthctl leases move --wait did not say %q", want)
	}
	next, _ := p.runner(t, ttl+30*time.Second, "a cluster runs after the move to "+to, from.Holder)
	took := time.Since(moved) // berthctl waited for the new term
	if next != to {
		t.Fatalf("the lease moved to %s to %s, not to %s", to, next, to)
	}
	p.moved = append(p.moved, from.FencingToken)
	p.movedAt(t, from.FencingToken, to)
	p.wantEnded(t, from.FencingToken, leaseapi.TermMoved)
	// The old holder handed the term over on purpose: it stopped its Pods
	// and gave the term up with Normal Events, nothing was lost, and no
	// BerthLeaseLost alert may fire for it.
	p.awaitEvent(t, from.Holder, corev1.EventTypeNormal, "Stopping", moved)
	p.awaitEvent(t, from.Holder, corev1.EventTypeNormal, "HandedOver", moved)
	p.noEvent(t, from.Holder, "Lost", moved)
	l := p.lease(t)
	t.Logf("berthctl moved %s's term %d to %s: %s's term began %s after berthctl started, and it ran both replicas %s after",
		from.Holder, from.FencingToken, to, to, l.AcquiredAt.Sub(moved).Round(time.Millisecond), took.Round(time.Millisecond))
	p.record(t, "administrator's move to a named cluster", took)
}

// failback: spec.placement prefers cluster-1. It has been healthy all
// along, so the holder moves the lease there (FailingBack). Then cluster-1 is
// cut from the lease API: another cluster takes over after the TTL. Once it
// is healed, the holder moves the lease back to it, no sooner than the
// stabilization window after the heal and within a handover of it.
func (p *placementRun) failback(t *testing.T) {
	set := time.Now()
	from := p.lease(t)
	p.setSpec(t, func(s *berthv1alpha1.BerthLeaseSpec) { s.Placement = placement() })
	took := p.runs(t, preferredCluster, stabilization+60*time.Second, "the preferred cluster runs once placement is set")
	p.awaitEvent(t, from.Holder, corev1.EventTypeNormal, reasonFailingBack, set)
	decided := p.movedAt(t, from.FencingToken, preferredCluster)
	p.moved = append(p.moved, from.FencingToken)
	p.wantEnded(t, from.FencingToken, leaseapi.TermMoved)
	t.Logf("placement set while %s held: it moved the lease %s later (%s was healthy all along), %s ran both replicas %s later",
		from.Holder, decided.Sub(set).Round(time.Millisecond), preferredCluster, preferredCluster, took.Round(time.Millisecond))

	m := p.Member(preferredCluster)
	cut := time.Now()
	m.Proxy.Cut()
	backup, over := p.runner(t, ttl+30*time.Second, "a backup cluster runs after "+preferredCluster+" was cut off", preferredCluster)
	p.awaitHealthy(t, preferredCluster, false, clusterTTL+10*time.Second)
	t.Logf("%s cut from the lease API at %s: %s ran %s later", preferredCluster, cut.Format("15:04:05.000"), backup, over.Round(time.Millisecond))
	// A moment for the backup's agent to see it unhealthy.
	time.Sleep(2 * time.Second)
	p.failbackAfterHeal(t, "failback once the preferred cluster returns", backup)
}

// failbackAfterHeal heals the preferred cluster, which backup is running
// in its place, and judges the failback: backup decides it no sooner than
// the stabilization window after the heal, and the preferred cluster runs
// within that window and a handover.
func (p *placementRun) failbackAfterHeal(t *testing.T, scenario, backup string) {
	t.Helper()
	from := p.lease(t)
	if from.Holder != backup {
		t.Fatalf("lease before the heal: %+v, want %s's", from, backup)
	}
	healed := time.Now()
	p.Member(preferredCluster).Proxy.Heal()
	healthy := p.awaitHealthy(t, preferredCluster, true, 20*time.Second)
	took := p.runs(t, preferredCluster, stabilization+60*time.Second, "the preferred cluster runs after it returned")
	p.awaitEvent(t, backup, corev1.EventTypeNormal, reasonFailingBack, healed)
	decided := p.movedAt(t, from.FencingToken, preferredCluster)
	p.moved = append(p.moved, from.FencingToken)
	p.wantEnded(t, from.FencingToken, leaseapi.TermMoved)
	var ended time.Time
	for _, term := range p.terms(t) {
		if term.FencingToken == from.FencingToken {
			ended = term.EndedAt
		}
	}
	t.Logf("%s: %s healed at %s and healthy %s later; %s decided to fail back %s after the heal (stabilization %s), its term ended %s after the heal, %s ran both replicas %s after the heal",
		scenario, preferredCluster, healed.Format("15:04:05.000"), healthy.Round(time.Millisecond), backup, decided.Sub(healed).Round(time.Millisecond), stabilization,
		ended.Sub(healed).Round(time.Millisecond), preferredCluster, took.Round(time.Millisecond))
	if decided.Sub(healed) < stabilization {
		t.Errorf("%s failed back %s after %s was healed, within the stabilization window (%s)", backup, decided.Sub(healed), preferredCluster, stabilization)
	}
	p.record(t, scenario, took)
}

// flapping: with a backup holding, the preferred cluster is healed and cut
// again and again, each healthy stretch shorter than the stabilization
// window and each cut longer than --cluster-ttl (so that it really turns
// unhealthy, and every agent's fleet view sees it): the lease does not move.
// Once it stays healthy, the lease fails back.
func (p *placementRun) flapping(t *testing.T) {
	m := p.Member(preferredCluster)
	m.Proxy.Cut()
	backup, _ := p.runner(t, ttl+30*time.Second, "a backup cluster runs after "+preferredCluster+" was cut off", preferredCluster)
	p.awaitHealthy(t, preferredCluster, false, clusterTTL+10*time.Second)
	time.Sleep(2 * time.Second)
	before := p.lease(t)
	movesBefore := movedSince(p.terms(t), time.Time{})

	const flaps = 3
	var longest time.Duration
	for i := range flaps {
		healed := time.Now()
		m.Proxy.Heal()
		up := p.awaitHealthy(t, preferredCluster, true, 10*time.Second)
		time.Sleep(time.Until(healed.Add(2 * time.Second)))
		m.Proxy.Cut()
		down := p.awaitHealthy(t, preferredCluster, false, clusterTTL+10*time.Second)
		// Healthy, as the test saw it, from up after the heal to down after it.
		stretch := time.Since(healed) - up
		longest = max(longest, stretch)
		t.Logf("flap %d: %s healthy %s after the heal, for about %s; unhealthy %s after the cut", i+1, preferredCluster,
			up.Round(time.Millisecond), stretch.Round(time.Millisecond), down.Round(time.Millisecond))
		time.Sleep(1500 * time.Millisecond) // every fleet view (1 s) sees it unhealthy
	}
	if longest >= stabilization {
		t.Fatalf("the flaps were not shorter than the stabilization window: %s healthy for %s on end", preferredCluster, longest)
	}
	if l := p.lease(t); l.Holder != backup || l.FencingToken != before.FencingToken || l.Move != nil {
		t.Errorf("lease after %d flaps of %s: %+v, want %s's term %d, not moving", flaps, preferredCluster, l, backup, before.FencingToken)
	}
	if n := movedSince(p.terms(t), time.Time{}); n != movesBefore {
		t.Errorf("the lease moved %d times while %s flapped", n-movesBefore, preferredCluster)
	}
	if got := p.rec.Snapshot().Runner(int(workload.Replicas)); got != backup {
		t.Errorf("after the flaps %q runs, want %s", got, backup)
	}
	t.Logf("%s flapped %d times (healthy for %s at most at a time, stabilization %s): the lease stayed on %s, term %d",
		preferredCluster, flaps, longest.Round(time.Millisecond), stabilization, backup, before.FencingToken)
	p.failbackAfterHeal(t, "failback after the preferred cluster flapped", backup)
}

// notTaken: the preferred cluster loses its BerthLease (a GitOps tool
// pruned it there by mistake), so it cannot take the lease. A backup holds
// it and, once cluster-1 has been healthy for the stabilization window,
// fails back to it; nobody takes the move within its reservation, and a
// backup takes the lease again. The history shows the move not taken to
// every agent: the new holder holds its own failback off for the window
// (FailbackHeld), so the lease does not circle through a cluster that
// cannot run it. Once the BerthLease is back, the failback lands.
func (p *placementRun) notTaken(t *testing.T) {
	m := p.Member(preferredCluster)
	if _, err := p.LeaseAPI.Admin.Cordon(t.Context(), preferredCluster); err != nil {
		t.Fatal(err)
	}
	backup, _ := p.runner(t, ttl+30*time.Second, "a backup cluster runs after "+preferredCluster+" was cordoned", preferredCluster)
	bl := m.BerthLease(t.Context())
	if err := m.Client.Delete(t.Context(), &bl); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, preferredCluster+"'s BerthLease is gone", func() bool { return m.BerthLease(t.Context()).Name == "" })
	first := p.lease(t)
	if first.Holder != backup {
		t.Fatalf("lease before %s is uncordoned: %+v, want %s's", preferredCluster, first, backup)
	}
	uncordoned := time.Now()
	if _, err := p.LeaseAPI.Admin.Uncordon(t.Context(), preferredCluster); err != nil {
		t.Fatal(err)
	}

	// backup fails back to cluster-1 after the window; the move is not
	// taken, and a backup holds the next term.
	var next leaseapi.Lease
	poll.For(t, stabilization+ttl+30*time.Second, "a backup holds the term after the move not taken", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		l, err := p.LeaseAPI.Admin.GetLease(ctx, workload.Namespace, workload.Name)
		next = l
		return err == nil && l.Holder != "" && l.FencingToken > first.FencingToken
	})
	p.moved = append(p.moved, first.FencingToken)
	p.wantEnded(t, first.FencingToken, leaseapi.TermMoved)
	if at, to, seen := p.moves.first(first.FencingToken); seen && to != preferredCluster {
		t.Errorf("term %d was moved to %q at %s, want %s", first.FencingToken, to, at.Format("15:04:05.000"), preferredCluster)
	}
	var moved time.Time
	for _, term := range p.terms(t) {
		if term.FencingToken == first.FencingToken {
			moved = term.EndedAt
		}
	}
	if next.Holder == preferredCluster || next.AcquiredAt.Sub(moved) < ttl {
		t.Fatalf("term %d (%s) began %s after %s's term %d moved to %s: want a backup's, after the reservation (%s)",
			next.FencingToken, next.Holder, next.AcquiredAt.Sub(moved), backup, first.FencingToken, preferredCluster, ttl)
	}
	held := p.awaitEvent(t, next.Holder, corev1.EventTypeNormal, reasonFailbackHeld, uncordoned)
	t.Logf("%s uncordoned at %s without its BerthLease: %s failed back to it %s later, not taken; %s's term %d began %s after the move, and held failback off %s after it began",
		preferredCluster, uncordoned.Format("15:04:05.000"), backup, moved.Sub(uncordoned).Round(time.Millisecond),
		next.Holder, next.FencingToken, next.AcquiredAt.Sub(moved).Round(time.Millisecond), held.Sub(next.AcquiredAt).Round(time.Millisecond))

	// The BerthLease is back, as the placement suite has it: the held
	// failback lands once the window from the next term's start has passed.
	restored := time.Now()
	if err := m.ApplyWorkload(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.setSpec(t, func(s *berthv1alpha1.BerthLeaseSpec) { s.Failover, s.Placement = nil, placement() })
	took := p.runs(t, preferredCluster, stabilization+60*time.Second, "the preferred cluster runs once its BerthLease is back")
	decided := p.movedAt(t, next.FencingToken, preferredCluster)
	p.moved = append(p.moved, next.FencingToken)
	p.wantEnded(t, next.FencingToken, leaseapi.TermMoved)
	t.Logf("BerthLease back in %s at %s: %s failed back %s after its term began (stabilization %s), %s ran both replicas %s after the BerthLease was back",
		preferredCluster, restored.Format("15:04:05.000"), next.Holder, decided.Sub(next.AcquiredAt).Round(time.Millisecond), stabilization,
		preferredCluster, took.Round(time.Millisecond))
	if decided.Sub(next.AcquiredAt) < stabilization {
		t.Errorf("%s failed back %s after its term began, within the hold after a move not taken (%s)", next.Holder, decided.Sub(next.AcquiredAt), stabilization)
	}
	p.record(t, "failback held after a move not taken", took)
}

// history: the lease API's terms, oldest first, are the terms the recorder
// saw run, holder and token in order; each ran within its term at the lease
// API; the terms the suite moved ended "moved".
func (p *placementRun) history(t *testing.T) {
	terms := p.terms(t)
	slices.Reverse(terms) // oldest first
	seen := p.rec.Snapshot().Terms()
	var api, rec []string
	for _, term := range terms {
		api = append(api, fmt.Sprintf("%s/%d", term.Holder, term.FencingToken))
	}
	for _, term := range seen {
		rec = append(rec, fmt.Sprintf("%s/%d", term.Cluster, term.Token))
	}
	t.Logf("lease API's history: %s", strings.Join(api, " "))
	t.Logf("recorder's terms:    %s", strings.Join(rec, " "))
	if !slices.Equal(api, rec) {
		t.Fatalf("the lease API's history is not what the recorder saw")
	}
	for i, term := range terms {
		run := seen[i]
		// A sweep's time is taken before it reads: allow one sweep.
		if run.First.Before(term.AcquiredAt.Add(-sweepInterval)) {
			t.Errorf("%s ran term %d from %s, before the lease API granted it at %s", run.Cluster, run.Token,
				run.First.Format("15:04:05.000"), term.AcquiredAt.Format("15:04:05.000"))
		}
		if !term.EndedAt.IsZero() && run.Last.After(term.EndedAt) {
			t.Errorf("%s ran term %d until %s, after the lease API ended it at %s", run.Cluster, run.Token,
				run.Last.Format("15:04:05.000"), term.EndedAt.Format("15:04:05.000"))
		}
		end := "live"
		if !term.EndedAt.IsZero() {
			end = fmt.Sprintf("ended %s (%s)", term.EndedAt.Format("15:04:05.000"), term.Ending)
		}
		t.Logf("term %d: %s from %s, %s; ran from %s to %s", term.FencingToken, term.Holder,
			term.AcquiredAt.Format("15:04:05.000"), end, run.First.Format("15:04:05.000"), run.Last.Format("15:04:05.000"))
	}
	var moved []int32
	for _, term := range terms {
		if term.Ending == leaseapi.TermMoved {
			moved = append(moved, term.FencingToken)
		}
	}
	if !slices.Equal(moved, p.moved) {
		t.Errorf("terms ended moved: %v, want the ones the suite moved: %v", moved, p.moved)
	}
}

// lease is the lease API's record of the workload's lease.
func (p *placementRun) lease(t *testing.T) leaseapi.Lease {
	t.Helper()
	l, err := p.LeaseAPI.Admin.GetLease(t.Context(), workload.Namespace, workload.Name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// terms is the lease's history at the lease API, newest first.
func (p *placementRun) terms(t *testing.T) []leaseapi.Term {
	t.Helper()
	terms, err := p.LeaseAPI.Admin.History(t.Context(), workload.Namespace, workload.Name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return terms
}

// wantEnded fails the test unless the term of token ended as ending.
func (p *placementRun) wantEnded(t *testing.T, token int32, ending string) {
	t.Helper()
	for _, term := range p.terms(t) {
		if term.FencingToken == token {
			if term.Ending != ending || term.EndedAt.IsZero() {
				t.Errorf("term %d of %s: ended %q at %s, want %q", token, term.Holder, term.Ending, term.EndedAt, ending)
			}
			return
		}
	}
	t.Errorf("term %d is not in the lease API's history", token)
}

// movedSince counts the terms that ended moved after since.
func movedSince(terms []leaseapi.Term, since time.Time) int {
	n := 0
	for _, term := range terms {
		if term.Ending == leaseapi.TermMoved && term.EndedAt.After(since) {
			n++
		}
	}
	return n
}

// runs waits until cluster runs every replica, and returns how long that took.
func (p *placementRun) runs(t *testing.T, cluster string, timeout time.Duration, what string) time.Duration {
	t.Helper()
	return poll.For(t, timeout, what, func() bool { return p.rec.Snapshot().Runner(int(workload.Replicas)) == cluster })
}

// awaitHealthy waits until the lease API reports cluster healthy (or not),
// and returns how long that took.
func (p *placementRun) awaitHealthy(t *testing.T, cluster string, healthy bool, timeout time.Duration) time.Duration {
	t.Helper()
	return poll.For(t, timeout, fmt.Sprintf("the lease API reports %s healthy=%t", cluster, healthy), func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		clusters, err := p.LeaseAPI.Admin.ListClusters(ctx)
		if err != nil {
			return false
		}
		for _, c := range clusters {
			if c.ID == cluster {
				return c.Healthy == healthy
			}
		}
		return !healthy
	})
}

// setSpec changes the BerthLease's spec in every cluster, as a GitOps tool
// applying a new revision would.
func (p *placementRun) setSpec(t *testing.T, change func(*berthv1alpha1.BerthLeaseSpec)) {
	t.Helper()
	if err := p.SetSpec(t.Context(), change); err != nil {
		t.Fatal(err)
	}
}

// awaitEvent waits for an Event of reason and type on cluster's BerthLease,
// emitted (or last observed) at or after since, and logs it. client-go's
// events recorder folds repeats of one Event into a series and sends the
// counts after the second only every 30 minutes, so a repeat of an Event
// already counted twice cannot be seen: that is logged, not failed.
func (p *placementRun) awaitEvent(t *testing.T, cluster, eventType, reason string, since time.Time) (at time.Time) {
	t.Helper()
	m := p.Member(cluster)
	var found, series *corev1.Event
	_, err := poll.Until(t.Context(), 20*time.Second, "", func(ctx context.Context) (bool, error) {
		events, err := berthLeaseEvents(ctx, m, reason)
		if err != nil {
			return false, nil
		}
		for _, e := range events {
			if e.Series != nil && e.Series.Count >= 2 {
				series = e
			}
			if !eventTime(e).Before(since.Truncate(time.Second)) {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	switch {
	case err == nil:
		if found.Type != eventType {
			t.Errorf("%s: Event %s is %s, want %s", cluster, reason, found.Type, eventType)
		}
		t.Logf("%s: %s Event %s at %s: %s", cluster, found.Type, reason, eventTime(found).Format("15:04:05.000"), found.Message)
		return eventTime(found)
	case series != nil:
		t.Logf("%s: %s Event %s not seen again since %s: it is a series (count %d, last sent %s), whose later counts client-go sends every 30 minutes",
			cluster, series.Type, reason, since.Format("15:04:05.000"), series.Series.Count, eventTime(series).Format("15:04:05.000"))
	default:
		t.Errorf("no %s Event %s on %s's BerthLease since %s", eventType, reason, cluster, since.Format("15:04:05.000"))
	}
	return time.Time{}
}

// noEvent fails the test when cluster's agent recorded an Event with reason
// on the BerthLease since then.
func (p *placementRun) noEvent(t *testing.T, cluster, reason string, since time.Time) {
	t.Helper()
	events, err := berthLeaseEvents(t.Context(), p.Member(cluster), reason)
	if err != nil {
		t.Fatalf("listing %s's Events: %v", cluster, err)
	}
	for _, e := range events {
		if !eventTime(e).Before(since.Truncate(time.Second)) {
			t.Errorf("%s: %s Event %s at %s: %s", cluster, e.Type, reason, eventTime(e).Format("15:04:05.000"), e.Message)
		}
	}
}

// berthLeaseEvents lists the Events with reason on m's BerthLease.
func berthLeaseEvents(ctx context.Context, m *localfleet.Member, reason string) ([]*corev1.Event, error) {
	events := &corev1.EventList{}
	if err := m.Client.List(ctx, events, ctrlclient.InNamespace(workload.Namespace)); err != nil {
		return nil, err
	}
	var out []*corev1.Event
	for i := range events.Items {
		e := &events.Items[i]
		if e.Reason == reason && e.InvolvedObject.Kind == "BerthLease" && e.InvolvedObject.Name == workload.Name {
			out = append(out, e)
		}
	}
	return out, nil
}

// eventTime is when an Event was last observed: its series' last
// observation, its eventTime (events.k8s.io/v1, microseconds), or, for the
// older API, its timestamps.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// moveWatch reads the lease every 100 ms and keeps when each term was first
// seen moving (the holder's agent's decision, to a poll's accuracy), and to
// where.
type moveWatch struct {
	mu   sync.Mutex
	seen map[int32]time.Time
	to   map[int32]string
}

func watchMoves(t *testing.T, r *run) *moveWatch {
	w := &moveWatch{seen: map[int32]time.Time{}, to: map[int32]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			l, err := r.LeaseAPI.Admin.GetLease(rctx, workload.Namespace, workload.Name)
			rcancel()
			if at := time.Now(); err == nil && l.Move != nil {
				w.mu.Lock()
				if _, ok := w.seen[l.FencingToken]; !ok {
					w.seen[l.FencingToken], w.to[l.FencingToken] = at, l.Move.To
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(poll.Interval):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// first is when the term of token was first seen moving, and to where.
func (w *moveWatch) first(token int32) (at time.Time, to string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok = w.seen[token]
	return at, w.to[token], ok
}

// movedAt is when the term of token was first seen moving; it fails the
// test unless the term moved to to ("" for any cluster). A holder whose
// Pods go at once (kwok deletes them without a kubelet's wait) may stop and
// release between two of the watch's reads: then the history speaks for
// the move (the term ended moved, and the next term is to's), and the
// term's end stands for the decision, which came no later.
func (p *placementRun) movedAt(t *testing.T, token int32, to string) time.Time {
	t.Helper()
	if at, dest, ok := p.moves.first(token); ok {
		if dest != to {
			t.Errorf("term %d was moved to %q, want %q", token, dest, to)
		}
		return at
	}
	terms := p.terms(t)
	slices.Reverse(terms) // oldest first
	i := slices.IndexFunc(terms, func(term leaseapi.Term) bool { return term.FencingToken == token })
	if i < 0 || terms[i].Ending != leaseapi.TermMoved {
		t.Fatalf("term %d was never seen moving at the lease API, and its history does not end it moved", token)
	}
	if to != "" && (i+1 == len(terms) || terms[i+1].Holder != to) {
		t.Errorf("term %d ended moved, but the next term is not %s's: %+v", token, to, terms[i+1:])
	}
	t.Logf("term %d moved between two reads of the lease: its end in the history, %s, stands for the decision",
		token, terms[i].EndedAt.Format("15:04:05.000"))
	return terms[i].EndedAt
}

// probes plays the readiness probes of each cluster's kubelets (kwok reports
// every Pod it runs Ready): on a failing cluster, each bound managed Pod of
// the workload is reported not Ready as soon as it is seen Ready, as a
// kubelet whose readiness probe fails would report it; pass reports them
// Ready again.
type probes struct {
	r       *run
	mu      sync.Mutex
	failing map[string]bool
	// logged are the clusters whose probes' failure to report was logged.
	logged map[string]bool
	// reporting is held while Pods are reported, so that a report of
	// failing probes cannot land after pass reported them Ready.
	reporting sync.Mutex
}

// logOnce logs the first failure to report a cluster's Pods.
func (pr *probes) logOnce(t *testing.T, cluster string, err error) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pr.logged[cluster] {
		pr.logged[cluster] = true
		t.Logf("%s: report Pods not Ready: %v", cluster, err)
	}
}

// startProbes looks at every cluster's Pods every 100 ms until the test ends.
func startProbes(t *testing.T, r *run) *probes {
	pr := &probes{r: r, failing: map[string]bool{}, logged: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, m := range r.Members {
		wg.Go(func() {
			for ctx.Err() == nil {
				pr.reporting.Lock()
				pr.mu.Lock()
				failing := pr.failing[m.Name]
				pr.mu.Unlock()
				if failing {
					if err := setReady(ctx, m, false); err != nil && ctx.Err() == nil {
						pr.logOnce(t, m.Name, err)
					}
				}
				pr.reporting.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return pr
}

func (pr *probes) fail(cluster string) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.failing[cluster] = true
}

func (pr *probes) pass(cluster string) {
	pr.mu.Lock()
	pr.failing[cluster] = false
	pr.mu.Unlock()
	pr.reporting.Lock()
	defer pr.reporting.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = setReady(ctx, pr.r.Member(cluster), true)
}

// setReady reports m's bound, running managed Pods of the workload Ready or
// not, as their kubelet would.
func setReady(ctx context.Context, m *localfleet.Member, ready bool) error {
	pods := &corev1.PodList{}
	if err := m.Client.List(ctx, pods, ctrlclient.InNamespace(workload.Namespace), ctrlclient.MatchingLabels{reconciler.ManagedLease: workload.Name}); err != nil {
		return err
	}
	var errs []error
	status := corev1.ConditionFalse
	reason, message := "", ""
	if ready {
		status = corev1.ConditionTrue
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		before := pod.DeepCopy()
		if !ready {
			var names []string
			for _, c := range pod.Spec.Containers {
				names = append(names, c.Name)
			}
			reason, message = "ContainersNotReady", "containers with unready status: ["+strings.Join(names, " ")+"]"
		}
		changed := false
		for j := range pod.Status.Conditions {
			c := &pod.Status.Conditions[j]
			if (c.Type == corev1.PodReady || c.Type == corev1.ContainersReady) && c.Status != status {
				c.Status, c.LastTransitionTime = status, metav1.Now()
				c.Reason, c.Message = reason, message
				changed = true
			}
		}
		for j := range pod.Status.ContainerStatuses {
			pod.Status.ContainerStatuses[j].Ready = ready
		}
		if changed {
			if err := m.Client.Status().Patch(ctx, pod, ctrlclient.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
