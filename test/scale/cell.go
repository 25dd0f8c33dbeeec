package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/berthfleet/berth/test/localfleet"
)

// cell is one run of the matrix: a fleet, its observers and its output.
type cell struct {
	cfg    config
	n      int
	fleet  *localfleet.Fleet
	leases *leaseLister
	status *statusTracker
	start  time.Time
	keys   []string
}

// say prints a line stamped with the time since the cell started.
func (c *cell) say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(c.start).Seconds(), fmt.Sprintf(format, args...))
}

// runCell measures one cell. A phase that does not finish is reported in the
// result; an error means the harness failed.
func runCell(ctx context.Context, cfg config, clusters, n int) (r *result, err error) {
	r = &result{Clusters: clusters, N: n, TTL: cfg.ttl, Heartbeat: cfg.heartbeat, AgentArgs: cfg.agentArgs,
		Nproc: runtime.NumCPU(), LoadAvg: loadAvg(), Date: time.Now().UTC().Format(time.RFC3339)}
	c := &cell{cfg: cfg, n: n, start: time.Now(), keys: leaseKeys(cfg.namespaces, n)}
	defer func() { r.Wall = time.Since(c.start) }()
	c.say("cell clusters=%d n=%d: %d cores, load average %s; TTL %s, heartbeat %s, agent args %q",
		clusters, n, r.Nproc, r.LoadAvg, cfg.ttl, cfg.heartbeat, cfg.agentArgs)

	dir, err := os.MkdirTemp("", fmt.Sprintf("berth-scale-%dx%d-", clusters, n))
	if err != nil {
		return r, err
	}
	if cfg.keep {
		c.say("keeping the cell's folder (every process's log): %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	c.fleet, err = localfleet.Start(ctx, localfleet.Options{
		Clusters: clusters, BinDir: cfg.bin, WorkDir: dir,
		Workload:   localfleet.Workload{ClusterHeartbeat: cfg.clusterHeartbeat},
		NoWorkload: true, DeferAgents: true, Metrics: true, AgentArgs: cfg.agentArgs,
	})
	if err != nil {
		return r, fmt.Errorf("start the fleet: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = errors.Join(err, c.fleet.Stop(sctx))
	}()
	c.say("fleet up: %d clusters, the lease API; no agent yet", clusters)

	took, err := createAll(ctx, c.fleet, cfg, n)
	if err != nil {
		return r, err
	}
	r.Create = took
	c.say("created %d BerthLeases in each cluster (%d in all) in %.1fs", n, n*clusters, took.Seconds())

	if c.leases, err = newLeaseLister(c.fleet.LeaseAPI); err != nil {
		return r, err
	}
	if c.status, err = startStatusTracker(ctx, c.fleet); err != nil {
		return r, err
	}
	return r, c.phases(ctx, r)
}

// phases runs the measured phases in order; those after a phase that did
// not finish are skipped.
func (c *cell) phases(ctx context.Context, r *result) error {
	var err error
	if r.Converge, err = c.converge(ctx); err != nil {
		return err
	}
	if !r.Converge.StatusesRight.Done {
		r.Skipped = "convergence did not finish"
		c.say("skipping the later phases: %s", r.Skipped)
		return nil
	}
	if r.Steady, err = c.steadyState(ctx); err != nil {
		return err
	}
	if r.Kill, err = c.killHolder(ctx); err != nil {
		return err
	}
	if !r.Kill.Done {
		r.Skipped = "the leases of the killed agent did not all move"
		c.say("skipping the later phases: %s", r.Skipped)
		return nil
	}
	if r.Restart, err = c.restartAgent(ctx, r.Kill.Cluster); err != nil {
		return err
	}
	if !r.Restart.Done {
		r.Skipped = "the restarted agent did not settle"
		c.say("skipping the cordon: %s", r.Skipped)
		return nil
	}
	r.Cordon, err = c.cordonHolder(ctx)
	return err
}

// pids names every process whose CPU and memory the cell samples.
func (c *cell) pids() map[string]int {
	out := map[string]int{leaseAPIProcess: c.fleet.LeaseAPI.Pid()}
	for _, m := range c.fleet.Members {
		if m.Agent != nil {
			out[agentProcess(m.Name)] = m.Agent.Pid()
		}
	}
	return out
}

const leaseAPIProcess = "berth-leaseapi"

func agentProcess(cluster string) string { return "berth-agent " + cluster }

// leaseKeys are the lease keys of the benchmark's BerthLeases: n of them
// spread round-robin over the namespaces, named after their number.
func leaseKeys(namespaces, n int) []string {
	keys := make([]string, n)
	for i := range n {
		keys[i] = namespaceOf(i, namespaces) + "/" + leaseName(i)
	}
	return keys
}

func namespaceOf(i, namespaces int) string { return fmt.Sprintf("scale-%02d", i%namespaces) }

func leaseName(i int) string { return fmt.Sprintf("lease-%05d", i) }

// loadAvg is the machine's load average (1, 5, 15 minutes).
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
