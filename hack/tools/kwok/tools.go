//go:build tools

// Package tools pins kwok, which simulates the nodes of the local test clusters (see
// hack/build-tools.sh). It is never built; it only keeps the command in go.mod.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
