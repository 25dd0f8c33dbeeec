package reconciler

import berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"

// The names below are the seed's exported names; their values are defined
// once, in api/v1alpha1 (names.go), for every part of Berth to share.

// LeaseState values written to BerthLease.status.leaseState.
const (
	StateHeld     = berthv1alpha1.LeaseStateHeld
	StateWaiting  = berthv1alpha1.LeaseStateWaiting
	StateReleased = berthv1alpha1.LeaseStateReleased
)

// Condition types written to BerthLease.status.conditions.
const (
	ConditionAcquired         = berthv1alpha1.AcquiredCondition
	ConditionHeartbeatHealthy = berthv1alpha1.HeartbeatHealthyCondition
	ConditionReady            = berthv1alpha1.ReadyCondition
	ConditionReconciling      = berthv1alpha1.ReconcilingCondition
	ConditionStalled          = berthv1alpha1.StalledCondition
)

// Names on managed Pods, and the phases of status.phase.
const (
	// ManagedLease is the Pod label that opts a Pod in: its value names the
	// BerthLease (in the Pod's namespace) the Pod runs under.
	ManagedLease = berthv1alpha1.ManagedLeaseLabel
	// ManagedUID is the Pod label admission stamps with the BerthLease's UID.
	ManagedUID = berthv1alpha1.ManagedLeaseUIDLabel
	// SchedulingGate keeps a managed Pod from scheduling until this cluster
	// holds the lease.
	SchedulingGate = berthv1alpha1.LeaseHeldSchedulingGate
	// FenceVolume marks a Pod that runs under berth-fence.
	FenceVolume = berthv1alpha1.FenceVolume
	// PhaseActive: this cluster holds the lease and may run the Pods.
	PhaseActive = berthv1alpha1.PhaseActive
	// PhaseStopping: this cluster is removing its Pods before giving the
	// lease up.
	PhaseStopping = berthv1alpha1.PhaseStopping
)

// FinalizerName is the finalizer applied to BerthLease objects so the
// reconciler can stop managed Pods and release ownership before garbage
// collection.
const FinalizerName = berthv1alpha1.LeaseReleaseFinalizer

// Pod annotations written when a Pod is ungated, so that the workload can
// read its term through the downward API and fence its own writes.
const (
	AnnotationFencingToken = berthv1alpha1.FencingTokenAnnotation
	AnnotationHolder       = berthv1alpha1.HolderAnnotation
)
