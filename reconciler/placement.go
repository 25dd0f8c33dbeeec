package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	leasemachine "github.com/berthfleet/berth/leaseapi/lease"
)

// Reasons of the Events placement emits on a BerthLease.
const (
	// ReasonFailingBack (Normal): the holder moves the lease to a more
	// preferred cluster that has been healthy for the stabilization window.
	ReasonFailingBack = berthv1alpha1.FailingBackReason
	// ReasonFailingOver (Warning): the holder's Pods stayed not Ready for
	// spec.failover.unreadySeconds; it moves the lease to another cluster.
	ReasonFailingOver = berthv1alpha1.FailingOverReason
	// ReasonFailoverLimited (Warning): the Pods are not Ready, but the lease
	// moved spec.failover.maxMoves times in a row: it stays.
	ReasonFailoverLimited = berthv1alpha1.FailoverLimitedReason
	// ReasonInvalidPlacement (Warning): a selector of
	// spec.placement.preferred does not parse; no failback is made.
	ReasonInvalidPlacement = berthv1alpha1.InvalidPlacementReason
	// ReasonFailbackHeld (Normal): a more preferred cluster is stable, but
	// the history holds the failback off (moves not taken by their
	// destination, or maxMoves moves within the window).
	ReasonFailbackHeld = berthv1alpha1.FailbackHeldReason
	// ReasonPlacementIgnored (Warning): spec.placement's failback or
	// spec.failover asks for what this agent cannot do (no --cluster-id,
	// or failover without --managed-workloads).
	ReasonPlacementIgnored = berthv1alpha1.PlacementIgnoredReason
)

// ClusterView is the fleet as this agent last saw it at the lease API
// (fleet.View): what failback decides on, and where failover may go.
type ClusterView interface {
	// Clusters returns the registered clusters, and false when the view is
	// not current (the last look at the lease API failed): no failback is
	// decided on an old view.
	Clusters() ([]ViewedCluster, bool)
}

// ViewedCluster is one registered cluster as the fleet view saw it.
type ViewedCluster struct {
	ID     string
	Labels map[string]string
	// HealthySince is since when the view has seen the cluster healthy
	// (heartbeating and not cordoned) at every look, without a break; zero
	// when it is not healthy now.
	HealthySince time.Time
}

// Mover is what a LeaseClient may also offer for placement
// (leaseclient.Client does): moving a term, a lease's term history, which
// counts the moves, and the lease's record, whose last renewal ties the
// history's times (the lease API's clock) to the agent's.
type Mover interface {
	Move(ctx context.Context, namespace, name, holder string, fencingToken int32, to string) (leaseapi.Lease, error)
	History(ctx context.Context, namespace, name string, limit int) ([]leaseapi.Term, error)
	LeaseReader
}

var _ Mover = (*leaseclient.Client)(nil)

// placementMemory is what placement keeps of one BerthLease between
// reconciles. Only the BerthLease's reconcile touches it (one at a time).
type placementMemory struct {
	// token is the term the rest is about.
	token int32
	// activeSince is when this agent first saw the term active (its Pods
	// may run): unreadiness counts from then at the earliest.
	activeSince time.Time
	// limited: the FailoverLimited Event was emitted for this term.
	limited bool
	// invalid: the InvalidPlacement Event was emitted for this term.
	invalid bool
	// ignored: the PlacementIgnored Event was emitted for this term.
	ignored bool
	// held: the FailbackHeld Event was emitted for this term.
	held bool
	// notReadySeen is, for each running Pod this agent has seen not Ready
	// in this term, when it first saw it so: unreadiness counts from then at
	// the earliest, whatever the clock of the Pod's kubelet says.
	notReadySeen map[types.UID]time.Time
	// readySince is since when this agent has seen every running Pod
	// Ready (zero while one is not). settled: they stayed Ready for the
	// failover window in this term, so the moves that brought the lease
	// here no longer count against a failover.
	readySince time.Time
	settled    bool
	// limitedNow: failover is limited and the Pods are unready now, so
	// failback waits too (it would only start the circle anew).
	limitedNow bool
	// movesBefore counts the moves in a row that brought the lease to this
	// term, in the window movesWindow (zero: not counted yet). The history
	// before the term does not change, so a limited term, reconciled at
	// every change of its Pods, reads it once.
	movesBefore int
	movesWindow time.Duration
}

// place is spec.placement's failback and spec.failover's health-based
// failover, for a term this cluster holds and runs: it moves the term to
// another cluster when the Pods stayed not Ready too long, or when a more
// preferred cluster has been healthy for the stabilization window. A move
// is a handover like a cordon: the lease API revokes the term and reserves
// the lease for the next holder; the next reconcile stops the Pods and
// gives the term up. It returns when to look again (zero: at the next
// event; now: at once, the term moved).
func (r *BerthLeaseReconciler) place(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation, d Decision) time.Time {
	spec, mem := bl.Spec, p.mem
	if spec.Failover == nil && (spec.Placement == nil || spec.Placement.Failback == nil) || d.Phase != PhaseActive || !p.facts.MayRun() || mem.gone || mem.superseded {
		return time.Time{}
	}
	now, term := r.Clock.Now(), p.facts.Term
	pm := &mem.placement
	if pm.token != term.Token {
		*pm = placementMemory{token: term.Token, activeSince: now}
	}
	// Set by failover below, for this reconcile: no failover, no limit.
	pm.limitedNow = false
	failback, failover, ignored := r.placeable(spec)
	if ignored != "" && !pm.ignored {
		pm.ignored = true
		if r.Recorder != nil {
			r.Recorder.Eventf(bl, nil, corev1.EventTypeWarning, ReasonPlacementIgnored, "Placement", "%s", ignored)
		}
	}
	if !failback && !failover {
		return time.Time{}
	}
	log := logr.FromContextOrDiscard(ctx)
	mover, ok := r.LeaseClient.(Mover)
	if !ok || r.moveUnsupported.Load() {
		// Logged once, when the lease API answered that it has no moves.
		return time.Time{}
	}
	pl := placer{r: r, bl: bl, mem: mem, mover: mover, term: term, now: now, log: log}

	var wake time.Time
	if failover {
		moved, next := pl.failover(ctx, pm, p.running)
		if moved {
			return now
		}
		wake = next
	}
	if failback {
		moved, next := pl.failback(ctx, pm)
		if moved {
			return now
		}
		wake = earliestSet(wake, next)
	}
	return wake
}

// placeable says whether this agent acts on spec's failback and failover,
// and why it ignores what it does not (empty: nothing).
func (r *BerthLeaseReconciler) placeable(spec berthv1alpha1.BerthLeaseSpec) (failback, failover bool, ignored string) {
	var why []string
	if spec.Placement != nil && spec.Placement.Failback != nil {
		if failback = r.ClusterIdentity != "" && r.Fleet != nil; !failback {
			why = append(why, "spec.placement.failback is ignored: it needs the agent's --cluster-id (and its view of the fleet)")
		}
	}
	switch {
	case spec.Failover == nil:
	case r.ClusterIdentity == "":
		why = append(why, "spec.failover is ignored: it needs the agent's --cluster-id")
	case !r.ManagedWorkloads:
		why = append(why, "spec.failover is ignored: it needs the agent's --managed-workloads, without which the agent does not know the Pods")
	default:
		failover = true
	}
	return failback, failover, strings.Join(why, "; ")
}

// placer carries one reconcile's placement decision.
type placer struct {
	r     *BerthLeaseReconciler
	bl    *berthv1alpha1.BerthLease
	mem   *memory
	mover Mover
	term  *Term
	now   time.Time
	log   logr.Logger
	// terms is the lease's history, read once when needed (history).
	terms []leaseapi.Term
	read  bool
}

// failover moves the term to any other cluster once a Pod has stayed not
// Ready for unreadySeconds, backed off by the moves in a row that brought
// the lease here, unless those are maxMoves already.
func (pl *placer) failover(ctx context.Context, pm *placementMemory, running []corev1.Pod) (moved bool, wake time.Time) {
	f := pl.bl.Spec.Failover
	unready := time.Duration(f.UnreadySeconds) * time.Second
	since := pm.unreadySince(running, pl.now)
	if since.IsZero() {
		if len(running) > 0 && pm.readySince.IsZero() {
			pm.readySince = pl.now
		}
		return false, time.Time{}
	}
	window := failoverWindow(f)
	if !pm.readySince.IsZero() && since.Sub(pm.readySince) >= window {
		pm.settled = true
	}
	pm.readySince = time.Time{}
	if due := since.Add(unready); pl.now.Before(due) {
		pl.log.V(1).Info("Pods not Ready; failover due later", "unreadySince", since, "due", due)
		return false, due
	}
	// The moves are counted as of the start of this term, which neither
	// an agent restart nor new Pods change, so a limited holder keeps the
	// lease for as long as its Pods are not Ready; once they have stayed
	// Ready for the window here, those moves no longer count.
	n := 0
	if !pm.settled {
		var err error
		if n, err = pl.movesBefore(ctx, pm); err != nil {
			pl.log.Error(err, "cannot read the lease's history to count its moves; trying again later")
			return false, pl.retry()
		}
	}
	if n >= int(cmp.Or(f.MaxMoves, defaultMaxMoves)) {
		pm.limitedNow = true
		if !pm.limited {
			pm.limited = true
			pl.event(corev1.EventTypeWarning, ReasonFailoverLimited, fmt.Sprintf(
				"Pods not Ready for %s, but the lease moved %d times in a row, each within %s of the next (spec.failover.maxMoves): it stays here until its Pods have been Ready for %s",
				pl.now.Sub(since).Round(time.Second), n, window, window))
		}
		return false, time.Time{} // the Pods' watch wakes the BerthLease
	}
	// Back off: each move in a row before this one doubles how long the
	// Pods must stay unready here, so a workload that fails everywhere
	// slows down until maxMoves stops it.
	wait := backoff(unready, window, n)
	if due := since.Add(wait); pl.now.Before(due) {
		pl.log.V(1).Info("Pods not Ready; failover backs off", "unreadySince", since, "movesInARow", n, "due", due)
		return false, due
	}
	if pl.r.Fleet != nil {
		// A move with nowhere to go only stops the workload for a TTL and
		// brings the lease back here. The view wakes the BerthLease when
		// another cluster turns healthy.
		if view, current := pl.r.Fleet.Clusters(); current && !slices.ContainsFunc(view, func(c ViewedCluster) bool { return c.ID != pl.r.ClusterIdentity && !c.HealthySince.IsZero() }) {
			pl.log.V(1).Info("Pods not Ready, but no other cluster is healthy to fail over to", "unreadySince", since)
			return false, time.Time{}
		}
	}
	why := fmt.Sprintf("spec.failover.unreadySeconds %d", f.UnreadySeconds)
	if n > 0 {
		why += fmt.Sprintf(", backed off to %s by %d moves in a row", wait, n)
	}
	note := fmt.Sprintf("Pods not Ready for %s (%s): moving the lease to another cluster", pl.now.Sub(since).Round(time.Second), why)
	if !pl.move(ctx, "", corev1.EventTypeWarning, ReasonFailingOver, note) {
		return false, pl.retry()
	}
	return true, time.Time{}
}

// retry is when a placement step that failed (a move refused, a history
// not read) is tried again.
func (pl *placer) retry() time.Time {
	return pl.now.Add(retryInterval(time.Duration(pl.bl.Spec.HeartbeatIntervalSeconds) * time.Second))
}

// failback moves the term to the most preferred cluster that ranks above
// this one and has been healthy for the stabilization window.
func (pl *placer) failback(ctx context.Context, pm *placementMemory) (moved bool, wake time.Time) {
	pl0 := pl.bl.Spec.Placement
	view, current := pl.r.Fleet.Clusters()
	if !current {
		// The view wakes placement when it is current again.
		return false, time.Time{}
	}
	if err := validPreferences(pl0.Preferred); err != nil {
		if !pm.invalid {
			pm.invalid = true
			pl.event(corev1.EventTypeWarning, ReasonInvalidPlacement, fmt.Sprintf("no failback: %v", err))
		}
		return false, time.Time{} // an edit of the spec wakes the BerthLease
	}
	if pm.limitedNow {
		// A workload unready everywhere would only circle again.
		pl.log.V(1).Info("failback waits: failover is limited and the Pods are not Ready")
		return false, time.Time{}
	}
	stabilization := time.Duration(cmp.Or(pl0.Failback.StabilizationSeconds, defaultStabilizationSeconds)) * time.Second
	// Without the history first: it is read only once a target is due.
	target, due := failbackTarget(pl0.Preferred, pl.r.ClusterIdentity, view, nil, stabilization, pl.now)
	if target == "" {
		return false, due
	}
	// The cluster the lease last moved away from is stable only from then
	// on: a failover (or an administrator's move) from it is not undone
	// before the window has passed.
	terms, err := pl.history(ctx)
	if err != nil {
		pl.log.Error(err, "cannot read the lease's history for a failback; trying again later")
		return false, pl.retry()
	}
	if target, due = failbackTarget(pl0.Preferred, pl.r.ClusterIdentity, view, movedAway(terms), stabilization, pl.now); target == "" {
		return false, due
	}
	// Moves that no cluster took within their reservation (a destination
	// without the BerthLease, or that cannot acquire it) hold every
	// failback off, for every agent alike, twice as long after each one.
	if until := notTakenHold(terms, reservation(pl.bl), stabilization); pl.now.Before(until) {
		pl.held(pm, target, until, "earlier moves of the lease were not taken by their destination")
		return false, until
	}
	// The history was read above: limited is the count, never a failed read.
	if limited, until := pl.limited(ctx); limited {
		pl.held(pm, target, until, "the lease moved spec.failover.maxMoves times in a row")
		return false, until
	}
	note := fmt.Sprintf("cluster %s is preferred and has been healthy for %s (spec.placement.failback.stabilizationSeconds): moving the lease to it", target, stabilization)
	if !pl.move(ctx, target, corev1.EventTypeNormal, ReasonFailingBack, note) {
		return false, pl.retry()
	}
	return true, time.Time{}
}

// held says, once per term, that a failback to target is held off until
// until, and why: a preferred cluster that stays without the lease is
// otherwise a puzzle to whoever looks.
func (pl *placer) held(pm *placementMemory, target string, until time.Time, why string) {
	pl.log.V(1).Info("failback held", "to", target, "until", until, "why", why)
	if pm.held {
		return
	}
	pm.held = true
	pl.event(corev1.EventTypeNormal, ReasonFailbackHeld, fmt.Sprintf(
		"cluster %s is preferred and has been healthy for the stabilization window, but %s: no failback for %s",
		target, why, until.Sub(pl.now).Round(time.Second)))
}

// Defaults of the placement fields, as the CRD sets them.
const (
	defaultStabilizationSeconds = 300
	defaultMaxMoves             = 3
	defaultWindowSeconds        = 3600
)

// limited reports whether spec.failover limits moves now (the lease moved
// maxMoves times in a row, the newest within the window), and until when:
// once the lease has stayed put for the window. Without spec.failover,
// nothing limits a failback. A history that cannot be read limits too: a
// move waits for it.
func (pl *placer) limited(ctx context.Context) (bool, time.Time) {
	f := pl.bl.Spec.Failover
	if f == nil {
		return false, time.Time{}
	}
	// The history shows every move: failovers, failbacks and
	// administrators' moves, in any cluster.
	terms, err := pl.history(ctx)
	if err != nil {
		pl.log.Error(err, "cannot read the lease's history to count its moves; trying again later")
		return true, pl.retry()
	}
	window := failoverWindow(f)
	n, newest := movesInARow(terms, pl.now, window)
	if n < int(cmp.Or(f.MaxMoves, defaultMaxMoves)) {
		return false, time.Time{}
	}
	return true, newest.Add(window)
}

// movesBefore counts the moves in a row that brought the lease to this
// term, as of the term's start in the history (the live term comes
// first), or when this agent first saw it active if the history does not
// show it.
func (pl *placer) movesBefore(ctx context.Context, pm *placementMemory) (int, error) {
	window := failoverWindow(pl.bl.Spec.Failover)
	if pm.movesWindow == window {
		return pm.movesBefore, nil
	}
	terms, err := pl.history(ctx)
	if err != nil {
		return 0, err
	}
	start := pm.activeSince
	live := len(terms) > 0 && terms[0].FencingToken == pl.term.Token && terms[0].EndedAt.IsZero() && !terms[0].AcquiredAt.IsZero()
	if live {
		start = terms[0].AcquiredAt
	}
	n, _ := movesInARow(terms, start, window)
	if live {
		// Only the term's own start fixes the count; the fallback is
		// counted again next time.
		pm.movesBefore, pm.movesWindow = n, window
	}
	return n, nil
}

// failoverWindow is how close moves must follow each other to count in a
// row: spec.failover.windowSeconds, or four times unreadySeconds when that
// is longer. The back-off takes at most a quarter of it, which leaves the
// rest for the handover (the Pods' stop, the release, the next acquire).
func failoverWindow(f *berthv1alpha1.Failover) time.Duration {
	return max(time.Duration(cmp.Or(f.WindowSeconds, defaultWindowSeconds))*time.Second, 4*time.Duration(f.UnreadySeconds)*time.Second)
}

// backoff is how long the Pods must stay unready before a failover after
// n moves in a row: unready, doubled for each, but never beyond a quarter
// of the window, so that the next move still follows within the window
// and counts toward maxMoves.
func backoff(unready, window time.Duration, n int) time.Duration {
	wait := unready
	for range n {
		if wait >= window/4 {
			break
		}
		wait *= 2
	}
	return max(unready, min(wait, window/4))
}

// history reads the lease's term history once per reconcile.
func (pl *placer) history(ctx context.Context) ([]leaseapi.Term, error) {
	if pl.read {
		return pl.terms, nil
	}
	ctx, cancel := context.WithTimeout(ctx, pl.r.CallTimeout)
	defer cancel()
	ns, name := pl.bl.Namespace, pl.bl.EffectiveLeaseName()
	l, err := pl.mover.GetLease(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	// The server's default page (100 terms, the live one among them) could
	// hide the oldest of maxMoves moves.
	limit := 0
	if f := pl.bl.Spec.Failover; f != nil && f.MaxMoves >= 98 {
		limit = int(f.MaxMoves) + 2
	}
	terms, err := pl.mover.History(ctx, ns, name, limit)
	if err != nil && !errors.Is(err, leaseclient.ErrNotFound) {
		return nil, err
	}
	pl.terms, pl.read = onAgentClock(terms, l.RenewedAt, pl.now), true
	return pl.terms, nil
}

// onAgentClock moves the history's times (the lease API's clock) onto the
// agent's: renewedAt is the lease's last renewal, on the lease API's clock,
// at most a heartbeat before now. Taking it for now makes every time a
// little later than it was, never earlier: a move counts within a window
// and holds a cluster off no shorter than it should, whatever the two
// clocks say.
func onAgentClock(terms []leaseapi.Term, renewedAt, now time.Time) []leaseapi.Term {
	if renewedAt.IsZero() {
		return terms
	}
	offset := now.Sub(renewedAt)
	out := make([]leaseapi.Term, len(terms))
	for i, t := range terms {
		for _, at := range []*time.Time{&t.AcquiredAt, &t.EndedAt} {
			if !at.IsZero() {
				*at = at.Add(offset)
			}
		}
		out[i] = t
	}
	return out
}

// move asks the lease API to move the term to (empty: any other cluster),
// and on success emits the Event and marks the term revoked, so that the
// next reconcile hands it over at once. It reports whether the term moved.
func (pl *placer) move(ctx context.Context, to, eventType, reason, note string) bool {
	ctx, cancel := context.WithTimeout(ctx, pl.r.CallTimeout)
	defer cancel()
	if deadline := pl.term.Deadline; pl.r.Clock.Now().Before(deadline) {
		var cancelAtDeadline context.CancelFunc
		ctx, cancelAtDeadline = context.WithDeadline(ctx, pl.r.wallDeadline(deadline))
		defer cancelAtDeadline()
	}
	l, err := pl.mover.Move(ctx, pl.bl.Namespace, pl.bl.EffectiveLeaseName(), pl.term.Holder, pl.term.Token, to)
	switch {
	case errors.Is(err, leaseclient.ErrNotFound):
		// A lease API of an earlier release, without moves: the term is
		// held, so the lease exists.
		if !pl.r.moveUnsupported.Swap(true) {
			pl.log.Error(err, "the lease API does not move terms (an earlier release): placement and failover are off until the agent restarts")
		}
		return false
	case err != nil:
		pl.log.Error(err, "cannot move the lease", "reason", reason, "to", to, "token", pl.term.Token)
		return false
	}
	pl.log.Info("moving the lease", "reason", reason, "to", cmp.Or(to, "any other cluster"), "token", pl.term.Token, "expiresAt", l.ExpiresAt)
	pl.event(eventType, reason, note)
	pl.mem.update(func(t tenure) tenure { return t.moved(pl.term.Token) })
	return true
}

// event records an Event on the BerthLease, and counts the decision.
func (pl *placer) event(eventType, reason, note string) {
	placementMoves.WithLabelValues(pl.r.ClusterIdentity, pl.bl.Namespace, pl.bl.Name, reason).Inc()
	if pl.r.Recorder != nil {
		pl.r.Recorder.Eventf(pl.bl, nil, eventType, reason, "Placement", "%s", note)
	}
}

// unreadySince is since when the workload has not been Ready: the earliest
// moment one of the running Pods (not being deleted) has been not Ready
// since, counted from the latest of the term's activeSince, the Pod's
// creation, its Ready condition's last change and when this agent first
// saw it not Ready (now, the first time; the kubelet's clock may be behind
// the agent's). Zero when every one is Ready.
func (pm *placementMemory) unreadySince(running []corev1.Pod, now time.Time) time.Time {
	var (
		since time.Time
		seen  map[types.UID]time.Time // allocated at the first Pod not Ready
	)
	for i := range running {
		pod := &running[i]
		if !pod.DeletionTimestamp.IsZero() {
			continue
		}
		from := latest(pm.activeSince, pod.CreationTimestamp.Time)
		ready := false
		for _, c := range pod.Status.Conditions {
			if c.Type != corev1.PodReady {
				continue
			}
			ready = c.Status == corev1.ConditionTrue
			from = latest(from, c.LastTransitionTime.Time)
		}
		if ready {
			continue
		}
		first, ok := pm.notReadySeen[pod.UID]
		if !ok {
			first = now
		}
		if seen == nil {
			seen = make(map[types.UID]time.Time)
		}
		seen[pod.UID] = first
		if from = latest(from, first); since.IsZero() || from.Before(since) {
			since = from
		}
	}
	pm.notReadySeen = seen
	return since
}

// rank is where a cluster stands in the preference: the index of the first
// entry that names it (by id, or by a selector of its labels), or
// len(prefs) when none does.
func rank(prefs []berthv1alpha1.ClusterPreference, id string, clusterLabels map[string]string) int {
	for i, pref := range prefs {
		if pref.Cluster != "" && pref.Cluster == id {
			return i
		}
		if pref.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pref.Selector)
		if err == nil && !sel.Empty() && sel.Matches(labels.Set(clusterLabels)) {
			return i
		}
	}
	return len(prefs)
}

// failbackTarget is the cluster a holder (self) fails back to now: the
// best ranked of the clusters that rank above self and have been healthy
// for the stabilization window, counted from the later of HealthySince and
// the time held says for that cluster (ties: the one stable longest, then
// by id). With no such cluster yet, due is when the first of the better
// ranked healthy clusters will be (zero: none is healthy). A holder that
// is not in the view fails back nowhere: its own rank is not known.
func failbackTarget(prefs []berthv1alpha1.ClusterPreference, self string, view []ViewedCluster, held map[string]time.Time, stabilization time.Duration, now time.Time) (target string, due time.Time) {
	i := slices.IndexFunc(view, func(c ViewedCluster) bool { return c.ID == self })
	if i < 0 {
		return "", time.Time{}
	}
	selfRank := rank(prefs, self, view[i].Labels)
	bestRank, bestFrom := selfRank, time.Time{}
	for _, c := range view {
		if c.ID == self || c.HealthySince.IsZero() {
			continue
		}
		cr := rank(prefs, c.ID, c.Labels)
		if cr >= selfRank {
			continue
		}
		from := latest(c.HealthySince, held[c.ID])
		if ready := from.Add(stabilization); now.Before(ready) {
			due = earliestSet(due, ready)
			continue
		}
		if cr < bestRank || cr == bestRank && (from.Before(bestFrom) || from.Equal(bestFrom) && c.ID < target) {
			target, bestRank, bestFrom = c.ID, cr, from
		}
	}
	if target != "" {
		return target, time.Time{}
	}
	return "", due
}

// validPreferences reports the first selector of prefs that does not parse:
// it would name no cluster, and so turn the preference around.
func validPreferences(prefs []berthv1alpha1.ClusterPreference) error {
	for i, pref := range prefs {
		if pref.Selector == nil {
			continue
		}
		if _, err := metav1.LabelSelectorAsSelector(pref.Selector); err != nil {
			return fmt.Errorf("spec.placement.preferred[%d].selector: %w", i, err)
		}
	}
	return nil
}

// reservation is how long the lease API reserves a moved lease for its
// destination (leasemachine.MinReservation at least).
func reservation(bl *berthv1alpha1.BerthLease) time.Duration {
	return max(time.Duration(bl.Spec.TTLSeconds)*time.Second, leasemachine.MinReservation)
}

// maxNotTakenDoublings caps the failback hold of notTakenHold.
const maxNotTakenDoublings = 10

// notTakenHold is until when failback waits after moves that were not
// taken: from the newest move back to the newest one that was taken, each
// moved term whose next term began half a reservation or more after it
// ended (its destination did not acquire in time; the reservation ran out
// first) counts. With n of them, failback waits stabilization·2^(n−1)
// from the start of the term after the newest. Zero when there is none.
func notTakenHold(terms []leaseapi.Term, reservation, stabilization time.Duration) time.Time {
	n, from := 0, time.Time{}
	for i := 1; i < len(terms); i++ {
		t, next := terms[i], terms[i-1]
		if t.Ending != leaseapi.TermMoved || t.EndedAt.IsZero() {
			continue
		}
		if next.AcquiredAt.Sub(t.EndedAt) < reservation/2 {
			break // taken
		}
		if n == 0 {
			from = next.AcquiredAt
		}
		n++
	}
	if n == 0 {
		return time.Time{}
	}
	return from.Add(stabilization << min(n-1, maxNotTakenDoublings))
}

// movedAway is, for each cluster, when its last term that ended moved
// ended.
func movedAway(terms []leaseapi.Term) map[string]time.Time {
	at := map[string]time.Time{}
	for _, t := range terms {
		if t.Ending == leaseapi.TermMoved && t.EndedAt.After(at[t.Holder]) {
			at[t.Holder] = t.EndedAt
		}
	}
	return at
}

// movesInARow counts the terms that ended moved in a row as of at: the
// newest when it ended less than window before at (or after it), and each
// older one when it ended less than window before the one after it;
// newest is when the newest ended.
func movesInARow(terms []leaseapi.Term, at time.Time, window time.Duration) (n int, newest time.Time) {
	var ends []time.Time
	for _, t := range terms {
		if t.Ending == leaseapi.TermMoved && !t.EndedAt.IsZero() {
			ends = append(ends, t.EndedAt)
		}
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return b.Compare(a) })
	next := at
	for _, end := range ends {
		if next.Sub(end) >= window {
			break
		}
		if n == 0 {
			newest = end
		}
		n++
		next = end
	}
	return n, newest
}

// latest is the later of two times.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// placed reports whether a spec asks for failback or failover.
func placed(s berthv1alpha1.BerthLeaseSpec) bool {
	return s.Placement != nil && s.Placement.Failback != nil || s.Failover != nil
}

// earliestSet is the earlier of two times, either of which may be zero
// (unset).
func earliestSet(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero():
		return a
	}
	return earliest(a, b)
}

// WakePlacement wakes every BerthLease whose term this reconciler holds and
// whose spec asks for failback or failover: the fleet view changed (a
// cluster turned healthy or unhealthy, was cordoned or registered), so a
// failback may be due, or no longer, and a failover may have somewhere to
// go.
func (r *BerthLeaseReconciler) WakePlacement(ctx context.Context) {
	if r.Wake == nil {
		return
	}
	r.mu.Lock()
	var names []types.NamespacedName
	for _, m := range r.memory {
		if m.last != nil && placed(m.last.Spec) && m.read().term != nil {
			names = append(names, m.name)
		}
	}
	r.mu.Unlock()
	for _, name := range names {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		r.Wake(wctx, name)
		timedOut := wctx.Err() != nil
		cancel()
		if timedOut {
			return // the controller does not run (not the leader)
		}
	}
}
