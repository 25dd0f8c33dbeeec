// Package charts runs the helm command that `make tools` builds (bin/tools/helm, pinned in
// hack/tools/helm) on Berth's charts in deploy/charts: the local fleet installs the agent
// with it, and this package's tests lint, render and install both charts.
package charts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The charts and their default release names.
const (
	Agent    = "berth-agent"
	LeaseAPI = "berth-leaseapi"
)

// RepoDir is this module's root, wherever the caller runs from.
func RepoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Dir is a chart's folder.
func Dir(chart string) string { return filepath.Join(RepoDir(), "deploy", "charts", chart) }

// HelmBinary is bin/tools/helm, or an error saying how to build it.
func HelmBinary() (string, error) {
	path := filepath.Join(RepoDir(), "bin", "tools", "helm")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is missing: run make tools", path)
	}
	return path, nil
}

// Helm runs helm with args and returns its standard output; an error carries its
// standard error.
func Helm(ctx context.Context, args ...string) ([]byte, error) {
	helm, err := HelmBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	// Keep helm's caches and configuration out of the user's home.
	tmp, err := os.MkdirTemp("", "berth-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp+"/cache", "HELM_CONFIG_HOME="+tmp+"/config", "HELM_DATA_HOME="+tmp+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Values are --set arguments, key=value each.
type Values []string

func (v Values) args() []string {
	var args []string
	for _, kv := range v {
		args = append(args, "--set", kv)
	}
	return args
}

// Install runs `helm upgrade --install` of chart as release in namespace, waiting for
// nothing (the fleet runs the Pods' processes itself).
func Install(ctx context.Context, kubeconfig, release, chart, namespace string, values Values) error {
	args := append([]string{"upgrade", "--install", release, Dir(chart), "--kubeconfig", kubeconfig, "--namespace", namespace}, values.args()...)
	_, err := Helm(ctx, args...)
	return err
}

// Template renders chart as release in namespace, CRDs included, and returns its objects.
func Template(ctx context.Context, release, chart, namespace string, values Values) ([]*unstructured.Unstructured, error) {
	args := append([]string{"template", release, Dir(chart), "--namespace", namespace, "--include-crds"}, values.args()...)
	out, err := Helm(ctx, args...)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// Decode reads a stream of YAML documents; empty documents are skipped.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}
