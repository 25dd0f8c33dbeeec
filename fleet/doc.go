// Package fleet makes a cluster a member of Berth's fleet: it finds the
// cluster's fingerprint (the UID of its kube-system namespace), registers the
// cluster at the lease API under its cluster id, heartbeats, and tells the
// reconciler when the cluster must hand its leases over: when the lease API
// marks it cordoned, or when it refused the registration because another
// live cluster holds the same id.
//
// KubeconfigDir is the multicluster-runtime provider of fleet mode: the
// clusters whose kubeconfigs are the files of a folder.
//
// What a BerthLease does with that is package reconciler's concern.
package fleet
