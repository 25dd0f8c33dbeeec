package kubeenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/go-logr/logr"
)

// Options says which clusters Start runs.
type Options struct {
	// Clusters is how many clusters to run, named cluster-1, cluster-2, ...; default 1.
	Clusters int
	// Nodes is how many kwok nodes each cluster has; default 2.
	Nodes int
	// WorkDir holds each cluster's kubeconfig (<WorkDir>/<name>.kubeconfig) and, in
	// <WorkDir>/<name>/, its certificates, etcd data and process logs (logs/*.log).
	WorkDir string
	// BinDir holds the binaries that `make tools` builds; default BinDir().
	BinDir string
	// Log receives progress: V(0) clusters ready and stopped, V(1) each process.
	Log logr.Logger
}

const (
	defaultClusters = 1
	defaultNodes    = 2
)

func (o Options) withDefaults() Options {
	if o.Clusters == 0 {
		o.Clusters = defaultClusters
	}
	if o.Nodes == 0 {
		o.Nodes = defaultNodes
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return o
}

// processes are the binaries each cluster runs, named as its log files are.
var processes = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

// kwokStagesFile holds kwok's node and pod stages, written by hack/build-tools.sh.
const kwokStagesFile = "kwok-stages.yaml"

// BinDir returns the directory with the control-plane binaries: $KUBEBUILDER_ASSETS when
// set (the Makefile sets it), else bin/k8s in the enclosing module, where `make tools` puts
// them. envtest takes the same directory:
//
//	dir, err := kubeenv.BinDir()
//	env := &envtest.Environment{BinaryAssetsDirectory: dir}
func BinDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find bin/k8s: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "bin", "k8s"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find bin/k8s: no go.mod above %s", wd)
		}
	}
}

// checkBinaries fails, saying how to build them, when a binary is missing from dir.
func checkBinaries(dir string) error {
	var errs []error
	for _, name := range slices.Concat(processes, []string{kwokStagesFile}) {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("control-plane binaries missing, run `make tools`: %w", err)
	}
	return nil
}
