// Package v1alpha1 is the berth.skaphos.io/v1alpha1 API: the BerthLease
// resource, which binds a workload in this cluster to one lease at Berth's
// central lease API.
//
// +kubebuilder:object:generate=true
// +groupName=berth.skaphos.io
package v1alpha1
