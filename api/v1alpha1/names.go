package v1alpha1

// The names below are shared by every part of Berth (the agent's reconciler,
// its fleet membership, admission, the tests): the labels, gate, annotations
// and finalizer Berth puts on objects, and the values of a BerthLease's
// status. They live in the API package, as cluster-api keeps its well-known
// labels in its own, so that a consumer needs no controller package for a
// name. reconciler and fleet keep their exported names as aliases of these.

// Names on managed Pods and on BerthLeases.
const (
	// ManagedLeaseLabel is the Pod label that opts a Pod in: its value names
	// the BerthLease (in the Pod's namespace) the Pod runs under.
	ManagedLeaseLabel = "berth.skaphos.io/managed-lease"
	// ManagedLeaseUIDLabel is the Pod label admission stamps with the
	// BerthLease's UID.
	ManagedLeaseUIDLabel = "berth.skaphos.io/managed-lease-uid"
	// LeaseHeldSchedulingGate keeps a managed Pod from scheduling until this
	// cluster holds the lease.
	LeaseHeldSchedulingGate = "berth.skaphos.io/lease-held"
	// FencingTokenAnnotation and HolderAnnotation are written on a Pod when
	// it is ungated, so that the workload can read its term through the
	// downward API and fence its own writes.
	FencingTokenAnnotation = "berth.skaphos.io/fencing-token"
	HolderAnnotation       = "berth.skaphos.io/holder"
	// FenceVolume is the projected volume admission puts into the Pods of a
	// BerthLease with spec.podFencing Exec (the Pod's token and term for
	// berth-fence): a Pod that has it runs fenced.
	FenceVolume = "berth-fence"
	// LeaseReleaseFinalizer keeps a BerthLease until the agent has stopped
	// its managed Pods and given its lease up.
	LeaseReleaseFinalizer = "berth.skaphos.io/lease-release"
)

// Values of BerthLeaseStatus.LeaseState.
const (
	LeaseStateHeld     = "held"
	LeaseStateWaiting  = "waiting"
	LeaseStateReleased = "released"
)

// Values of BerthLeaseStatus.Phase (empty while the cluster neither runs nor
// stops the managed Pods).
const (
	// PhaseActive: this cluster holds the lease and may run the Pods.
	PhaseActive = "Active"
	// PhaseStopping: this cluster is removing its Pods before giving the
	// lease up.
	PhaseStopping = "Stopping"
)

// Condition types of BerthLeaseStatus.Conditions.
const (
	AcquiredCondition         = "Acquired"
	HeartbeatHealthyCondition = "HeartbeatHealthy"

	// ReadyCondition, ReconcilingCondition and StalledCondition summarize
	// the others as kstatus (sigs.k8s.io/cli-utils), Flux and Argo CD read
	// health: Ready is always written, True while the cluster does its part
	// (it runs the workload, or it stands by with a healthy agent);
	// Reconciling and Stalled are written only while True (kstatus's
	// "abnormal-true" conditions): Reconciling while the cluster is on its
	// way to one of those (acquiring, stopping, recovering), Stalled when it
	// cannot get there without someone's help.
	ReadyCondition       = "Ready"
	ReconcilingCondition = "Reconciling"
	StalledCondition     = "Stalled"
)

// Condition reasons.
const (
	HeldReason                = "Held"
	HeldByOtherReason         = "HeldByOther"
	FreeReason                = "Free"
	StoppingReason            = "Stopping"
	ReleasedReason            = "Released"
	DeletingReason            = "Deleting"
	InvalidSpecReason         = "InvalidSpec"
	LeaseAPIUnreachableReason = "LeaseAPIUnreachable"
	RenewedReason             = "Renewed"
	ReachableReason           = "Reachable"
	SelfFencedReason          = "SelfFenced"
	LeaseNameInUseReason      = "LeaseNameInUse"
	RevokedReason             = "Revoked"
	RecoveringReason          = "Recovering"

	// Reasons of the Events placement emits (spec.placement, spec.failover).
	FailingBackReason      = "FailingBack"
	FailingOverReason      = "FailingOver"
	FailoverLimitedReason  = "FailoverLimited"
	InvalidPlacementReason = "InvalidPlacement"
	FailbackHeldReason     = "FailbackHeld"
	PlacementIgnoredReason = "PlacementIgnored"

	// Reasons a cluster must hand its leases over: its fleet membership.

	// CordonedReason: the cluster is cordoned at the lease API.
	CordonedReason = "Cordoned"
	// RegistrationRefusedReason: another live cluster registered the same id.
	RegistrationRefusedReason = "RegistrationRefused"
	// UnregisteredReason: the cluster is not (yet) registered.
	UnregisteredReason = "Unregistered"
	// LeavingReason: the cluster is leaving a fleet-mode agent (its
	// kubeconfig was removed from the folder).
	LeavingReason = "Leaving"

	// Reasons of the Ready, Reconciling and Stalled conditions (the others
	// above serve them too).

	// ActiveReason: Ready; this cluster holds the lease and runs the workload.
	ActiveReason = "Active"
	// StandbyReason: Ready; another cluster holds the lease (or this one is
	// cordoned) and this one's copies wait behind the gate, its agent healthy.
	StandbyReason = "Standby"
	// AcquiringReason: Reconciling; the lease is free and this cluster is
	// taking it.
	AcquiringReason = "Acquiring"
	// StuckStoppingReason: Stalled; the managed Pods have been stopping for
	// longer than twice the TTL (a finalizer, an unreachable node).
	StuckStoppingReason = "StuckStopping"
)

// Annotations the agent writes on a managed workload (a Deployment,
// StatefulSet or CronJob labelled ManagedLeaseLabel), so that GitOps health
// checks can tell a standby copy from a broken one. HolderAnnotation and
// FencingTokenAnnotation name the current holder and its term there too.
const (
	// LeaseStateAnnotation is the workload's part in the lease:
	// WorkloadActive, WorkloadStandby or WorkloadStopping.
	LeaseStateAnnotation = "berth.skaphos.io/lease-state"
	// SuspendedByAnnotation marks a CronJob the agent suspended because its
	// cluster does not hold the lease; the agent resumes only CronJobs it
	// suspended itself.
	SuspendedByAnnotation = "berth.skaphos.io/suspended-by"
	// ResumedAtAnnotation is when the agent resumed a CronJob at a takeover
	// (RFC 3339): it also records that time as the CronJob's
	// status.lastScheduleTime, so that the CronJob controller does not run
	// the schedule the previous holder ran. A health check that finds the
	// two equal knows no run has come since, rather than a failed one.
	ResumedAtAnnotation = "berth.skaphos.io/resumed-at"
)

// Values of LeaseStateAnnotation.
const (
	// WorkloadActive: this cluster holds the lease; the workload runs here.
	WorkloadActive = "active"
	// WorkloadStandby: another cluster runs the workload (or none does yet);
	// the copies here wait behind the gate, CronJobs suspended.
	WorkloadStandby = "standby"
	// WorkloadStopping: this cluster is stopping the workload's Pods before
	// giving the lease up.
	WorkloadStopping = "stopping"
)
