// Package kubeenv runs several independent, real Kubernetes clusters on one machine for
// Berth's integration and end-to-end tests and for the sandbox (test/sandbox).
//
// Each cluster is etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
// (which plays the kubelets of a few fake nodes), all built by `make tools` into bin/k8s
// from the versions pinned in hack/tools. Pods are really scheduled and reported Running,
// scheduling gates really hold Pods Pending, and controllers really recreate deleted Pods.
// Each cluster has its own CA, a cluster-admin kubeconfig file and rest.Config, and acts as
// any other user through impersonation (ConfigAs). One cluster can be stopped alone and
// started again on the same etcd data, to test the loss of a cluster.
//
// Every process runs in its own process group with a parent-death signal, so none outlives
// the test binary, even one killed by `go test -timeout`.
//
// Clusters made any other way (kind, a cloud) are used instead when BERTH_TEST_KUBECONFIGS
// names their kubeconfig files; those clusters cannot be stopped (see ErrNotManaged).
//
// kubeenv does not install Berth or anything else into the clusters; the suites do.
package kubeenv
