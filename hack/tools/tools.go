//go:build tools

// Package tools pins the code generators and linters Berth's Makefile installs from this
// module (`cd hack/tools && go install <command>`). It is never built; it only keeps the
// commands in go.mod. The control-plane binaries for the test clusters have their own
// modules beside it (k8s/, etcd/, kwok/) so that their dependency graphs cannot collide.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
