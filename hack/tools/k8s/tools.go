//go:build tools

// Package tools pins the Kubernetes control-plane binaries that the local test clusters run
// (see hack/build-tools.sh). It is never built; it only keeps the commands in go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
