package reconciler

import "time"

// Term is this cluster's current hold of a lease, as it measures it.
type Term struct {
	Holder string
	Token  int32
	// Deadline is the local deadline on the monotonic clock: the moment the
	// last granting or renewing request was sent plus LocalValidity.
	Deadline time.Time
	// RenewDue is when the next renew should be sent.
	RenewDue time.Time
}

// Facts is everything the decision needs, gathered before it is made.
type Facts struct {
	Now time.Time
	// Deleting: the BerthLease has a deletion timestamp.
	Deleting bool
	// Invalid: the spec cannot be acted on (no holder, bad timing).
	Invalid bool
	// Cordoned: the fleet asks this cluster to hand its leases over and take
	// none (cordoned at the lease API, or its registration refused).
	Cordoned bool
	// Term is nil while this cluster does not hold the lease.
	Term *Term
	// RecoverToken is the token status says this cluster held, when the
	// agent has no term in memory (it restarted): a renew with it may keep
	// the lease without a failover.
	RecoverToken int32
	// RecoverDeadline bounds how long Pods may run on a recovered token
	// before its renewal is confirmed: the term's local validity measured
	// from the renew time status shows, on the agent's wall clock (all that
	// a restarted process knows of when its predecessor last renewed). Past
	// it, the Pods are stopped and the token renewed while they stop.
	RecoverDeadline time.Time
	// ReleaseToken is a token this cluster may still hold at the lease API
	// without a term it can trust (a recovery that could not be confirmed):
	// it is released once no Pod runs, before anything is acquired.
	ReleaseToken int32
	// RunningPods are managed Pods without the gate that have not finished:
	// they may be running, so the lease must not be given up while any exist.
	RunningPods int
	// PodsUnknown: the Pods could not be listed. Some may be running, so
	// the lease is neither given up nor taken while it lasts.
	PodsUnknown bool
	// GatedPods are managed Pods of this BerthLease waiting behind the gate.
	GatedPods int
	// Shadowed: another BerthLease of this namespace, made earlier, names
	// the same lease. One lease key has one term in a cluster, and only the
	// oldest BerthLease that names it acts on it; the others wait.
	Shadowed bool
	// Revoked: an administrator revoked the term this cluster holds (Term or
	// ReleaseToken). The cluster must hand it over: stop its Pods, renewing
	// the term until they are gone, then release it. A revoked term is
	// released even when another BerthLease names the lease, since nobody
	// can renew it: checkRelease then counts their running Pods instead.
	Revoked bool
	// ReleaseSent: a release of the term or token this cluster holds was
	// sent without a known outcome (the call failed): it may still land at
	// the lease API at any time and free the term. Nobody can rely on such a
	// term, so, like a revoked one, it is released even when another
	// BerthLease names the lease (checkRelease then counts their running
	// Pods), never let go of unconfirmed.
	ReleaseSent bool
	// BatchRenewed: the renewer renews a running term in batches, and wakes
	// the BerthLease when the term ends, is revoked, fails to renew or
	// reaches its local deadline. So the decision to run neither renews the
	// term nor schedules another look; a term that stops is renewed by the
	// reconcile, as without the renewer.
	BatchRenewed bool
	// KeyShared: a read of the API server just before a release found
	// another BerthLease naming the same lease. The term is then also
	// theirs: releasing it could free it while their Pods run, so it is let
	// go of without a release (it is renewed by them or it expires).
	KeyShared bool
}

// Call is the lease API call a decision asks for.
type Call int

const (
	CallNone Call = iota
	CallAcquire
	CallRenew
	// CallRecover renews with a token held without a term: the token from
	// status after a restart, or one whose recovery failed.
	CallRecover
	CallRelease
)

// PodAction is what to do to the managed Pods.
type PodAction int

const (
	PodsNone PodAction = iota
	// PodsUngate removes the gate from the gated Pods.
	PodsUngate
	// PodsStop deletes the ungated Pods.
	PodsStop
)

// Decision is what Decide decided.
type Decision struct {
	Call  Call
	Pods  PodAction
	Phase string
	// RemoveFinalizer: the BerthLease is being deleted and nothing of it
	// runs or is held any more.
	RemoveFinalizer bool
	// DropTerm: forget the term and tokens without releasing them, because
	// another BerthLease names the same lease (Facts.KeyShared).
	DropTerm bool
	// Wake is when to look again at the latest, zero for "on the next event".
	Wake time.Time
}

// stopPollInterval is how often a stopping cluster looks at its Pods (Pod
// deletions also wake it).
const stopPollInterval = 500 * time.Millisecond

// MayRun reports whether the facts let this cluster run its Pods now: it
// holds a term whose local deadline has not passed, and nothing asks it to
// give the lease up.
func (f Facts) MayRun() bool {
	return f.Term != nil && f.Now.Before(f.Term.Deadline) && !f.mustYield()
}

// recovering: restarted while holding, free to keep running, and still
// within the recovered term's deadline.
func (f Facts) recovering() bool {
	return f.Term == nil && f.RecoverToken > 0 && !f.mustYield() && f.Now.Before(f.RecoverDeadline)
}

// mustYield: the cluster must give the lease up whether or not it holds it.
func (f Facts) mustYield() bool {
	return f.Deleting || f.Invalid || f.Cordoned || f.Shadowed || f.Revoked
}

// Decide is the hold/wait/stop decision. It is pure: the same facts always
// give the same decision.
func Decide(f Facts) Decision {
	switch {
	case f.MayRun():
		d := Decision{Phase: PhaseActive}
		if !f.BatchRenewed {
			d.Wake = earliest(f.Term.RenewDue, f.Term.Deadline)
			if !f.Now.Before(f.Term.RenewDue) {
				d.Call = CallRenew
			}
		}
		if f.GatedPods > 0 {
			d.Pods = PodsUngate
		}
		return d

	case f.recovering():
		// Restarted while holding: try to keep the term before anything else.
		return Decision{Call: CallRecover, Wake: f.Now.Add(stopPollInterval)}

	case f.RunningPods > 0 || f.PodsUnknown:
		// Not allowed to run, yet Pods may be running: stop them, and keep
		// the lease until they are gone. Renewing past the local deadline is
		// safe: the lease API only renews a term nobody else has taken, and
		// holding on keeps anyone else from starting while ours may run. A
		// token held without a term (a restart while the cluster must yield,
		// or a recovery that failed) is renewed too: the term it names must
		// outlast the Pods, however long they take to stop.
		d := Decision{Pods: PodsStop, Phase: PhaseStopping, Wake: f.Now.Add(stopPollInterval)}
		switch {
		case f.Term != nil && !f.Now.Before(f.Term.RenewDue):
			d.Call = CallRenew
		case f.Term == nil && (f.RecoverToken > 0 || f.ReleaseToken > 0):
			d.Call = CallRecover
		}
		return d

	case (f.Term != nil || f.RecoverToken > 0 || f.ReleaseToken > 0) && f.KeyShared && !f.Revoked && !f.ReleaseSent:
		// Nothing of ours runs, but the term is another BerthLease's too.
		return Decision{DropTerm: true}

	case f.Term != nil || f.RecoverToken > 0 || f.ReleaseToken > 0:
		// Nothing runs any more: give the lease up. A successful release is
		// followed by a fresh decision in the same reconcile, so Wake only
		// paces retries of a failed release, which must not spin.
		return Decision{Call: CallRelease, Wake: f.Now.Add(stopPollInterval)}

	case f.Deleting:
		return Decision{RemoveFinalizer: true}

	case f.Invalid, f.Cordoned, f.Shadowed, f.Revoked:
		// Wait for the spec to change, the cordon to lift or the older
		// BerthLease to go.
		return Decision{}
	}
	return Decision{Call: CallAcquire}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
