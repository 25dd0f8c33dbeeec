package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

func primaryFirst() []berthv1alpha1.ClusterPreference {
	return []berthv1alpha1.ClusterPreference{
		{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "primary"}}},
		{Cluster: "c"},
	}
}

func TestRank(t *testing.T) {
	prefs := primaryFirst()
	for _, tc := range []struct {
		id     string
		labels map[string]string
		want   int
	}{
		{"a", map[string]string{"site": "primary"}, 0},
		{"c", map[string]string{"site": "primary"}, 0}, // the first entry that names it
		{"c", nil, 1},
		{"b", map[string]string{"site": "backup"}, 2},
		{"b", nil, 2},
	} {
		if got := rank(prefs, tc.id, tc.labels); got != tc.want {
			t.Errorf("rank(%s, %v) = %d, want %d", tc.id, tc.labels, got, tc.want)
		}
	}
	// An empty selector names no cluster (not every one).
	empty := []berthv1alpha1.ClusterPreference{{Selector: &metav1.LabelSelector{}}}
	if got := rank(empty, "a", map[string]string{"site": "primary"}); got != 1 {
		t.Errorf("an empty selector ranks a cluster %d, want 1 (unnamed)", got)
	}
}

func TestFailbackTarget(t *testing.T) {
	const stab = 10 * time.Second
	prefs := primaryFirst()
	primary := map[string]string{"site": "primary"}
	view := func(cs ...ViewedCluster) []ViewedCluster { return cs }
	for _, tc := range []struct {
		name    string
		self    string
		view    []ViewedCluster
		held    map[string]time.Time
		now     time.Time
		want    string
		wantDue time.Time
	}{{
		name: "a preferred cluster healthy for the window",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}, ViewedCluster{ID: "b", HealthySince: t0}),
		now: t0.Add(stab), want: "a",
	}, {
		name: "not yet stable: due at the window's end",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}, ViewedCluster{ID: "b", HealthySince: t0}),
		now: t0.Add(stab - time.Millisecond), wantDue: t0.Add(stab),
	}, {
		name: "unhealthy: nothing due",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary}, ViewedCluster{ID: "b", HealthySince: t0}),
		now: t0.Add(time.Hour),
	}, {
		name: "the holder is the most preferred",
		self: "a", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}, ViewedCluster{ID: "c", HealthySince: t0}),
		now: t0.Add(time.Hour),
	}, {
		name: "an equally preferred cluster is no failback",
		self: "a", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}, ViewedCluster{ID: "d", Labels: primary, HealthySince: t0}),
		now: t0.Add(time.Hour),
	}, {
		name: "the best ranked stable one, not the first stable one",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0.Add(time.Second)}, ViewedCluster{ID: "b", HealthySince: t0}, ViewedCluster{ID: "c", HealthySince: t0}),
		now: t0.Add(time.Hour), want: "a",
	}, {
		name: "a cluster the lease moved away from is stable only from then",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}, ViewedCluster{ID: "b", HealthySince: t0}),
		held: map[string]time.Time{"a": t0.Add(time.Minute)},
		now:  t0.Add(time.Minute + stab/2), wantDue: t0.Add(time.Minute + stab),
	}, {
		name: "the next best while the best is held",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}, ViewedCluster{ID: "b", HealthySince: t0}, ViewedCluster{ID: "c", HealthySince: t0}),
		held: map[string]time.Time{"a": t0.Add(time.Minute)},
		now:  t0.Add(time.Minute), want: "c",
	}, {
		name: "a holder missing from the view does not know its rank",
		self: "b", view: view(ViewedCluster{ID: "a", Labels: primary, HealthySince: t0}),
		now: t0.Add(time.Hour),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, due := failbackTarget(prefs, tc.self, tc.view, tc.held, stab, tc.now)
			if got != tc.want || !due.Equal(tc.wantDue) {
				t.Errorf("failbackTarget = %q, due %s; want %q, due %s", got, due, tc.want, tc.wantDue)
			}
		})
	}
}

func readyPod(name string, created time.Time, ready *bool, changed time.Time) corev1.Pod {
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
	if ready != nil {
		status := corev1.ConditionFalse
		if *ready {
			status = corev1.ConditionTrue
		}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.NewTime(changed)}}
	}
	return pod
}

func TestUnreadySince(t *testing.T) {
	yes, no := true, false
	active := t0.Add(time.Minute)
	deleting := readyPod("old", t0, &no, t0)
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want time.Time
	}{
		{"no Pods", nil, time.Time{}},
		{"all Ready", []corev1.Pod{readyPod("a", t0, &yes, t0)}, time.Time{}},
		{"not Ready before the term: from the term", []corev1.Pod{readyPod("a", t0, &no, t0)}, active},
		{"turned not Ready during the term", []corev1.Pod{readyPod("a", t0, &no, active.Add(time.Minute))}, active.Add(time.Minute)},
		{"no condition yet: from its creation", []corev1.Pod{readyPod("a", active.Add(time.Second), nil, time.Time{})}, active.Add(time.Second)},
		{"the earliest of two", []corev1.Pod{readyPod("a", t0, &no, active.Add(time.Minute)), readyPod("b", t0, &no, active.Add(time.Second)), readyPod("c", t0, &yes, t0)}, active.Add(time.Second)},
		{"a Pod being deleted does not count", []corev1.Pod{deleting}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pm := placementMemory{activeSince: active}
			if got := pm.unreadySince(tc.pods, active); !got.Equal(tc.want) {
				t.Errorf("unreadySince = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestUnreadySinceOnTheAgentsClock(t *testing.T) {
	// The kubelet's clock is 9 minutes behind the agent's: a Pod that just
	// turned not Ready says it did so 9 minutes ago. Unreadiness counts
	// from when the agent first saw it.
	no, yes := false, true
	pm := placementMemory{activeSince: t0}
	now := t0.Add(10 * time.Minute)
	blip := readyPod("p", t0, &no, t0.Add(time.Minute))
	if got := pm.unreadySince([]corev1.Pod{blip}, now); !got.Equal(now) {
		t.Fatalf("first sight: unreadySince = %s, want now %s", got, now)
	}
	if got := pm.unreadySince([]corev1.Pod{blip}, now.Add(5*time.Second)); !got.Equal(now) {
		t.Errorf("5 s later: unreadySince = %s, want the first sight %s", got, now)
	}
	ready := readyPod("p", t0, &yes, now.Add(6*time.Second))
	if got := pm.unreadySince([]corev1.Pod{ready}, now.Add(6*time.Second)); !got.IsZero() || len(pm.notReadySeen) != 0 {
		t.Errorf("Ready again: unreadySince = %s, remembered %v; want zero, nothing", got, pm.notReadySeen)
	}
	if got := pm.unreadySince([]corev1.Pod{blip}, now.Add(time.Minute)); !got.Equal(now.Add(time.Minute)) {
		t.Errorf("not Ready again: unreadySince = %s, want the new sight %s", got, now.Add(time.Minute))
	}
}

func TestMovesInARow(t *testing.T) {
	terms := []leaseapi.Term{
		{Holder: "a", FencingToken: 5, AcquiredAt: t0.Add(50 * time.Second)},
		{Holder: "b", FencingToken: 4, EndedAt: t0.Add(40 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "a", FencingToken: 3, EndedAt: t0.Add(30 * time.Second), Ending: leaseapi.TermExpired},
		{Holder: "c", FencingToken: 2, EndedAt: t0.Add(20 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "b", FencingToken: 1, EndedAt: t0.Add(10 * time.Second), Ending: leaseapi.TermMoved},
	}
	for _, tc := range []struct {
		name   string
		at     time.Time
		window time.Duration
		n      int
	}{
		{"the newest alone: the one before is too far from it", t0.Add(50 * time.Second), 15 * time.Second, 1},
		{"all three in a row", t0.Add(50 * time.Second), 25 * time.Second, 3},
		{"the newest too far from now: none", t0.Add(70 * time.Second), 25 * time.Second, 0},
		{"a move after at counts", t0.Add(35 * time.Second), 15 * time.Second, 1},
	} {
		n, newest := movesInARow(terms, tc.at, tc.window)
		if n != tc.n || n > 0 && !newest.Equal(t0.Add(40*time.Second)) {
			t.Errorf("%s: movesInARow = %d, newest %s; want %d, %s", tc.name, n, newest, tc.n, t0.Add(40*time.Second))
		}
	}
	away := movedAway(terms)
	if len(away) != 2 || !away["b"].Equal(t0.Add(40*time.Second)) || !away["c"].Equal(t0.Add(20*time.Second)) {
		t.Errorf("movedAway = %v", away)
	}
}

// mover is a LeaseClient that moves terms and serves a history; the
// other calls are not made by place.
type mover struct {
	LeaseClient
	terms []leaseapi.Term
	// reads counts the history's reads.
	reads int
	moves []string
	err   error
	// renewedAt is the lease's last renewal on the lease API's clock (zero:
	// the agent's now, no skew).
	renewedAt func() time.Time
}

func (m *mover) GetLease(context.Context, string, string) (leaseapi.Lease, error) {
	return leaseapi.Lease{RenewedAt: m.renewedAt()}, nil
}

func (m *mover) Move(_ context.Context, _, _, _ string, _ int32, to string) (leaseapi.Lease, error) {
	if m.err != nil {
		return leaseapi.Lease{}, m.err
	}
	m.moves = append(m.moves, to)
	return leaseapi.Lease{}, nil
}

func (m *mover) History(context.Context, string, string, int) ([]leaseapi.Term, error) {
	m.reads++
	return m.terms, nil
}

// view is a ClusterView that shows what it holds.
type view struct {
	clusters []ViewedCluster
	current  bool
}

func (v *view) Clusters() ([]ViewedCluster, bool) { return v.clusters, v.current }

// placeRig is a reconciler and one held, active term of a BerthLease, for
// place.
type placeRig struct {
	r     *BerthLeaseReconciler
	clk   *clocktesting.FakeClock
	mv    *mover
	fleet *view
	rec   *events.FakeRecorder
	bl    *berthv1alpha1.BerthLease
	mem   *memory
}

func newPlaceRig(spec berthv1alpha1.BerthLeaseSpec) *placeRig {
	clk := clocktesting.NewFakeClock(t0)
	g := &placeRig{clk: clk, mv: &mover{}, fleet: &view{current: true}, rec: events.NewFakeRecorder(10), mem: &memory{}}
	g.mv.renewedAt = clk.Now
	g.r = &BerthLeaseReconciler{LeaseClient: g.mv, Fleet: g.fleet, Recorder: g.rec, Clock: clk, ClusterIdentity: "b", ManagedWorkloads: true, CallTimeout: time.Second}
	spec.TTLSeconds, spec.HeartbeatIntervalSeconds = 9, 3
	g.bl = &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "job"}, Spec: spec}
	g.mem.tenure.term = &Term{Holder: "b", Token: 7, Deadline: t0.Add(time.Hour), RenewDue: t0.Add(time.Hour)}
	return g
}

// place runs place on the rig's term with pods running, and returns when
// it looks again.
func (g *placeRig) place(pods ...corev1.Pod) time.Time {
	// The term is renewed all along, however far the clock is set.
	t := g.mem.update(func(t tenure) tenure {
		if t.term != nil {
			renewed := *t.term
			renewed.Deadline, renewed.RenewDue = g.clk.Now().Add(time.Hour), g.clk.Now().Add(time.Hour)
			t.term = &renewed
		}
		return t
	})
	p := &observation{mem: g.mem, running: pods, facts: t.intoFacts(Facts{Now: g.clk.Now()})}
	return g.r.place(context.Background(), g.bl, p, Decision{Phase: PhaseActive})
}

func (g *placeRig) events() []string {
	var out []string
	for {
		select {
		case e := <-g.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestPlaceFailover(t *testing.T) {
	no := false
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 2, WindowSeconds: 60}})
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0}, {ID: "b", HealthySince: t0}}
	unready := readyPod("p", t0.Add(-time.Hour), &no, t0.Add(-time.Minute))

	// The term is first seen active now: unreadiness counts from here.
	if wake := g.place(unready); !wake.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("first look: wake %s, want unreadySeconds later", wake)
	}
	if len(g.mv.moves) != 0 {
		t.Fatalf("moved before unreadySeconds: %v", g.mv.moves)
	}
	// Nobody else healthy: no move, whatever the time.
	g.clk.Step(5 * time.Second)
	g.fleet.clusters[0].HealthySince = time.Time{}
	if g.place(unready); len(g.mv.moves) != 0 {
		t.Fatalf("failed over with no other healthy cluster: %v", g.mv.moves)
	}
	g.fleet.clusters[0].HealthySince = t0
	if wake := g.place(unready); !wake.Equal(g.clk.Now()) || len(g.mv.moves) != 1 || g.mv.moves[0] != "" {
		t.Fatalf("unready for 5 s: wake %s, moves %q; want a move to any cluster now", wake, g.mv.moves)
	}
	if f := g.mem.read().intoFacts(Facts{}); !f.Revoked {
		t.Errorf("after the move the term is not revoked: the next reconcile would not hand it over")
	}
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning FailingOver ") {
		t.Errorf("events %q, want one Warning FailingOver", ev)
	}

	// A new term, with the lease moved twice in the last minute: limited.
	g = newPlaceRig(g.bl.Spec)
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0}, {ID: "b", HealthySince: t0}}
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 7, AcquiredAt: t0.Add(-10 * time.Second)},
		{Holder: "a", FencingToken: 6, EndedAt: t0.Add(-20 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "b", FencingToken: 5, EndedAt: t0.Add(-40 * time.Second), Ending: leaseapi.TermMoved},
	}
	g.place(unready)
	g.clk.Step(5 * time.Second)
	if wake := g.place(unready); len(g.mv.moves) != 0 || !wake.IsZero() {
		t.Fatalf("limited: moves %q, wake %s; want none, and no look but the Pods' watch", g.mv.moves, wake)
	}
	// The moves are counted as of the term's start: long after they left
	// the window, the holder still keeps the lease.
	g.clk.SetTime(t0.Add(10 * time.Minute))
	if g.place(unready); len(g.mv.moves) != 0 {
		t.Fatalf("limited, 10 minutes on, Pods still unready: moves %q, want none", g.mv.moves)
	}
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning FailoverLimited ") {
		t.Errorf("events %q, want one Warning FailoverLimited (once per term)", ev)
	}
	// Ready once, then unready again: a new count, from then.
	yes := true
	g.place(readyPod("p", t0.Add(-time.Hour), &yes, g.clk.Now()))
	g.clk.Step(time.Minute)
	unready = readyPod("p", t0.Add(-time.Hour), &no, g.clk.Now())
	g.place(unready)
	g.clk.Step(5 * time.Second)
	g.mv.err = errors.New("lease API unreachable")
	if wake := g.place(unready); len(g.mv.moves) != 0 || !wake.Equal(g.clk.Now().Add(600*time.Millisecond)) {
		t.Errorf("move failed: moves %q, wake %s; want a retry at a fifth of the heartbeat", g.mv.moves, wake)
	}
	g.mv.err = nil
	if g.place(unready); len(g.mv.moves) != 1 {
		t.Errorf("unready again long after the moves: moves %q, want one", g.mv.moves)
	}
}

func TestPlaceFailoverBacksOff(t *testing.T) {
	no := false
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 3, WindowSeconds: 60}})
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0}, {ID: "b", HealthySince: t0}}
	// The lease moved here 20 s ago; the Pods turned unready at t0.
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 7, AcquiredAt: t0.Add(-20 * time.Second)},
		{Holder: "a", FencingToken: 6, EndedAt: t0.Add(-20 * time.Second), Ending: leaseapi.TermMoved},
	}
	g.mem.placement = placementMemory{token: 7, activeSince: t0.Add(-20 * time.Second)}
	unready := readyPod("p", t0.Add(-time.Hour), &no, t0)
	g.place(unready)
	g.clk.Step(5 * time.Second)
	if wake := g.place(unready); len(g.mv.moves) != 0 || !wake.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("unready 5 s after one move within the window: moves %q, wake %s; want none, and a look after 10 s", g.mv.moves, wake)
	}
	g.clk.Step(5 * time.Second)
	if g.place(unready); len(g.mv.moves) != 1 {
		t.Fatalf("unready 10 s after one move within the window: moves %q, want one", g.mv.moves)
	}
	if ev := g.events(); len(ev) != 1 || !strings.Contains(ev[0], "backed off to 10s by 1 moves in a row") {
		t.Errorf("events %q, want one FailingOver naming the back-off", ev)
	}
}

func TestPlaceFailoverBackOffHolds(t *testing.T) {
	no := false
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 3, WindowSeconds: 60}})
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0}, {ID: "b", HealthySince: t0}}
	// The lease moved here 53 s before the Pods turned unready: the move
	// counts as of then, though it is more than a minute old when the
	// doubled 10 s are up.
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 7, AcquiredAt: t0.Add(-53 * time.Second)},
		{Holder: "a", FencingToken: 6, EndedAt: t0.Add(-53 * time.Second), Ending: leaseapi.TermMoved},
	}
	g.mem.placement = placementMemory{token: 7, activeSince: t0.Add(-53 * time.Second)}
	unready := readyPod("p", t0.Add(-time.Hour), &no, t0)
	g.place(unready)
	g.clk.Step(5 * time.Second)
	if wake := g.place(unready); len(g.mv.moves) != 0 || !wake.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("backed off by one move: moves %q, wake %s; want none, and a look after 10 s", g.mv.moves, wake)
	}
	g.clk.Step(4 * time.Second)
	if g.place(unready); len(g.mv.moves) != 0 {
		t.Fatalf("the move left the window, but the back-off holds: moves %q, want none", g.mv.moves)
	}
	g.clk.Step(time.Second)
	if g.place(unready); len(g.mv.moves) != 1 {
		t.Fatalf("unready for 10 s: moves %q, want one", g.mv.moves)
	}
}

// limitedRig is a holder whose term began 10 s before t0, after two moves
// in a row (maxMoves 2): its failover is limited.
func limitedRig(spec berthv1alpha1.BerthLeaseSpec) *placeRig {
	g := newPlaceRig(spec)
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0.Add(-time.Hour)}, {ID: "b", HealthySince: t0.Add(-time.Hour)}}
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 7, AcquiredAt: t0.Add(-10 * time.Second)},
		{Holder: "a", FencingToken: 6, EndedAt: t0.Add(-10 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "b", FencingToken: 5, EndedAt: t0.Add(-30 * time.Second), Ending: leaseapi.TermMoved},
	}
	return g
}

func TestPlaceFailoverLimitSurvives(t *testing.T) {
	no, yes := false, true
	spec := berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 2, WindowSeconds: 60}}
	// unreadyRig is limitedRig placed once at t0 with a Pod never Ready.
	unreadyRig := func(spec berthv1alpha1.BerthLeaseSpec) (*placeRig, corev1.Pod) {
		g := limitedRig(spec)
		unready := readyPod("p", t0, &no, t0)
		g.place(unready)
		return g, unready
	}

	t.Run("an agent restart and new Pods, hours on", func(t *testing.T) {
		g, unready := unreadyRig(spec)
		g.clk.Step(5 * time.Second)
		g.place(unready)
		// Two hours on, the agent restarts (its memory is gone) and the
		// Deployment made a new Pod, never Ready either.
		g.clk.SetTime(t0.Add(2 * time.Hour))
		g.mem.placement = placementMemory{}
		again := readyPod("q", g.clk.Now(), &no, g.clk.Now())
		g.place(again)
		g.clk.Step(time.Minute)
		if g.place(again); len(g.mv.moves) != 0 {
			t.Fatalf("limited, then restarted with new Pods: moves %q, want none (the count is the term's)", g.mv.moves)
		}
	})

	t.Run("the history is read once for the term", func(t *testing.T) {
		g, unready := unreadyRig(spec)
		for range 10 {
			// Its Pods change (a restart, a probe): each reconciles it.
			g.clk.Step(5 * time.Second)
			g.place(unready)
		}
		if len(g.mv.moves) != 0 || g.mv.reads != 1 {
			t.Fatalf("limited through 10 reconciles: moves %q, history read %d times; want none, once", g.mv.moves, g.mv.reads)
		}
		// Its failover fields change: the window is another, so is the count.
		g.bl.Spec.Failover = &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 2, WindowSeconds: 15}
		g.clk.Step(5 * time.Second)
		if g.place(unready); len(g.mv.moves) != 1 || g.mv.reads != 2 {
			t.Fatalf("window 20 s (4 × unreadySeconds over windowSeconds 15): the moves 20 s apart are no longer in a row: moves %q, history read %d times; want one move, a second read", g.mv.moves, g.mv.reads)
		}
	})

	t.Run("Ready for less than the window", func(t *testing.T) {
		g := limitedRig(spec)
		g.place(readyPod("p", t0, &no, t0))
		g.clk.Step(10 * time.Second)
		g.place(readyPod("p", t0, &yes, g.clk.Now()))
		g.clk.Step(59 * time.Second)
		unready := readyPod("p", t0, &no, g.clk.Now())
		g.place(unready)
		g.clk.Step(time.Minute)
		if g.place(unready); len(g.mv.moves) != 0 {
			t.Fatalf("Ready for 59 s only (window 60 s): moves %q, want none, still limited", g.mv.moves)
		}
	})

	t.Run("Ready for the window, then unready", func(t *testing.T) {
		g := limitedRig(spec)
		g.place(readyPod("p", t0, &yes, t0))
		g.clk.Step(time.Minute)
		unready := readyPod("p", t0, &no, g.clk.Now())
		g.place(unready)
		g.clk.Step(5 * time.Second)
		if g.place(unready); len(g.mv.moves) != 1 {
			t.Fatalf("Ready for the window in this term, then unready for 5 s: moves %q, want one, without back-off", g.mv.moves)
		}
	})

	// failbackRig is unreadyRig with a failback to cluster a.
	failbackRig := func() (*placeRig, corev1.Pod) {
		return unreadyRig(berthv1alpha1.BerthLeaseSpec{
			Placement: &berthv1alpha1.Placement{Preferred: []berthv1alpha1.ClusterPreference{{Cluster: "a"}}, Failback: &berthv1alpha1.Failback{StabilizationSeconds: 10}},
			Failover:  spec.Failover,
		})
	}

	t.Run("failback waits while limited and unready", func(t *testing.T) {
		g, unready := failbackRig()
		g.clk.SetTime(t0.Add(2 * time.Hour))
		if g.place(unready); len(g.mv.moves) != 0 {
			t.Fatalf("limited and unready, the preferred cluster healthy for hours: moves %q, want none", g.mv.moves)
		}
		g.place(readyPod("p", t0, &yes, g.clk.Now()))
		if len(g.mv.moves) != 1 || g.mv.moves[0] != "a" {
			t.Fatalf("Ready again, the moves long past: moves %q, want a failback to a; events %q", g.mv.moves, g.events())
		}
	})

	t.Run("spec.failover removed while limited: failback goes on", func(t *testing.T) {
		g, unready := failbackRig()
		g.clk.Step(5 * time.Second)
		if g.place(unready); !g.mem.placement.limitedNow {
			t.Fatalf("unready for unreadySeconds after maxMoves moves: not limited; events %q", g.events())
		}
		g.clk.SetTime(t0.Add(2 * time.Hour))
		g.bl.Spec.Failover = nil
		if g.place(unready); len(g.mv.moves) != 1 || g.mv.moves[0] != "a" {
			t.Fatalf("no spec.failover any more, the preferred cluster healthy for hours: moves %q, want a failback to a", g.mv.moves)
		}
	})
}

func TestBackoff(t *testing.T) {
	const unready, window = 5 * time.Second, time.Minute
	for n, want := range []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second, 15 * time.Second} {
		if got := backoff(unready, window, n); got != want {
			t.Errorf("backoff(%s, %s, %d) = %s, want %s", unready, window, n, got, want)
		}
	}
	if got := backoff(unready, window, 99); got != window/4 {
		t.Errorf("backoff after 99 moves = %s, want a quarter of the window", got)
	}
	if got := backoff(2*time.Minute, 4*time.Minute, 3); got != 2*time.Minute {
		t.Errorf("unready longer than the window: backoff = %s, want unready", got)
	}
}

func TestPlaceFailback(t *testing.T) {
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{
		Preferred: primaryFirst(), Failback: &berthv1alpha1.Failback{StabilizationSeconds: 10},
	}})
	primary := map[string]string{"site": "primary"}
	g.fleet.clusters = []ViewedCluster{{ID: "a", Labels: primary, HealthySince: t0.Add(-5 * time.Second)}, {ID: "b", HealthySince: t0.Add(-time.Hour)}}
	if wake := g.place(); !wake.Equal(t0.Add(5*time.Second)) || len(g.mv.moves) != 0 {
		t.Fatalf("a healthy for 5 s: wake %s, moves %q; want a look when its window is over", wake, g.mv.moves)
	}
	g.fleet.current = false
	g.clk.Step(5 * time.Second)
	if wake := g.place(); !wake.IsZero() || len(g.mv.moves) != 0 {
		t.Fatalf("view not current: wake %s, moves %q; want nothing (the view wakes it)", wake, g.mv.moves)
	}
	// a left the lease by a move 3 s ago: stable only from then.
	g.fleet.current = true
	g.mv.terms = []leaseapi.Term{{Holder: "b", FencingToken: 7}, {Holder: "a", FencingToken: 6, EndedAt: g.clk.Now().Add(-3 * time.Second), Ending: leaseapi.TermMoved}}
	if wake := g.place(); !wake.Equal(g.clk.Now().Add(7*time.Second)) || len(g.mv.moves) != 0 {
		t.Fatalf("a moved away 3 s ago: wake %s, moves %q; want a look 7 s later", wake, g.mv.moves)
	}
	g.clk.Step(7 * time.Second)
	if wake := g.place(); !wake.Equal(g.clk.Now()) || len(g.mv.moves) != 1 || g.mv.moves[0] != "a" {
		t.Fatalf("a stable: wake %s, moves %q; want a move to a", wake, g.mv.moves)
	}
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal FailingBack ") {
		t.Errorf("events %q, want one Normal FailingBack", ev)
	}

	// The lease came back once the reservation ran out (a did not take it),
	// as the history shows: failback is held off for the window.
	moved := g.clk.Now()
	g.clk.Step(9 * time.Second)
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 9, AcquiredAt: g.clk.Now()},
		{Holder: "b", FencingToken: 7, EndedAt: moved, Ending: leaseapi.TermMoved},
	}
	g.mem.tenure = tenure{term: &Term{Holder: "b", Token: 9, Deadline: g.clk.Now().Add(time.Hour)}}
	g.clk.Step(time.Second)
	if g.place(); len(g.mv.moves) != 1 {
		t.Errorf("failed back to a again 1 s after a failback to it did not land: moves %q", g.mv.moves)
	}
	g.place()
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal FailbackHeld ") || !strings.Contains(ev[0], "not taken") {
		t.Errorf("events %q, want one Normal FailbackHeld naming the moves not taken (once per term)", ev)
	}
	// A move the lease API refuses is tried again later.
	g.clk.Step(10 * time.Second)
	g.mv.err = errors.New("409 conflict")
	if wake := g.place(); wake.IsZero() || len(g.mv.moves) != 1 {
		t.Errorf("refused move: wake %s, moves %q; want a retry later", wake, g.mv.moves)
	}
}

func TestPlaceFailbackLimited(t *testing.T) {
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{
		Placement: &berthv1alpha1.Placement{Preferred: []berthv1alpha1.ClusterPreference{{Cluster: "a"}}, Failback: &berthv1alpha1.Failback{StabilizationSeconds: 10}},
		Failover:  &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 1, WindowSeconds: 60},
	})
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0.Add(-time.Hour)}, {ID: "b", HealthySince: t0.Add(-time.Hour)}}
	// The lease moved from c to b 30 s ago: with maxMoves 1, a failback
	// to a waits until that move leaves the window.
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 7, AcquiredAt: t0.Add(-30 * time.Second)},
		{Holder: "c", FencingToken: 6, EndedAt: t0.Add(-30 * time.Second), Ending: leaseapi.TermMoved},
	}
	if wake := g.place(); len(g.mv.moves) != 0 || !wake.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("limited: moves %q, wake %s; want none, and a look when the move leaves the window", g.mv.moves, wake)
	}
	g.place()
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal FailbackHeld ") || !strings.Contains(ev[0], "maxMoves") {
		t.Errorf("events %q, want one Normal FailbackHeld naming maxMoves (once per term)", ev)
	}
	g.clk.SetTime(t0.Add(30 * time.Second))
	if g.place(); len(g.mv.moves) != 1 || g.mv.moves[0] != "a" {
		t.Errorf("once the move left the window: moves %q, want one to a", g.mv.moves)
	}

	// Three moves in a row, the newest 10 s ago: held until the lease has
	// stayed put for the window, and the Event says so.
	g = newPlaceRig(g.bl.Spec)
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0.Add(-time.Hour)}, {ID: "b", HealthySince: t0.Add(-time.Hour)}}
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 9, AcquiredAt: t0.Add(-10 * time.Second)},
		{Holder: "c", FencingToken: 8, EndedAt: t0.Add(-10 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "b", FencingToken: 7, EndedAt: t0.Add(-20 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "c", FencingToken: 6, EndedAt: t0.Add(-50 * time.Second), Ending: leaseapi.TermMoved},
	}
	if wake := g.place(); len(g.mv.moves) != 0 || !wake.Equal(t0.Add(50*time.Second)) {
		t.Fatalf("three moves in a row: moves %q, wake %s; want none until %s", g.mv.moves, wake, t0.Add(50*time.Second))
	}
	if ev := g.events(); len(ev) != 1 || !strings.Contains(ev[0], "no failback for 50s") {
		t.Errorf("events %q, want one FailbackHeld naming 50s", ev)
	}
}

func TestPlaceSkewedClocks(t *testing.T) {
	// The agent's clock is 10 minutes ahead of the lease API's: the two
	// moves 20 and 40 s ago (lease API time) still count within the window.
	no := false
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 2, WindowSeconds: 60}})
	server := t0.Add(-10 * time.Minute)
	g.mv.renewedAt = func() time.Time { return server.Add(g.clk.Since(t0)) }
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0}, {ID: "b", HealthySince: t0}}
	g.mv.terms = []leaseapi.Term{
		{Holder: "b", FencingToken: 7, AcquiredAt: server.Add(-10 * time.Second)},
		{Holder: "a", FencingToken: 6, EndedAt: server.Add(-20 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "b", FencingToken: 5, EndedAt: server.Add(-40 * time.Second), Ending: leaseapi.TermMoved},
	}
	unready := readyPod("p", t0.Add(-time.Hour), &no, t0.Add(-time.Minute))
	g.place(unready)
	g.clk.Step(5 * time.Second)
	if g.place(unready); len(g.mv.moves) != 0 {
		t.Errorf("agent clock 10 min ahead: moves %q; want none, limited", g.mv.moves)
	}
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning FailoverLimited ") {
		t.Errorf("events %q, want one Warning FailoverLimited", ev)
	}
}

func TestNotTakenHold(t *testing.T) {
	const res, stab = 10 * time.Second, 100 * time.Second
	taken := leaseapi.Term{Holder: "a", FencingToken: 1, EndedAt: t0, Ending: leaseapi.TermMoved}
	term := func(holder string, token int32, acquired, ended time.Duration, ending string) leaseapi.Term {
		tm := leaseapi.Term{Holder: holder, FencingToken: token, AcquiredAt: t0.Add(acquired), Ending: ending}
		if ending != "" {
			tm.EndedAt = t0.Add(ended)
		}
		return tm
	}
	for _, tc := range []struct {
		name  string
		terms []leaseapi.Term
		want  time.Time
	}{
		{"no moves", []leaseapi.Term{term("b", 2, 0, 0, "")}, time.Time{}},
		{"a move taken at once", []leaseapi.Term{term("b", 2, time.Second, 0, ""), taken}, time.Time{}},
		{"one move not taken: the window from the next term", []leaseapi.Term{term("b", 2, 11*time.Second, 0, ""), taken}, t0.Add(11*time.Second + stab)},
		{"two not taken, an expiry between: twice the window", []leaseapi.Term{
			term("c", 4, 50*time.Second, 0, ""),
			term("b", 3, 30*time.Second, 40*time.Second, leaseapi.TermMoved),
			term("c", 2, 11*time.Second, 20*time.Second, leaseapi.TermExpired),
			taken,
		}, t0.Add(50*time.Second + 2*stab)},
		{"counting stops at a move taken", []leaseapi.Term{
			term("c", 4, 50*time.Second, 0, ""),
			term("a", 3, 21*time.Second, 40*time.Second, leaseapi.TermMoved),
			term("b", 2, time.Second, 20*time.Second, leaseapi.TermMoved),
			{Holder: "a", FencingToken: 1, EndedAt: t0.Add(-11 * time.Second), Ending: leaseapi.TermMoved},
		}, t0.Add(50*time.Second + stab)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := notTakenHold(tc.terms, res, stab); !got.Equal(tc.want) {
				t.Errorf("notTakenHold = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPlaceInvalidSelector(t *testing.T) {
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{
		Preferred: []berthv1alpha1.ClusterPreference{
			{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "site", Operator: "in", Values: []string{"primary"}}}}},
			{Cluster: "a"},
		},
		Failback: &berthv1alpha1.Failback{StabilizationSeconds: 10},
	}})
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0.Add(-time.Hour)}, {ID: "b", Labels: map[string]string{"site": "primary"}, HealthySince: t0.Add(-time.Hour)}}
	g.place()
	g.place()
	if len(g.mv.moves) != 0 {
		t.Errorf("failed back with a selector that does not parse: moves %q", g.mv.moves)
	}
	if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning InvalidPlacement ") {
		t.Errorf("events %q, want one Warning InvalidPlacement", ev)
	}
}

func TestPlaceMoveUnsupported(t *testing.T) {
	no := false
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5}})
	g.fleet.clusters = []ViewedCluster{{ID: "a", HealthySince: t0}, {ID: "b", HealthySince: t0}}
	g.mv.err = fmt.Errorf("move: %w", leaseclient.ErrNotFound)
	unready := readyPod("p", t0, &no, t0)
	g.place(unready)
	g.clk.Step(5 * time.Second)
	g.place(unready)
	if wake := g.place(unready); !wake.IsZero() || !g.r.moveUnsupported.Load() {
		t.Errorf("a lease API without moves: wake %s, unsupported %t; want placement off", wake, g.r.moveUnsupported.Load())
	}
}

func TestPlaceIgnored(t *testing.T) {
	no := false
	failover := &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 2, WindowSeconds: 60}
	for name, tc := range map[string]struct {
		spec  berthv1alpha1.BerthLeaseSpec
		agent func(r *BerthLeaseReconciler)
		want  string
	}{
		"failover without --managed-workloads": {
			spec:  berthv1alpha1.BerthLeaseSpec{Failover: failover},
			agent: func(r *BerthLeaseReconciler) { r.ManagedWorkloads = false },
			want:  "Warning PlacementIgnored spec.failover is ignored: it needs the agent's --managed-workloads",
		},
		"failback without --cluster-id": {
			spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{
				Preferred: []berthv1alpha1.ClusterPreference{{Cluster: "a"}}, Failback: &berthv1alpha1.Failback{StabilizationSeconds: 10},
			}},
			agent: func(r *BerthLeaseReconciler) { r.ClusterIdentity, r.Fleet = "", nil },
			want:  "Warning PlacementIgnored spec.placement.failback is ignored: it needs the agent's --cluster-id",
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := newPlaceRig(tc.spec)
			tc.agent(g.r)
			unready := readyPod("p", t0, &no, t0)
			for range 3 {
				g.place(unready)
				g.clk.Step(time.Minute)
			}
			if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], tc.want) {
				t.Errorf("events %q, want one %q", ev, tc.want)
			}
			if len(g.mv.moves) != 0 || g.mv.reads != 0 {
				t.Errorf("moves %q, history read %d times: want nothing done", g.mv.moves, g.mv.reads)
			}
		})
	}
	t.Run("failover without --cluster-id, failback with it", func(t *testing.T) {
		g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: failover})
		g.r.ClusterIdentity = ""
		g.place(readyPod("p", t0, &no, t0))
		if ev := g.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning PlacementIgnored spec.failover is ignored: it needs the agent's --cluster-id") || strings.Contains(ev[0], "failback") {
			t.Errorf("events %q, want one about spec.failover only", ev)
		}
	})
	// An agent that can do it says nothing.
	g := newPlaceRig(berthv1alpha1.BerthLeaseSpec{Failover: failover})
	g.place(readyPod("p", t0, nil, t0))
	if ev := g.events(); len(ev) != 0 {
		t.Errorf("events %q, want none", ev)
	}
}
