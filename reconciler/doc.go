// Package reconciler is the heart of the Berth agent: BerthLeaseReconciler
// turns the central lease into "this cluster's managed Pods may run" or "they
// must not".
//
// For each BerthLease it acquires the lease at the lease API, renews it every
// heartbeat with its fencing token, and while it holds the lease (and its own
// local deadline has not passed) removes the scheduling gate from the
// BerthLease's managed Pods. When it loses the lease, cannot renew before its
// local deadline, is cordoned, or the BerthLease is deleted, it deletes the
// ungated Pods (their controllers recreate them gated), waits until they are
// gone, and only then releases.
//
// The files split by concern: berthlease_controller.go has the wiring and
// Reconcile, decide.go the pure hold/wait/stop decision, timing.go the timing
// bounds, berthlease_phases.go the actions (lease calls, Pods), and
// berthlease_status.go the status and conditions, computed by pure functions.
// Admission (gating Pods at creation) is package admission's.
package reconciler
