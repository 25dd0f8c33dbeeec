// Command scale measures how Berth's agent copes with thousands of
// BerthLeases per cluster (issue 13; `make bench-scale`, figures in
// docs/benchmarks.md). For each cell of a matrix of cluster counts and
// BerthLease counts it starts a local fleet (test/localfleet) whose clusters
// run no workload Pods, creates the same N BerthLeases in every cluster before
// any agent runs, starts the agents and measures:
//
//  1. convergence: time from the agents' start until every lease is held at
//     the lease API, and until every cluster's BerthLease status agrees
//     (the holder's `held`, every other cluster's `waiting`);
//  2. steady state over a window: lease API requests/s by route, CPU and RSS;
//     each agent's CPU, RSS and kube-apiserver requests/s (its client-go
//     metrics); missed renewals (self-fences, lost renewals);
//  3. the holder's agent killed (SIGKILL): time until each lease it held is
//     held elsewhere, the first and the last;
//  4. the killed agent restarted, then the holder cordoned: time until each
//     of its leases is held elsewhere.
//
// A phase that does not finish within its timeout is reported as not done
// with how far it got, and the phases after an unconverged start are skipped.
// It prints progress lines and a final markdown table; it exits non-zero only
// when the harness itself fails. It judges nothing: the figures are for
// docs/benchmarks.md, side by side with the targets.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// config is the command line.
type config struct {
	clusters         []int
	leases           []int
	ttl, heartbeat   time.Duration
	clusterHeartbeat time.Duration
	window           time.Duration
	phaseTimeout     time.Duration
	namespaces       int
	creators         int
	agentArgs        []string
	bin              string
	jsonOut          string
	keep             bool
}

func main() {
	var c config
	var clusters, leases, agentArgs string
	flag.StringVar(&clusters, "clusters", "2,3", "cluster counts to run, comma-separated (each 2 or more)")
	flag.StringVar(&leases, "n", "1000,10000", "BerthLease counts per cluster to run, comma-separated")
	flag.DurationVar(&c.ttl, "ttl", 30*time.Second, "spec.ttlSeconds of every BerthLease")
	flag.DurationVar(&c.heartbeat, "heartbeat", 10*time.Second, "spec.heartbeatIntervalSeconds of every BerthLease")
	flag.DurationVar(&c.clusterHeartbeat, "cluster-heartbeat", 10*time.Second, "the agents' --cluster-heartbeat-interval (the agent's default; it bounds how soon a cordon is seen)")
	flag.DurationVar(&c.window, "window", 60*time.Second, "steady-state window")
	flag.DurationVar(&c.phaseTimeout, "phase-timeout", 5*time.Minute, "how long a phase may take before it is reported as not done")
	flag.IntVar(&c.namespaces, "namespaces", 10, "namespaces the BerthLeases are spread over")
	flag.IntVar(&c.creators, "creators", 32, "goroutines creating BerthLeases, per cluster")
	flag.StringVar(&agentArgs, "agent-args", "", "extra arguments for every berth-agent, space-separated (e.g. \"--kube-api-qps=200 --kube-api-burst=400\")")
	flag.StringVar(&c.bin, "bin", "bin", "folder with berth-leaseapi and berth-agent")
	flag.StringVar(&c.jsonOut, "json", "", "also write every cell's figures as JSON to this file")
	flag.BoolVar(&c.keep, "keep", false, "keep each cell's folder (every process's log) instead of removing it")
	flag.Parse()
	err := c.parseLists(clusters, leases)
	if err == nil {
		c.bin, err = filepath.Abs(c.bin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(2)
	}
	c.agentArgs = strings.Fields(agentArgs)
	ctrllog.SetLogger(logr.Discard()) // the observers' informers log nothing worth reading here

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := run(ctx, c)
	fmt.Println()
	fmt.Print(table(c, results))
	if c.jsonOut != "" {
		if werr := writeJSON(c.jsonOut, results); werr != nil {
			fmt.Fprintln(os.Stderr, "bench-scale:", werr)
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale failed:", err)
		os.Exit(1)
	}
}

func (c *config) parseLists(clusters, leases string) error {
	var err error
	if c.clusters, err = ints("clusters", clusters, 2); err != nil {
		return err
	}
	if c.leases, err = ints("n", leases, 1); err != nil {
		return err
	}
	switch {
	case c.ttl < time.Second || c.heartbeat < time.Second:
		return fmt.Errorf("--ttl and --heartbeat: at least 1s")
	case c.namespaces < 1 || c.creators < 1:
		return fmt.Errorf("--namespaces and --creators: at least 1")
	}
	return nil
}

// ints parses a comma-separated list of integers of at least min.
func ints(name, s string, minimum int) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < minimum {
			return nil, fmt.Errorf("--%s: %q is not an integer of at least %d", name, f, minimum)
		}
		out = append(out, n)
	}
	return out, nil
}

// run measures every cell of the matrix, one after the other, and returns
// the results of the cells it finished.
func run(ctx context.Context, c config) ([]*result, error) {
	var results []*result
	for _, clusters := range c.clusters {
		for _, n := range c.leases {
			r, err := runCell(ctx, c, clusters, n)
			if r != nil {
				results = append(results, r)
			}
			if err != nil {
				return results, fmt.Errorf("clusters=%d n=%d: %w", clusters, n, err)
			}
		}
	}
	return results, nil
}

func writeJSON(path string, results []*result) error {
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
