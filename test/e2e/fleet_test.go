package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // the fleet logs through each test's logger
	binaries.Main(m, "berth-leaseapi", "berth-agent", "berth-fence", "berthctl")
}

// The suites' workload: short timing so that they are quick, with the
// heartbeat at a third of the TTL.
var workload = localfleet.Workload{Namespace: "payments", Name: "exporter", Replicas: 2, TTLSeconds: 6, HeartbeatSeconds: 2}

// sweepInterval is how often the recorder looks at every cluster.
const sweepInterval = 100 * time.Millisecond

// run is one fleet under test with its recorder.
type run struct {
	*localfleet.Fleet
	rec *history.Recorder
}

// startFleet runs three clusters with the lease API and an agent each, and
// records which cluster runs the workload. When the test ends it checks the
// whole history and stops everything.
func startFleet(t *testing.T) *run {
	t.Helper()
	return startFleetWith(t, localfleet.Options{})
}

// startFleetWith is startFleet with options (NoAgents, say); the binaries,
// folders and log are the suite's, and so are the three clusters and the
// workload unless opts names their number or one (with the suite's
// namespace, name and replicas).
func startFleetWith(t *testing.T, opts localfleet.Options) *run {
	t.Helper()
	if opts.Workload.Name == "" {
		opts.Workload = workload
	}
	opts.Clusters, opts.BinDir, opts.WorkDir = cmp.Or(opts.Clusters, 3), binaries.Dir, t.TempDir()
	opts.Log = testr.NewWithOptions(t, testr.Options{})
	f, err := localfleet.Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	r := &run{Fleet: f, rec: history.Start(f.Readers(), workload.Namespace, workload.Name, sweepInterval)}
	t.Cleanup(func() {
		h := r.rec.Stop()
		for _, term := range h.Terms() {
			t.Logf("term: %s token %d from %s to %s", term.Cluster, term.Token, term.First.Format("15:04:05.000"), term.Last.Format("15:04:05.000"))
		}
		if err := h.Check(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			for _, m := range f.Members {
				if m.Agent != nil {
					t.Logf("end of %s:\n%s", m.Agent.Log, m.Agent.LogTail(25))
				}
			}
			if a := f.FleetAgent(); a != nil {
				t.Logf("end of %s:\n%s", a.Log, a.LogTail(40))
			}
			t.Logf("end of %s:\n%s", f.LeaseAPI.Log, f.LeaseAPI.LogTail(10))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Stop(ctx); err != nil {
			t.Errorf("stop fleet: %v", err)
		}
	})
	return r
}

// runner waits until exactly one cluster runs every replica and returns it.
func (r *run) runner(t *testing.T, timeout time.Duration, what string, not ...string) (string, time.Duration) {
	t.Helper()
	var name string
	took := poll.For(t, timeout, what, func() bool {
		name = r.rec.Snapshot().Runner(int(workload.Replicas))
		return name != "" && !contains(not, name)
	})
	return name, took
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// loseHolder stops the holder cluster's agent and control plane at once, as the loss of
// the cluster would, and waits until another cluster runs every replica.
func (r *run) loseHolder(t *testing.T, holder string) (string, time.Duration) {
	t.Helper()
	lost := r.Member(holder)
	lost.StopAgent()
	if err := lost.Cluster.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r.runner(t, ttl+30*time.Second, "another cluster runs after the holder cluster was lost", holder)
}

// stable fails the test if the runner changes during d.
func (r *run) stable(t *testing.T, runner string, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if got := r.rec.Snapshot().Runner(int(workload.Replicas)); got != runner {
			// A sweep may catch a Pod being recreated; look again before judging.
			time.Sleep(300 * time.Millisecond)
			if got = r.rec.Snapshot().Runner(int(workload.Replicas)); got != runner {
				t.Fatalf("the workload moved from %s to %q without cause", runner, got)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tokens lists the fencing tokens of the terms so far.
func (r *run) tokens() []int32 {
	var out []int32
	for _, term := range r.rec.Snapshot().Terms() {
		out = append(out, term.Token)
	}
	return out
}

// summary is the table of measured figures the suite writes for docs/benchmarks.md.
var summary = struct {
	sync.Mutex
	rows []string
}{}

// record logs a scenario's figures and adds them to the summary; overlap is
// measured from the history (sweeps in which two clusters ran, times the
// sweep interval).
func (r *run) record(t *testing.T, scenario string, failover time.Duration) {
	h := r.rec.Snapshot()
	overlap := time.Duration(len(h.Overlaps())) * sweepInterval
	tokens := r.tokens()
	t.Logf("%s: failover %.1fs, overlap %.1fs, tokens %v", scenario, failover.Seconds(), overlap.Seconds(), tokens)
	summary.Lock()
	defer summary.Unlock()
	summary.rows = append(summary.rows, fmt.Sprintf("| %s | %.1f | %.1f | %v |", scenario, failover.Seconds(), overlap.Seconds(), tokens))
	table := "| scenario | failover s | overlap s | tokens |\n|---|---|---|---|\n" + strings.Join(summary.rows, "\n") + "\n"
	if path := os.Getenv("BERTH_E2E_SUMMARY"); path != "" {
		_ = os.WriteFile(path, []byte(table), 0o644)
	}
}

// freezeKubelets stops m's kwok, which plays its kubelets, so that its Pods
// stay Terminating: nothing confirms them gone. thaw resumes it; it runs at
// the test's end too, and only once.
func freezeKubelets(t *testing.T, m *localfleet.Member) (thaw func()) {
	t.Helper()
	if err := m.Cluster.Signal("kwok", syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := m.Cluster.Signal("kwok", syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(thaw)
	return thaw
}
