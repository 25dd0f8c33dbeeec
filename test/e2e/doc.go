// Package e2e holds Berth's end-to-end suites: several local clusters
// (test/kubeenv), berth-leaseapi and one berth-agent per cluster as real
// processes, the same BerthLease and managed workload applied to every
// cluster as GitOps would, and a recorder (test/history) that judges safety
// from which cluster ran the Pods when.
package e2e
