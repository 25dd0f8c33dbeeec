package reconciler

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi/client"
)

const (
	us    = "cluster-a"
	other = "cluster-b"
)

var (
	errUnreachable = errors.New("acquire lease: dial tcp 10.0.0.9:8443: connect: connection refused")
	errNoHolder    = errors.New("no holder identity: set spec.holderIdentity or run the agent with --cluster-id")
	acquiredAt     = time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	renewedAt      = acquiredAt.Add(time.Minute)
	expiresAt      = renewedAt.Add(30 * time.Second)
)

// granted is the lease API's answer granting holder the term with token.
func granted(holder string, token int32) client.AcquireResult {
	return client.AcquireResult{Acquired: holder == us, Holder: holder, FencingToken: token, AcquiredAt: acquiredAt, RenewedAt: renewedAt, ExpiresAt: expiresAt}
}

// input builds a statusInput at generation 4 for facts, deciding on them.
func input(f Facts, opts ...func(*statusInput)) statusInput {
	in := statusInput{generation: 4, holder: us, facts: f, managed: f.RunningPods + f.GatedPods}
	for _, o := range opts {
		o(&in)
	}
	in.decision = Decide(in.facts)
	return in
}

func observed(r client.AcquireResult) func(*statusInput) {
	return func(in *statusInput) { in.tenure.observed = r }
}
func apiErr(err error) func(*statusInput)  { return func(in *statusInput) { in.tenure.apiErr = err } }
func specErr(err error) func(*statusInput) { return func(in *statusInput) { in.specErr = err } }
func selfFenced(in *statusInput)           { in.tenure.selfFenced = true }

// cond is the part of a condition the tests compare.
type cond struct {
	Status             metav1.ConditionStatus
	Reason             string
	Message            string
	ObservedGeneration int64
}

// summary is the part of a status the tests compare.
type summary struct {
	LeaseState, Phase, CurrentHolder    string
	FencingToken                        int32
	AcquiredAt, RenewTime, ExpiresAt    time.Time
	ObservedGeneration                  int64
	ManagedPods, RunningPods, GatedPods int32
	Acquired, HeartbeatHealthy          cond
	Conditions                          int
}

func summarize(st berthv1alpha1.BerthLeaseStatus) summary {
	c := func(typ string) cond {
		x := apimeta.FindStatusCondition(st.Conditions, typ)
		if x == nil {
			return cond{}
		}
		return cond{x.Status, x.Reason, x.Message, x.ObservedGeneration}
	}
	tm := func(m *metav1.MicroTime) time.Time {
		if m == nil {
			return time.Time{}
		}
		return m.UTC()
	}
	return summary{
		LeaseState: st.LeaseState, Phase: st.Phase, CurrentHolder: st.CurrentHolder, FencingToken: st.FencingToken,
		AcquiredAt: tm(st.AcquiredAt), RenewTime: tm(st.RenewTime), ExpiresAt: tm(st.ExpiresAt),
		ObservedGeneration: st.ObservedGeneration,
		ManagedPods:        st.ManagedPods, RunningPods: st.RunningPods, GatedPods: st.GatedPods,
		Acquired: c(ConditionAcquired), HeartbeatHealthy: c(ConditionHeartbeatHealthy),
		Conditions: len(st.Conditions) - len(healthOf(st)),
	}
}

// healthOf is the Ready, Reconciling and Stalled conditions of st, as
// "Type=Status/Reason: message".
func healthOf(st berthv1alpha1.BerthLeaseStatus) []string {
	var out []string
	for _, typ := range []string{ConditionReady, ConditionReconciling, ConditionStalled} {
		if c := apimeta.FindStatusCondition(st.Conditions, typ); c != nil {
			out = append(out, fmt.Sprintf("%s=%s/%s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	return out
}

func TestStatusCompute(t *testing.T) {
	renewedOK := cond{metav1.ConditionTrue, ReasonRenewed, "the lease API renewed the lease", 4}
	reachable := cond{metav1.ConditionTrue, ReasonReachable, "the lease API answers", 4}
	unreachable := cond{metav1.ConditionFalse, ReasonLeaseAPIUnreachable, errUnreachable.Error(), 4}
	fenced := cond{metav1.ConditionFalse, ReasonSelfFenced, "the local deadline passed without a renewal; Pods are stopped whether or not the lease API answers", 4}
	deletingCond := cond{metav1.ConditionFalse, ReasonDeleting, "the BerthLease is being deleted; the lease is given up", 4}

	cases := map[string]struct {
		in   statusInput
		want summary
	}{
		"held and active": {
			in: input(facts(withTerm(heldTerm()), withRunning(2), withGated(1)), observed(granted(us, 7))),
			want: summary{
				LeaseState: StateHeld, Phase: PhaseActive, CurrentHolder: us, FencingToken: 7,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				ManagedPods: 3, RunningPods: 2, GatedPods: 1,
				Acquired:         cond{metav1.ConditionTrue, ReasonHeld, "held by cluster-a with fencing token 7", 4},
				HeartbeatHealthy: renewedOK, Conditions: 2,
			},
		},
		"held, renew failing before the deadline: still active, heartbeat unhealthy": {
			in: input(facts(withTerm(renewDueTerm())), observed(granted(us, 7)), apiErr(errUnreachable)),
			want: summary{
				LeaseState: StateHeld, Phase: PhaseActive, CurrentHolder: us, FencingToken: 7,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				Acquired:         cond{metav1.ConditionTrue, ReasonHeld, "held by cluster-a with fencing token 7", 4},
				HeartbeatHealthy: unreachable, Conditions: 2,
			},
		},
		"self-fenced, stopping": {
			in: input(facts(withTerm(pastDeadlineTerm()), withRunning(2)), observed(granted(us, 7)), apiErr(errUnreachable), selfFenced),
			want: summary{
				LeaseState: StateHeld, Phase: PhaseStopping, CurrentHolder: us, FencingToken: 7,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				ManagedPods: 2, RunningPods: 2,
				Acquired:         cond{metav1.ConditionFalse, ReasonStopping, "stopping 2 running Pod(s) before giving the lease up", 4},
				HeartbeatHealthy: fenced, Conditions: 2,
			},
		},
		"lost to another cluster, stopping": {
			in: input(facts(withRunning(1)), observed(granted(other, 8))),
			want: summary{
				LeaseState: StateWaiting, Phase: PhaseStopping, CurrentHolder: other, FencingToken: 8,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				ManagedPods: 1, RunningPods: 1,
				Acquired:         cond{metav1.ConditionFalse, ReasonStopping, "stopping 1 running Pod(s) before giving the lease up", 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"waiting, held by another cluster": {
			in: input(facts(withGated(2)), observed(granted(other, 8))),
			want: summary{
				LeaseState: StateWaiting, CurrentHolder: other, FencingToken: 8,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				ManagedPods: 2, GatedPods: 2,
				Acquired:         cond{metav1.ConditionFalse, ReasonHeldByOther, "held by cluster-b with fencing token 8", 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"waiting, free": {
			in: input(facts()),
			want: summary{
				LeaseState: StateWaiting, ObservedGeneration: 4,
				Acquired:         cond{metav1.ConditionFalse, ReasonFree, "the lease is free; acquiring", 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"released after the deadline, acquiring again": {
			in: input(facts(), observed(client.AcquireResult{FencingToken: 7})),
			want: summary{
				LeaseState: StateWaiting, FencingToken: 7, ObservedGeneration: 4,
				Acquired:         cond{metav1.ConditionFalse, ReasonReleased, "released with fencing token 7", 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"released after deletion": {
			in: input(facts(deleting), observed(client.AcquireResult{FencingToken: 7})),
			want: summary{
				LeaseState: StateReleased, FencingToken: 7, ObservedGeneration: 4,
				Acquired: deletingCond, HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"deleting, release still to do": {
			in: input(facts(deleting, withRelease(7)), apiErr(errUnreachable)),
			want: summary{
				LeaseState: StateHeld, CurrentHolder: us, FencingToken: 7, ObservedGeneration: 4,
				Acquired: deletingCond, HeartbeatHealthy: unreachable, Conditions: 2,
			},
		},
		"deleting while held, stopping": {
			in: input(facts(deleting, withTerm(heldTerm()), withRunning(1)), observed(granted(us, 7))),
			want: summary{
				LeaseState: StateHeld, Phase: PhaseStopping, CurrentHolder: us, FencingToken: 7,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				ManagedPods: 1, RunningPods: 1,
				Acquired:         cond{metav1.ConditionFalse, ReasonStopping, "stopping 1 running Pod(s) before giving the lease up", 4},
				HeartbeatHealthy: renewedOK, Conditions: 2,
			},
		},
		"cordoned": {
			in: input(facts(cordoned, withGated(1)), observed(granted(other, 8))),
			want: summary{
				LeaseState: StateReleased, CurrentHolder: other, FencingToken: 8,
				AcquiredAt: acquiredAt, ObservedGeneration: 4,
				ManagedPods: 1, GatedPods: 1,
				Acquired:         cond{metav1.ConditionFalse, ReasonCordoned, "this cluster is cordoned at the lease API; it takes no leases until uncordoned", 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"invalid spec": {
			in: input(facts(invalid), specErr(errNoHolder)),
			want: summary{
				LeaseState: StateReleased, ObservedGeneration: 4,
				Acquired:         cond{metav1.ConditionFalse, ReasonInvalidSpec, errNoHolder.Error(), 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
		"lease API unreachable": {
			in: input(facts(), apiErr(errUnreachable)),
			want: summary{
				LeaseState: StateWaiting, ObservedGeneration: 4,
				Acquired:         cond{metav1.ConditionUnknown, ReasonLeaseAPIUnreachable, errUnreachable.Error(), 4},
				HeartbeatHealthy: unreachable, Conditions: 2,
			},
		},
		"restarted, recovering": {
			in: input(facts(withRecover(7), withRunning(1))),
			want: summary{
				LeaseState: StateHeld, CurrentHolder: us, FencingToken: 7, ObservedGeneration: 4, ManagedPods: 1, RunningPods: 1,
				Acquired:         cond{metav1.ConditionFalse, ReasonRecovering, "restarted while holding the lease with fencing token 7: renewing it before anything else", 4},
				HeartbeatHealthy: reachable, Conditions: 2,
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := computeStatus(berthv1alpha1.BerthLeaseStatus{}, tc.in)
			if diff := cmp.Diff(tc.want, summarize(got)); diff != "" {
				t.Errorf("computeStatus() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStatusUnchangedByRenewals: neither a renewal of the held term nor
// one of the term another cluster holds changes status, so that status is
// written on transitions only, however many leases a cluster renews.
func TestStatusUnchangedByRenewals(t *testing.T) {
	later := func(r client.AcquireResult) client.AcquireResult {
		r.RenewedAt, r.ExpiresAt = r.RenewedAt.Add(time.Minute), r.ExpiresAt.Add(time.Minute)
		return r
	}
	for name, pair := range map[string][2]statusInput{
		"held": {
			input(facts(withTerm(heldTerm())), observed(granted(us, 7))),
			input(facts(withTerm(term(15*time.Second, 20*time.Second))), observed(later(granted(us, 7)))),
		},
		"waiting": {
			input(facts(), observed(granted(other, 8))),
			input(facts(), observed(later(granted(other, 8)))),
		},
	} {
		before := computeStatus(berthv1alpha1.BerthLeaseStatus{}, pair[0])
		after := computeStatus(before, pair[1])
		if diff := cmp.Diff(before, after); diff != "" {
			t.Errorf("%s: a renewal changed status (-before +after):\n%s", name, diff)
		}
	}
}

// TestStatusTransitionTimes: a condition keeps its transition time while its
// status does not change, and takes a new one when it does; the old status
// is not modified.
func TestStatusTransitionTimes(t *testing.T) {
	long := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	held := input(facts(withTerm(heldTerm())), observed(granted(us, 7)))
	aged := func(in statusInput) berthv1alpha1.BerthLeaseStatus {
		st := computeStatus(berthv1alpha1.BerthLeaseStatus{}, in)
		for i := range st.Conditions {
			st.Conditions[i].LastTransitionTime = long
		}
		return st
	}

	cases := map[string]struct {
		old  berthv1alpha1.BerthLeaseStatus
		in   statusInput
		want map[string]bool // condition type → transition time kept
	}{
		"unchanged": {
			old: aged(held), in: held,
			want: map[string]bool{ConditionAcquired: true, ConditionHeartbeatHealthy: true},
		},
		"new generation and token, same statuses": {
			old: aged(held),
			in: func() statusInput {
				in := input(facts(withTerm(heldTerm())), observed(granted(us, 9)))
				in.generation = 5
				return in
			}(),
			want: map[string]bool{ConditionAcquired: true, ConditionHeartbeatHealthy: true},
		},
		"heartbeat fails, still held": {
			old:  aged(held),
			in:   input(facts(withTerm(renewDueTerm())), observed(granted(us, 7)), apiErr(errUnreachable)),
			want: map[string]bool{ConditionAcquired: true, ConditionHeartbeatHealthy: false},
		},
		"self-fenced": {
			old:  aged(held),
			in:   input(facts(withTerm(pastDeadlineTerm()), withRunning(1)), selfFenced),
			want: map[string]bool{ConditionAcquired: false, ConditionHeartbeatHealthy: false},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := tc.old.DeepCopy()
			got := computeStatus(tc.old, tc.in)
			kept := map[string]bool{}
			for _, c := range got.Conditions {
				if c.Type == ConditionReady || c.Type == ConditionReconciling || c.Type == ConditionStalled {
					continue // TestStatusHealth
				}
				kept[c.Type] = c.LastTransitionTime.Equal(&long)
				if c.ObservedGeneration != tc.in.generation {
					t.Errorf("condition %s has observedGeneration %d, want %d", c.Type, c.ObservedGeneration, tc.in.generation)
				}
			}
			if diff := cmp.Diff(tc.want, kept); diff != "" {
				t.Errorf("transition time kept (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, &tc.old); diff != "" {
				t.Errorf("computeStatus() modified the old status (-before +after):\n%s", diff)
			}
		})
	}
}

// lease builds a status for the transition tests.
func lease(state, phase, holder string, token int32, opts ...func(*berthv1alpha1.BerthLeaseStatus)) berthv1alpha1.BerthLeaseStatus {
	st := berthv1alpha1.BerthLeaseStatus{LeaseState: state, Phase: phase, CurrentHolder: holder, FencingToken: token}
	heartbeat(metav1.ConditionTrue, ReasonReachable, "the lease API answers")(&st)
	for _, o := range opts {
		o(&st)
	}
	return st
}

func heartbeat(status metav1.ConditionStatus, reason, message string) func(*berthv1alpha1.BerthLeaseStatus) {
	return func(st *berthv1alpha1.BerthLeaseStatus) {
		apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionHeartbeatHealthy, Status: status, Reason: reason, Message: message})
	}
}

func revokedTerm(st *berthv1alpha1.BerthLeaseStatus) {
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionAcquired, Status: metav1.ConditionFalse, Reason: ReasonRevoked})
}

func running(n int32) func(*berthv1alpha1.BerthLeaseStatus) {
	return func(st *berthv1alpha1.BerthLeaseStatus) { st.RunningPods = n }
}

var (
	fencedHB      = heartbeat(metav1.ConditionFalse, ReasonSelfFenced, "the local deadline passed without a renewal")
	unreachableHB = heartbeat(metav1.ConditionFalse, ReasonLeaseAPIUnreachable, "connection refused")
)

func TestTransitions(t *testing.T) {
	cases := map[string]struct {
		old, new   berthv1alpha1.BerthLeaseStatus
		handedOver int32
		want       []transition
	}{
		"unchanged while held": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateHeld, PhaseActive, us, 7),
		},
		"unchanged while waiting": {
			old: lease(StateWaiting, "", other, 8), new: lease(StateWaiting, "", other, 8),
		},
		"first status, waiting": {
			new: lease(StateWaiting, "", other, 8),
		},
		"acquired": {
			old: lease(StateWaiting, "", other, 8), new: lease(StateHeld, PhaseActive, us, 9),
			want: []transition{{corev1.EventTypeNormal, "Acquired", "lease acquired by cluster-a with fencing token 9"}},
		},
		"acquired on the first status": {
			new:  lease(StateHeld, PhaseActive, us, 1),
			want: []transition{{corev1.EventTypeNormal, "Acquired", "lease acquired by cluster-a with fencing token 1"}},
		},
		"re-acquired with a new token": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateHeld, PhaseActive, us, 10),
			want: []transition{{corev1.EventTypeNormal, "Acquired", "lease acquired by cluster-a with fencing token 10"}},
		},
		"lost while stopping": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateWaiting, PhaseStopping, other, 8, running(2)),
			want: []transition{
				{corev1.EventTypeWarning, "Lost", `lease with fencing token 7 lost; holder now "cluster-b"`},
				{corev1.EventTypeWarning, "Stopping", "stopping 2 running Pod(s)"},
			},
		},
		"lost with nothing running": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateWaiting, "", other, 8),
			want: []transition{{corev1.EventTypeWarning, "Lost", `lease with fencing token 7 lost; holder now "cluster-b"`}},
		},
		"handed over after a revocation or a move": {
			old: lease(StateHeld, PhaseStopping, us, 7, revokedTerm), new: lease(StateWaiting, "", "", 7), handedOver: 7,
			want: []transition{{corev1.EventTypeNormal, "HandedOver", `lease with fencing token 7 handed over after it was revoked or moved`}},
		},
		"revoked, but lost before the agent released it": {
			old: lease(StateHeld, PhaseStopping, us, 7, revokedTerm, running(1)), new: lease(StateWaiting, PhaseStopping, other, 8, running(1)), handedOver: 3,
			want: []transition{{corev1.EventTypeWarning, "Lost", `lease with fencing token 7 lost; holder now "cluster-b"`}},
		},
		"released": {
			old: lease(StateHeld, PhaseStopping, us, 7), new: lease(StateReleased, "", "", 7),
			want: []transition{{corev1.EventTypeNormal, "Released", "lease released (fencing token 7)"}},
		},
		"stopping starts while still held": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateHeld, PhaseStopping, us, 7, running(1)),
			want: []transition{{corev1.EventTypeWarning, "Stopping", "stopping 1 running Pod(s)"}},
		},
		"stopping for a revocation or a move": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateHeld, PhaseStopping, us, 7, running(2), revokedTerm),
			want: []transition{{corev1.EventTypeNormal, "Stopping", "stopping 2 running Pod(s) to hand the lease over: its term was revoked or moved"}},
		},
		"still stopping": {
			old: lease(StateHeld, PhaseStopping, us, 7, running(2)), new: lease(StateHeld, PhaseStopping, us, 7, running(1)),
		},
		"self-fenced": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateHeld, PhaseStopping, us, 7, running(1), fencedHB),
			want: []transition{
				{corev1.EventTypeWarning, "Stopping", "stopping 1 running Pod(s)"},
				{corev1.EventTypeWarning, ReasonSelfFenced, "the local deadline passed without a renewal"},
			},
		},
		"still self-fenced: once": {
			old: lease(StateHeld, PhaseStopping, us, 7, fencedHB), new: lease(StateHeld, PhaseStopping, us, 7, fencedHB),
		},
		"lease API unreachable": {
			old: lease(StateHeld, PhaseActive, us, 7), new: lease(StateHeld, PhaseActive, us, 7, unreachableHB),
			want: []transition{{corev1.EventTypeWarning, ReasonLeaseAPIUnreachable, "connection refused"}},
		},
		"still unreachable: once": {
			old: lease(StateWaiting, "", "", 0, unreachableHB), new: lease(StateWaiting, "", "", 0, unreachableHB),
		},
		"unreachable, then self-fenced": {
			old: lease(StateHeld, PhaseStopping, us, 7, unreachableHB), new: lease(StateHeld, PhaseStopping, us, 7, fencedHB),
			want: []transition{{corev1.EventTypeWarning, ReasonSelfFenced, "the local deadline passed without a renewal"}},
		},
		"reachable again": {
			old: lease(StateWaiting, "", "", 0, unreachableHB), new: lease(StateWaiting, "", other, 8),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := transitions(tc.old, tc.new, tc.handedOver)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(transition{})); diff != "" {
				t.Errorf("transitions() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStatusTransitionsFromCompute runs a term through computeStatus and
// checks the Events each step deserves: acquired, self-fenced while
// stopping, released.
func TestStatusTransitionsFromCompute(t *testing.T) {
	steps := []struct {
		in   statusInput
		want []string // reasons
	}{
		{in: input(facts(), observed(granted(other, 6))), want: nil},
		{in: input(facts(withTerm(heldTerm()), withGated(1)), observed(granted(us, 7))), want: []string{"Acquired"}},
		{in: input(facts(withTerm(renewDueTerm())), observed(granted(us, 7))), want: nil},
		{in: input(facts(withTerm(pastDeadlineTerm()), withRunning(1)), observed(granted(us, 7)), apiErr(errUnreachable), selfFenced), want: []string{"Stopping", ReasonSelfFenced}},
		{in: input(facts(withTerm(pastDeadlineTerm()), withRunning(1)), observed(granted(us, 7)), apiErr(errUnreachable), selfFenced), want: nil},
		{in: input(facts(deleting), observed(client.AcquireResult{FencingToken: 7})), want: []string{"Released"}},
	}
	var st berthv1alpha1.BerthLeaseStatus
	for i, step := range steps {
		next := computeStatus(st, step.in)
		var got []string
		for _, tr := range transitions(st, next, 0) {
			got = append(got, tr.reason)
		}
		if diff := cmp.Diff(step.want, got); diff != "" {
			t.Errorf("step %d: Event reasons mismatch (-want +got):\n%s", i, diff)
		}
		st = next
	}
}

// TestStatusHealth: the Ready, Reconciling and Stalled conditions that
// kstatus, Flux and Argo CD read. A standby cluster with a healthy agent is
// Ready; failures are Stalled with a reason a person understands.
func TestStatusHealth(t *testing.T) {
	refused := func(in *statusInput) {
		in.facts.Cordoned = true
		in.yieldReason, in.yieldMessage = ReasonRegistrationRefused, `cluster id "cluster-a" is registered by another cluster`
	}
	ttl := func(in *statusInput) { in.ttl = 6 * time.Second }
	stoppingSince := func(ago time.Duration) berthv1alpha1.BerthLeaseStatus {
		var st berthv1alpha1.BerthLeaseStatus
		apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionReconciling, Status: metav1.ConditionTrue, Reason: ReasonStopping, LastTransitionTime: metav1.NewTime(t0.Add(-ago))})
		return st
	}
	stopping1 := "stopping 1 running Pod(s) before giving the lease up"
	unreachableSince := func(ago time.Duration) berthv1alpha1.BerthLeaseStatus {
		var st berthv1alpha1.BerthLeaseStatus
		apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionHeartbeatHealthy, Status: metav1.ConditionFalse, Reason: ReasonLeaseAPIUnreachable, LastTransitionTime: metav1.NewTime(t0.Add(-ago))})
		return st
	}

	cases := map[string]struct {
		old  berthv1alpha1.BerthLeaseStatus
		in   statusInput
		want []string
	}{
		"active": {
			in:   input(facts(withTerm(heldTerm()), withRunning(2), withGated(1)), observed(granted(us, 7)), ttl),
			want: []string{"Ready=True/Active: active: held by cluster-a with fencing token 7; 2 of 3 Pod(s) running"},
		},
		"standby, held by another cluster": {
			in:   input(facts(withGated(2)), observed(granted(other, 8)), ttl),
			want: []string{"Ready=True/Standby: standby: held by cluster-b with fencing token 8; 2 Pod(s) wait behind the gate"},
		},
		"standby, released by the last holder": {
			in:   input(facts(), observed(client.AcquireResult{FencingToken: 7}), ttl),
			want: []string{"Ready=True/Standby: standby: released with fencing token 7; 0 Pod(s) wait behind the gate"},
		},
		"standby, cordoned": {
			in:   input(facts(cordoned, withGated(1)), observed(granted(other, 8)), ttl),
			want: []string{"Ready=True/Standby: standby: this cluster is cordoned at the lease API; it takes no leases until uncordoned"},
		},
		"free, acquiring": {
			in: input(facts(), ttl),
			want: []string{
				"Ready=False/Acquiring: the lease is free; acquiring",
				"Reconciling=True/Acquiring: the lease is free; acquiring",
			},
		},
		"stopping": {
			in: input(facts(withRunning(1)), observed(granted(other, 8)), ttl),
			want: []string{
				"Ready=False/Stopping: " + stopping1,
				"Reconciling=True/Stopping: " + stopping1,
			},
		},
		"stopping for less than twice the TTL": {
			old: stoppingSince(11 * time.Second),
			in:  input(facts(withRunning(1)), observed(granted(other, 8)), ttl),
			want: []string{
				"Ready=False/Stopping: " + stopping1,
				"Reconciling=True/Stopping: " + stopping1,
			},
		},
		"stuck stopping": {
			old: stoppingSince(13 * time.Second),
			in:  input(facts(withRunning(1)), observed(granted(other, 8)), ttl),
			want: []string{
				"Ready=False/StuckStopping: 1 Pod(s) have been stopping for more than 12s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone",
				"Stalled=True/StuckStopping: 1 Pod(s) have been stopping for more than 12s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone",
			},
		},
		"self-fenced": {
			in: input(facts(withTerm(pastDeadlineTerm()), withRunning(1)), observed(granted(us, 7)), apiErr(errUnreachable), selfFenced, ttl),
			want: []string{
				"Ready=False/SelfFenced: self-fenced: the local deadline passed without a renewal; Pods are stopped whether or not the lease API answers",
				"Stalled=True/SelfFenced: self-fenced: the local deadline passed without a renewal; Pods are stopped whether or not the lease API answers",
			},
		},
		"registration refused": {
			in: input(facts(), refused, ttl),
			want: []string{
				`Ready=False/RegistrationRefused: cluster id "cluster-a" is registered by another cluster`,
				`Stalled=True/RegistrationRefused: cluster id "cluster-a" is registered by another cluster`,
			},
		},
		"lease API unreachable: retried first": {
			in: input(facts(), apiErr(errUnreachable), ttl),
			want: []string{
				"Ready=False/LeaseAPIUnreachable: retrying: " + errUnreachable.Error(),
				"Reconciling=True/LeaseAPIUnreachable: retrying: " + errUnreachable.Error(),
			},
		},
		"lease API unreachable for longer than the TTL": {
			old: unreachableSince(7 * time.Second),
			in:  input(facts(), apiErr(errUnreachable), ttl),
			want: []string{
				"Ready=False/LeaseAPIUnreachable: failing for more than 6s (the TTL): " + errUnreachable.Error(),
				"Stalled=True/LeaseAPIUnreachable: failing for more than 6s (the TTL): " + errUnreachable.Error(),
			},
		},
		"held, renewals failing": {
			in: input(facts(withTerm(renewDueTerm())), observed(granted(us, 7)), apiErr(errUnreachable), ttl),
			want: []string{
				"Ready=False/LeaseAPIUnreachable: retrying: " + errUnreachable.Error(),
				"Reconciling=True/LeaseAPIUnreachable: retrying: " + errUnreachable.Error(),
			},
		},
		"revoked, Pods stuck stopping": {
			old: stoppingSince(13 * time.Second),
			in:  input(facts(withTerm(heldTerm()), revoked, withRunning(1)), observed(granted(us, 7)), ttl),
			want: []string{
				"Ready=False/StuckStopping: 1 Pod(s) have been stopping for more than 12s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone",
				"Stalled=True/StuckStopping: 1 Pod(s) have been stopping for more than 12s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone",
			},
		},
		"invalid spec": {
			in: input(facts(invalid), specErr(errNoHolder), ttl),
			want: []string{
				"Ready=False/InvalidSpec: " + errNoHolder.Error(),
				"Stalled=True/InvalidSpec: " + errNoHolder.Error(),
			},
		},
		"another BerthLease names the lease": {
			in: input(facts(shadowed), func(in *statusInput) { in.shadowedBy = "billing" }, ttl),
			want: []string{
				"Ready=False/LeaseNameInUse: BerthLease billing, made earlier, names the same lease; this one waits until it is gone",
				"Stalled=True/LeaseNameInUse: BerthLease billing, made earlier, names the same lease; this one waits until it is gone",
			},
		},
		"restarted, recovering": {
			in: input(facts(withRecover(7), withRunning(1)), ttl),
			want: []string{
				"Ready=False/Recovering: restarted while holding the lease with fencing token 7: renewing it before anything else",
				"Reconciling=True/Recovering: restarted while holding the lease with fencing token 7: renewing it before anything else",
			},
		},
		"deleting": {
			in: input(facts(deleting), observed(client.AcquireResult{FencingToken: 7}), ttl),
			want: []string{
				"Ready=False/Deleting: the BerthLease is being deleted; the lease is given up",
				"Reconciling=True/Deleting: the BerthLease is being deleted; the lease is given up",
			},
		},
		"still stuck: the stop's start is kept": {
			old: computeStatus(stoppingSince(13*time.Second), input(facts(withRunning(1)), observed(granted(other, 8)), ttl)),
			in:  input(facts(withRunning(1)), observed(granted(other, 8)), ttl),
			want: []string{
				"Ready=False/StuckStopping: 1 Pod(s) have been stopping for more than 12s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone",
				"Stalled=True/StuckStopping: 1 Pod(s) have been stopping for more than 12s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone",
			},
		},
		"recovered from a failure: the abnormal conditions go": {
			old:  computeStatus(berthv1alpha1.BerthLeaseStatus{}, input(facts(), apiErr(errUnreachable), ttl)),
			in:   input(facts(withGated(1)), observed(granted(other, 8)), ttl),
			want: []string{"Ready=True/Standby: standby: held by cluster-b with fencing token 8; 1 Pod(s) wait behind the gate"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := computeStatus(tc.old, tc.in)
			if diff := cmp.Diff(tc.want, healthOf(got)); diff != "" {
				t.Errorf("health conditions mismatch (-want +got):\n%s", diff)
			}
			for _, c := range got.Conditions {
				if c.ObservedGeneration != tc.in.generation || c.LastTransitionTime.IsZero() {
					t.Errorf("condition %s: observedGeneration %d (want %d), lastTransitionTime %v", c.Type, c.ObservedGeneration, tc.in.generation, c.LastTransitionTime)
				}
			}
		})
	}
}
