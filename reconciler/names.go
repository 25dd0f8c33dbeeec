package reconciler

// LeaseState values written to BerthLease.status.leaseState.
const (
	StateHeld     = "held"
	StateWaiting  = "waiting"
	StateReleased = "released"
)

// Condition types written to BerthLease.status.conditions.
const (
	ConditionAcquired         = "Acquired"
	ConditionHeartbeatHealthy = "HeartbeatHealthy"
)

// Names on managed Pods, and the phases of status.phase.
const (
	// ManagedLease is the Pod label that opts a Pod in: its value names the
	// BerthLease (in the Pod's namespace) the Pod runs under.
	ManagedLease = "berth.skaphos.io/managed-lease"
	// ManagedUID is the Pod label admission stamps with the BerthLease's UID.
	ManagedUID = "berth.skaphos.io/managed-lease-uid"
	// SchedulingGate keeps a managed Pod from scheduling until this cluster
	// holds the lease.
	SchedulingGate = "berth.skaphos.io/lease-held"
	// PhaseActive: this cluster holds the lease and may run the Pods.
	PhaseActive = "Active"
	// PhaseStopping: this cluster is removing its Pods before giving the
	// lease up.
	PhaseStopping = "Stopping"
)

// FinalizerName is the finalizer applied to BerthLease objects so the
// reconciler can stop managed Pods and release ownership before garbage
// collection.
const FinalizerName = "berth.skaphos.io/lease-release"

// Pod annotations written when a Pod is ungated, so that the workload can
// read its term through the downward API and fence its own writes.
const (
	AnnotationFencingToken = "berth.skaphos.io/fencing-token"
	AnnotationHolder       = "berth.skaphos.io/holder"
)
