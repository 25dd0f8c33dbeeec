// Command demo shows Berth's main job on this machine: three local
// Kubernetes clusters, the lease API, one agent per cluster, and the same
// workload applied to all three. One cluster runs it while the others wait
// behind the scheduling gate; then the running cluster is killed, and another
// takes over with a higher fencing token. It finishes by itself, cleans up
// after itself, and needs no terminal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/localfleet"
)

var workload = localfleet.Workload{Namespace: "payments", Name: "billing-exporter", Replicas: 2, TTLSeconds: 6, HeartbeatSeconds: 2}

func main() {
	bin := flag.String("bin", "bin", "folder with berth-leaseapi and berth-agent")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

var start = time.Now()

func say(format string, args ...any) {
	fmt.Printf("[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, bin string) error {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "berth-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	say("starting 3 local clusters (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes) and the lease API;")
	say("installing the berth-agent Helm chart in each and running its agent as the chart's Deployment would")
	f, err := localfleet.Start(ctx, localfleet.Options{Clusters: 3, BinDir: bin, WorkDir: dir, Workload: workload, Helm: true})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Stop(sctx); err != nil {
			say("stopping: %v", err)
		}
		say("stopped every process; removed %s", dir)
	}()
	say("fleet up; each agent serves the admission webhooks of its cluster (through the chart's Service, with certificates it made itself), which gate every managed Pod")
	say("BerthLease %s/%s (TTL %ds, heartbeat %ds) and a Deployment of %d managed Pods applied to every cluster",
		workload.Namespace, workload.Name, workload.TTLSeconds, workload.HeartbeatSeconds, workload.Replicas)

	rec := history.Start(f.Readers(), workload.Namespace, workload.Name, 100*time.Millisecond)
	table := &table{}
	for _, m := range f.Members {
		table.clusters = append(table.clusters, m.Name)
	}
	holder, err := waitForRunner(ctx, rec, table, "", time.Minute)
	if err != nil {
		return err
	}
	say("%s runs the workload; the other clusters' Pods wait behind the scheduling gate", holder)
	if err := watch(ctx, rec, table, 2*time.Duration(workload.TTLSeconds)*time.Second); err != nil {
		return err
	}

	say("killing cluster %s: its control plane and its agent die at once", holder)
	m := f.Member(holder)
	m.StopAgent()
	if err := m.Cluster.Stop(ctx); err != nil {
		return err
	}
	killed := time.Now()
	next, err := waitForRunner(ctx, rec, table, holder, time.Minute)
	if err != nil {
		return err
	}
	say("%s took over %.1fs after %s died (TTL %ds): the lease ran out, and only then did another cluster start",
		next, time.Since(killed).Seconds(), holder, workload.TTLSeconds)
	if err := watch(ctx, rec, table, 3*time.Second); err != nil {
		return err
	}

	h := rec.Stop()
	terms := h.Terms()
	for _, t := range terms {
		say("term: %s with fencing token %d", t.Cluster, t.Token)
	}
	if err := h.Check(); err != nil {
		return err
	}
	if len(terms) < 2 || terms[len(terms)-1].Token <= terms[0].Token {
		return fmt.Errorf("expected a takeover with a higher fencing token, saw %v", terms)
	}
	say("never two clusters at once; fencing token %d → %d", terms[0].Token, terms[len(terms)-1].Token)
	return nil
}

// table prints a line whenever what the clusters run changes.
type table struct {
	clusters []string
	last     string
}

func (t *table) show(h history.History) {
	if len(h) == 0 {
		return
	}
	s := h[len(h)-1]
	var parts []string
	for _, c := range t.clusters {
		n, read := s.Ungated[c]
		switch {
		case !read:
			parts = append(parts, fmt.Sprintf("%s: unreachable", c))
		case n > 0:
			state := "RUNNING"
			if s.Running[c] < n {
				state = "starting"
			}
			token := "?"
			if len(s.Tokens[c]) > 0 {
				token = fmt.Sprint(s.Tokens[c][0])
			}
			parts = append(parts, fmt.Sprintf("%s: %s %d/%d, token %s", c, state, s.Running[c], workload.Replicas, token))
		default:
			parts = append(parts, fmt.Sprintf("%s: gated", c))
		}
	}
	if line := strings.Join(parts, " | "); line != t.last {
		say("%s", line)
		t.last = line
	}
}

func waitForRunner(ctx context.Context, rec *history.Recorder, t *table, not string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		h := rec.Snapshot()
		t.show(h)
		if r := h.Runner(int(workload.Replicas)); r != "" && r != not {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return "", errors.New("no cluster ran the workload in time")
}

func watch(ctx context.Context, rec *history.Recorder, t *table, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		t.show(rec.Snapshot())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}
