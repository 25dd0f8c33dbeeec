// Package kubernetes is the lease API's store on a Kubernetes cluster the
// team already operates: one coordination.k8s.io/v1 Lease per key, named
// "{namespace}.{name}" (which is why the wire contract bounds that to 253
// characters), and one ConfigMap per registered cluster, all in one
// coordination namespace. Every write is an update guarded by the object's
// resourceVersion, so the API server does the compare-and-swap; the store's
// version is that resourceVersion, which etcd only ever increases. The
// fencing token is the Lease's spec.leaseTransitions.
package kubernetes
