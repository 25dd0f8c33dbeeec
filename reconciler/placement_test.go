package reconciler

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
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
			if got := unreadySince(tc.pods, active); !got.Equal(tc.want) {
				t.Errorf("unreadySince = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestMovesWithin(t *testing.T) {
	terms := []leaseapi.Term{
		{Holder: "a", FencingToken: 5, AcquiredAt: t0.Add(50 * time.Second)},
		{Holder: "b", FencingToken: 4, EndedAt: t0.Add(40 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "a", FencingToken: 3, EndedAt: t0.Add(30 * time.Second), Ending: leaseapi.TermExpired},
		{Holder: "c", FencingToken: 2, EndedAt: t0.Add(20 * time.Second), Ending: leaseapi.TermMoved},
		{Holder: "b", FencingToken: 1, EndedAt: t0.Add(10 * time.Second), Ending: leaseapi.TermMoved},
	}
	n, oldest := movesWithin(terms, t0.Add(15*time.Second))
	if n != 2 || !oldest.Equal(t0.Add(20*time.Second)) {
		t.Errorf("movesWithin = %d, oldest %s; want 2, %s", n, oldest, t0.Add(20*time.Second))
	}
	away := movedAway(terms)
	if len(away) != 2 || !away["b"].Equal(t0.Add(40*time.Second)) || !away["c"].Equal(t0.Add(20*time.Second)) {
		t.Errorf("movedAway = %v", away)
	}
}
