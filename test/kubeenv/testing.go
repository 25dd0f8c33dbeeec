package kubeenv

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/berthfleet/berth/test/process"
)

// Bounds for StartForTest. Three clusters are ready in well under a minute on two cores;
// the rest is room for a loaded machine.
const (
	testStartTimeout = 3 * time.Minute
	testStopTimeout  = 30 * time.Second
	failureLogLines  = 8
)

// StartForTest starts clusters for a test (see Start) and stops them when the test and
// its subtests end. It fails the test, never skips it, when the clusters cannot start; a
// missing binary says to run `make tools`. By default the clusters live in t.TempDir() and
// log to t; when the test fails, the end of every process log is logged as well.
func StartForTest(t testing.TB, opts Options) *Env {
	t.Helper()
	if opts.WorkDir == "" {
		opts.WorkDir = t.TempDir()
	}
	if opts.Log.GetSink() == nil {
		opts.Log = testr.NewWithInterface(t, testr.Options{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), testStartTimeout)
	defer cancel()
	env, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("start clusters: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			env.logTails(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), testStopTimeout)
		defer cancel()
		if err := env.Stop(ctx); err != nil {
			t.Errorf("stop clusters: %v", err)
		}
	})
	return env
}

// RequireManaged skips the test, saying why, when kubeenv did not start c: the only thing
// a test cannot do with a cluster from BERTH_TEST_KUBECONFIGS is stop and start it.
func RequireManaged(t testing.TB, c *Cluster) {
	t.Helper()
	if !c.Managed() {
		t.Skipf("%s: %v (from %s)", c.Name, ErrNotManaged, ExternalKubeconfigsEnv)
	}
}

// logTails logs the end of every process log of the clusters that kubeenv runs.
func (e *Env) logTails(t testing.TB) {
	for _, c := range e.Clusters {
		if !c.Managed() {
			continue
		}
		for _, comp := range processes {
			path := c.plane.layout.log(comp)
			t.Logf("%s: end of %s:\n%s", c.Name, path, process.LogTail(path, failureLogLines))
		}
	}
}
