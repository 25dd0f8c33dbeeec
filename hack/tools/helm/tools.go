//go:build tools

// Package tools pins the helm command that `make generate` renders the plain
// manifests with and `make test` lints, renders and installs the charts with.
// A module of its own, so that Helm's dependencies never enter the product's
// graph or the other tools'.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
