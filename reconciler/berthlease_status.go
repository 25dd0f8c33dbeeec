package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// Condition reasons (defined in api/v1alpha1, names.go).
const (
	ReasonHeld                = berthv1alpha1.HeldReason
	ReasonHeldByOther         = berthv1alpha1.HeldByOtherReason
	ReasonFree                = berthv1alpha1.FreeReason
	ReasonStopping            = berthv1alpha1.StoppingReason
	ReasonReleased            = berthv1alpha1.ReleasedReason
	ReasonDeleting            = berthv1alpha1.DeletingReason
	ReasonCordoned            = berthv1alpha1.CordonedReason
	ReasonInvalidSpec         = berthv1alpha1.InvalidSpecReason
	ReasonLeaseAPIUnreachable = berthv1alpha1.LeaseAPIUnreachableReason
	ReasonRenewed             = berthv1alpha1.RenewedReason
	ReasonReachable           = berthv1alpha1.ReachableReason
	ReasonSelfFenced          = berthv1alpha1.SelfFencedReason
	ReasonLeaseNameInUse      = berthv1alpha1.LeaseNameInUseReason
	ReasonRevoked             = berthv1alpha1.RevokedReason
	ReasonRecovering          = berthv1alpha1.RecoveringReason
	ReasonRegistrationRefused = berthv1alpha1.RegistrationRefusedReason
	ReasonActive              = berthv1alpha1.ActiveReason
	ReasonStandby             = berthv1alpha1.StandbyReason
	ReasonAcquiring           = berthv1alpha1.AcquiringReason
	ReasonStuckStopping       = berthv1alpha1.StuckStoppingReason
)

// statusInput is what the status is computed from.
type statusInput struct {
	generation int64
	holder     string
	facts      Facts
	decision   Decision
	tenure     tenure
	specErr    error
	managed    int
	// yieldReason and yieldMessage say why the fleet asks for a handover.
	yieldReason, yieldMessage string
	// shadowedBy names the older BerthLease that names the same lease.
	shadowedBy string
	// ttl is the lease's term: Pods stopping for more than twice as long
	// are stuck.
	ttl time.Duration
}

// computeStatus is the status the facts describe. It is pure: conditions keep
// their transition times when they do not change.
func computeStatus(old berthv1alpha1.BerthLeaseStatus, in statusInput) berthv1alpha1.BerthLeaseStatus {
	f, mem := in.facts, in.tenure
	st := old.DeepCopy()
	st.ObservedGeneration = in.generation
	st.Phase = in.decision.Phase
	st.ManagedPods = int32(in.managed)
	st.RunningPods = int32(f.RunningPods)
	st.GatedPods = int32(f.GatedPods)

	switch {
	case f.Term != nil:
		st.LeaseState = StateHeld
	case f.RecoverToken > 0 || f.ReleaseToken > 0:
		// A token this cluster may still hold: status keeps it, so that an
		// agent restarted now recovers it and renews it while Pods stop.
		st.LeaseState = StateHeld
	case f.Shadowed && !f.Deleting:
		st.LeaseState = StateWaiting
	case f.mustYield() && f.RecoverToken == 0 && f.ReleaseToken == 0:
		st.LeaseState = StateReleased
	default:
		st.LeaseState = StateWaiting
	}
	st.CurrentHolder, st.FencingToken = mem.observed.Holder, mem.observed.FencingToken
	switch {
	case f.Term != nil:
		st.CurrentHolder, st.FencingToken = f.Term.Holder, f.Term.Token
	case f.RecoverToken > 0 || f.ReleaseToken > 0:
		st.CurrentHolder, st.FencingToken = in.holder, max(f.RecoverToken, f.ReleaseToken)
	}
	// A release of unknown outcome, for an agent that starts anew
	// (recordRelease wrote it before the release was sent).
	st.ReleasingToken = mem.releaseSent
	// The term's start changes only with the term. Renewals are not
	// written: a write per renewal and lease does not scale (metrics and
	// the lease API have them).
	st.AcquiredAt = microTime(mem.observed.AcquiredAt)
	st.RenewTime, st.ExpiresAt = nil, nil

	acquired := acquiredCondition(in)
	acquired.ObservedGeneration = in.generation
	apimeta.SetStatusCondition(&st.Conditions, acquired)
	heartbeat := heartbeatCondition(in)
	heartbeat.ObservedGeneration = in.generation
	apimeta.SetStatusCondition(&st.Conditions, heartbeat)
	setHealth(&st.Conditions, health(in, acquired, heartbeat, stoppingSince(old.Conditions, f.Now), unhealthySince(old.Conditions, heartbeat, f.Now)), in.generation, f.Now)
	return *st
}

// healthState is what the Ready, Reconciling and Stalled conditions say.
type healthState struct {
	ready metav1.Condition
	// reconciling and stalled are nil when False: they are written only
	// while True.
	reconciling, stalled *metav1.Condition
}

// stuckStoppingAfter is how long Pods may be stopping before the
// BerthLease reports itself stalled: twice the TTL. The agent deletes them
// with a grace period within the TTL, so Pods still there after twice as
// long are held by something it cannot remove (a finalizer, an unreachable
// node's kubelet).
func stuckStoppingAfter(ttl time.Duration) time.Duration { return 2 * ttl }

// stoppingSince is since when status says the Pods are stopping (the
// transition time of Reconciling/Stopping, or of Stalled/StuckStopping,
// which keeps it), or now.
func stoppingSince(conds []metav1.Condition, now time.Time) time.Time {
	if c := apimeta.FindStatusCondition(conds, ConditionReconciling); c != nil && c.Reason == ReasonStopping {
		return c.LastTransitionTime.Time
	}
	if c := apimeta.FindStatusCondition(conds, ConditionStalled); c != nil && c.Reason == ReasonStuckStopping {
		return c.LastTransitionTime.Time
	}
	return now
}

// unhealthySince is since when the heartbeat has been failing for the
// reason it fails for now (the old condition's transition time), or now.
func unhealthySince(conds []metav1.Condition, heartbeat metav1.Condition, now time.Time) time.Time {
	if c := apimeta.FindStatusCondition(conds, ConditionHeartbeatHealthy); c != nil && c.Status == heartbeat.Status && c.Reason == heartbeat.Reason {
		return c.LastTransitionTime.Time
	}
	return now
}

// health sums the lease's conditions up as kstatus reads them: Ready while
// this cluster does its part (it runs the workload, or stands by with a
// healthy agent), Reconciling on the way there, Stalled when it cannot get
// there without help. since is since when the Pods are stopping, if they
// are (stoppingSince); failing since when the heartbeat fails, if it does
// (unhealthySince): a failure shorter than the TTL is retried, not stalled.
func health(in statusInput, acquired, heartbeat metav1.Condition, since, failing time.Time) healthState {
	f := in.facts
	notReady := func(reason, message string) metav1.Condition {
		return metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: message}
	}
	stalled := func(reason, message string) healthState {
		return healthState{
			ready:   notReady(reason, message),
			stalled: &metav1.Condition{Type: ConditionStalled, Status: metav1.ConditionTrue, Reason: reason, Message: message},
		}
	}
	progressing := func(reason, message string) healthState {
		return healthState{
			ready:       notReady(reason, message),
			reconciling: &metav1.Condition{Type: ConditionReconciling, Status: metav1.ConditionTrue, Reason: reason, Message: message},
		}
	}
	ready := func(reason, message string) healthState {
		return healthState{ready: metav1.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: message}}
	}
	switch {
	case in.specErr != nil:
		return stalled(ReasonInvalidSpec, acquired.Message)
	case heartbeat.Reason == ReasonSelfFenced:
		return stalled(ReasonSelfFenced, "self-fenced: "+heartbeat.Message)
	case in.yieldReason == ReasonRegistrationRefused:
		return stalled(ReasonRegistrationRefused, in.yieldMessage)
	case acquired.Reason == ReasonLeaseNameInUse:
		return stalled(ReasonLeaseNameInUse, acquired.Message)
	case in.decision.Phase == PhaseStopping:
		if after := stuckStoppingAfter(in.ttl); in.ttl > 0 && f.Now.Sub(since) > after {
			h := stalled(ReasonStuckStopping, fmt.Sprintf("%d Pod(s) have been stopping for more than %s (twice the TTL): something keeps them (a finalizer, an unreachable node); the lease is not given up until they are gone", f.RunningPods, after))
			// The stop's start, so that the next status still knows it.
			h.stalled.LastTransitionTime = metav1.NewTime(since)
			return h
		}
		h := progressing(ReasonStopping, acquired.Message)
		h.reconciling.LastTransitionTime = metav1.NewTime(since)
		return h
	case heartbeat.Status != metav1.ConditionTrue && in.ttl > 0 && f.Now.Sub(failing) > in.ttl:
		return stalled(heartbeat.Reason, fmt.Sprintf("failing for more than %s (the TTL): %s", in.ttl, heartbeat.Message))
	case heartbeat.Status != metav1.ConditionTrue:
		return progressing(heartbeat.Reason, "retrying: "+heartbeat.Message)
	case acquired.Status == metav1.ConditionTrue:
		return ready(ReasonActive, fmt.Sprintf("active: %s; %d of %d Pod(s) running", acquired.Message, f.RunningPods, in.managed))
	case acquired.Reason == ReasonHeldByOther, acquired.Reason == ReasonReleased:
		return ready(ReasonStandby, fmt.Sprintf("standby: %s; %d Pod(s) wait behind the gate", acquired.Message, f.GatedPods))
	case acquired.Reason == ReasonCordoned:
		return ready(ReasonStandby, "standby: "+acquired.Message)
	case acquired.Reason == ReasonFree:
		return progressing(ReasonAcquiring, acquired.Message)
	}
	// Recovering, Revoked, Deleting, Unregistered, Leaving: on the way.
	return progressing(acquired.Reason, acquired.Message)
}

// setHealth writes h into conds: Ready always, Reconciling and Stalled
// only while True. Either one whose reason changes starts anew (its
// transition time says since when the cluster is at it).
func setHealth(conds *[]metav1.Condition, h healthState, generation int64, now time.Time) {
	h.ready.ObservedGeneration = generation
	apimeta.SetStatusCondition(conds, h.ready)
	for _, x := range []struct {
		typ string
		c   *metav1.Condition
	}{{ConditionReconciling, h.reconciling}, {ConditionStalled, h.stalled}} {
		typ, c := x.typ, x.c
		if c == nil {
			apimeta.RemoveStatusCondition(conds, typ)
			continue
		}
		c.ObservedGeneration = generation
		if old := apimeta.FindStatusCondition(*conds, typ); old != nil && old.Reason != c.Reason {
			apimeta.RemoveStatusCondition(conds, typ)
		}
		if c.LastTransitionTime.IsZero() && !now.IsZero() {
			c.LastTransitionTime = metav1.NewTime(now)
		}
		apimeta.SetStatusCondition(conds, *c)
	}
}

func acquiredCondition(in statusInput) metav1.Condition {
	f, mem := in.facts, in.tenure
	c := metav1.Condition{Type: ConditionAcquired, Status: metav1.ConditionFalse}
	switch {
	case in.specErr != nil:
		c.Reason, c.Message = ReasonInvalidSpec, in.specErr.Error()
	case f.Revoked:
		c.Reason = ReasonRevoked
		c.Message = fmt.Sprintf("this cluster's term (fencing token %d) was revoked or moved at the lease API (by an administrator, or by placement: see the Events): its Pods are stopped, then the lease goes to another cluster", mem.observed.FencingToken)
	case in.decision.Phase == PhaseStopping:
		c.Reason, c.Message = ReasonStopping, fmt.Sprintf("stopping %d running Pod(s) before giving the lease up", f.RunningPods)
	case f.Term != nil && in.decision.Phase == PhaseActive:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonHeld
		c.Message = fmt.Sprintf("held by %s with fencing token %d", f.Term.Holder, f.Term.Token)
	case f.Deleting:
		c.Reason, c.Message = ReasonDeleting, "the BerthLease is being deleted; the lease is given up"
	case f.Shadowed:
		c.Reason = ReasonLeaseNameInUse
		c.Message = fmt.Sprintf("BerthLease %s, made earlier, names the same lease; this one waits until it is gone", in.shadowedBy)
	case f.Cordoned:
		c.Reason, c.Message = in.yieldReason, in.yieldMessage
		if c.Reason == "" {
			c.Reason, c.Message = ReasonCordoned, "this cluster is cordoned at the lease API; it takes no leases until uncordoned"
		}
	case f.Term == nil && f.RecoverToken > 0:
		c.Reason = ReasonRecovering
		c.Message = fmt.Sprintf("restarted while holding the lease with fencing token %d: renewing it before anything else", f.RecoverToken)
	case mem.apiErr != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionUnknown, ReasonLeaseAPIUnreachable, apiErrMessage(mem.apiErr)
	case mem.observed.Holder != "" && mem.observed.Holder != in.holder:
		c.Reason = ReasonHeldByOther
		c.Message = fmt.Sprintf("held by %s with fencing token %d", mem.observed.Holder, mem.observed.FencingToken)
	case mem.observed.Holder == "" && mem.observed.Message != "":
		// Free, but reserved for another cluster after a move: wait as
		// for a held lease, until the reservation is used or runs out.
		c.Reason, c.Message = ReasonHeldByOther, mem.observed.Message
	case mem.observed.FencingToken > 0 && mem.observed.Holder == "":
		c.Reason, c.Message = ReasonReleased, fmt.Sprintf("released with fencing token %d", mem.observed.FencingToken)
	default:
		c.Reason, c.Message = ReasonFree, "the lease is free; acquiring"
	}
	return c
}

func heartbeatCondition(in statusInput) metav1.Condition {
	c := metav1.Condition{Type: ConditionHeartbeatHealthy, Status: metav1.ConditionTrue}
	switch {
	case in.tenure.selfFenced:
		c.Status, c.Reason = metav1.ConditionFalse, ReasonSelfFenced
		c.Message = "the local deadline passed without a renewal; Pods are stopped whether or not the lease API answers"
	case in.tenure.apiErr != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonLeaseAPIUnreachable, apiErrMessage(in.tenure.apiErr)
	case in.facts.Term != nil:
		c.Reason, c.Message = ReasonRenewed, "the lease API renewed the lease"
	default:
		c.Reason, c.Message = ReasonReachable, "the lease API answers"
	}
	return c
}

// apiErrMessage is a lease API error as a condition message: without the
// request id an error answer carries, so that a condition of the same
// failure keeps its message and status is not written again for it.
func apiErrMessage(err error) string {
	var apiErr *leaseclient.APIError
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("lease API answered %d: %s", apiErr.StatusCode, apiErr.Message)
	}
	return err.Error()
}

func microTime(t time.Time) *metav1.MicroTime {
	if t.IsZero() {
		return nil
	}
	m := metav1.NewMicroTime(t)
	return &m
}

// transition is an Event worth emitting when the status changes.
type transition struct {
	eventType, reason, note string
}

// transitions lists the Events that the change from old to new deserves.
// handedOver is the last revoked term this agent released itself.
func transitions(old, new berthv1alpha1.BerthLeaseStatus, handedOver int32) []transition {
	var out []transition
	wasHeld, isHeld := old.LeaseState == StateHeld, new.LeaseState == StateHeld
	switch {
	case isHeld && (!wasHeld || old.FencingToken != new.FencingToken):
		out = append(out, transition{corev1.EventTypeNormal, "Acquired", fmt.Sprintf("lease acquired by %s with fencing token %d", new.CurrentHolder, new.FencingToken)})
	case wasHeld && !isHeld && new.LeaseState == StateReleased:
		out = append(out, transition{corev1.EventTypeNormal, "Released", fmt.Sprintf("lease released (fencing token %d)", old.FencingToken)})
	case wasHeld && !isHeld && handedOver != 0 && handedOver == old.FencingToken:
		// Revoked or moved at the lease API (an administrator, or placement)
		// and released by this agent once the Pods stopped: nothing was
		// lost. A revoked term that expired or was taken meanwhile is Lost.
		note := fmt.Sprintf("lease with fencing token %d handed over after it was revoked or moved", old.FencingToken)
		if new.CurrentHolder != "" {
			note += fmt.Sprintf("; holder now %q", new.CurrentHolder)
		}
		out = append(out, transition{corev1.EventTypeNormal, "HandedOver", note})
	case wasHeld && !isHeld:
		out = append(out, transition{corev1.EventTypeWarning, "Lost", fmt.Sprintf("lease with fencing token %d lost; holder now %q", old.FencingToken, new.CurrentHolder)})
	}
	if new.Phase == PhaseStopping && old.Phase != PhaseStopping {
		stopping := transition{corev1.EventTypeWarning, "Stopping", fmt.Sprintf("stopping %d running Pod(s)", new.RunningPods)}
		if c := apimeta.FindStatusCondition(new.Conditions, ConditionAcquired); c != nil && c.Reason == ReasonRevoked {
			// A handover asked for at the lease API (an administrator's
			// revocation or move, a failback, a failover, whose own Event
			// says why): the stop is the plan, not a fault.
			stopping.eventType = corev1.EventTypeNormal
			stopping.note += " to hand the lease over: its term was revoked or moved"
		}
		out = append(out, stopping)
	}
	oldHB, newHB := apimeta.FindStatusCondition(old.Conditions, ConditionHeartbeatHealthy), apimeta.FindStatusCondition(new.Conditions, ConditionHeartbeatHealthy)
	if newHB != nil && newHB.Status == metav1.ConditionFalse && (oldHB == nil || oldHB.Reason != newHB.Reason) {
		out = append(out, transition{corev1.EventTypeWarning, newHB.Reason, newHB.Message})
	}
	return out
}

// writeStatus writes the computed status when it changed and emits the
// transition Events. A conflict re-reads the object and tries again.
func (r *BerthLeaseReconciler) writeStatus(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation, mem *memory, d Decision) error {
	var old, st berthv1alpha1.BerthLeaseStatus
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		old = bl.Status
		st = computeStatus(old, statusInput{
			generation: bl.Generation, holder: p.holder, facts: p.facts, decision: d,
			tenure: p.tenure, specErr: p.specErr, managed: p.managed,
			yieldReason: p.yieldReason, yieldMessage: p.yieldMessage, shadowedBy: p.shadowedBy,
			ttl: p.ttl,
		})
		if equality.Semantic.DeepEqual(st, old) {
			return nil
		}
		bl.Status = st
		err := r.Status().Update(ctx, bl)
		if apierrors.IsConflict(err) {
			if gerr := r.APIReader.Get(ctx, ctrlclient.ObjectKeyFromObject(bl), bl); gerr != nil {
				return gerr
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	for _, t := range transitions(old, st, mem.read().handedOver) {
		leaseTransitions.WithLabelValues(r.ClusterIdentity, bl.Namespace, bl.Name, t.reason).Inc()
		if r.Recorder != nil {
			r.Recorder.Eventf(bl, nil, t.eventType, t.reason, "LeaseTransition", "%s", t.note)
		}
	}
	return nil
}

// observeLease sets the gauges of one BerthLease after a reconcile.
func observeLease(cluster string, bl *berthv1alpha1.BerthLease, f Facts, d Decision) {
	held, remaining := 0.0, 0.0
	if d.Phase == PhaseActive && f.Term != nil {
		held = 1
		remaining = max(0, f.Term.Deadline.Sub(f.Now).Seconds())
	}
	leaseHeld.WithLabelValues(cluster, bl.Namespace, bl.Name).Set(held)
	deadlineRemaining.WithLabelValues(cluster, bl.Namespace, bl.Name).Set(remaining)
}
