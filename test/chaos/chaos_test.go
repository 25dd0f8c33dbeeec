package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/localfleet"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	binaries.Main(m, "berth-leaseapi", "berth-agent", "berthctl")
}

// The workload of every schedule: the end-to-end suites' short timing.
var workload = localfleet.Workload{Namespace: "payments", Name: "exporter", Replicas: 2, TTLSeconds: 6, HeartbeatSeconds: 2}

// fixedSeeds are the schedules `make test` runs: between them every kind of
// fault but BerthLease deletion (which test/e2e covers), and freezes of the
// holder's leading replica past its local validity (123, 28).
var fixedSeeds = []uint64{15, 35, 9, 123, 28}

// Environment variables that choose the schedules (make soak sets them).
const (
	// envSeed replays the schedules of a comma-separated list of seeds.
	envSeed = "BERTH_CHAOS_SEED"
	// envSeeds runs this many random seeds.
	envSeeds = "BERTH_CHAOS_SEEDS"
	// envDuration stops drawing random seeds after this long (Go duration).
	envDuration = "BERTH_CHAOS_DURATION"
	// envWorkDir keeps the fleet's folder (every process's log) there
	// instead of in a temporary folder removed at the end.
	envWorkDir = "BERTH_CHAOS_WORKDIR"
)

// seeds returns the seeds to run: a replay list, a number of random ones
// (then more is true: draw until n or the duration), or the fixed ones.
func seeds(t *testing.T) (list []uint64, random int, budget time.Duration) {
	if v := os.Getenv(envSeed); v != "" {
		for _, f := range strings.Split(v, ",") {
			seed, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", envSeed, err)
			}
			list = append(list, seed)
		}
		return list, 0, 0
	}
	if v := os.Getenv(envSeeds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envSeeds, v)
		}
		if d := os.Getenv(envDuration); d != "" {
			if budget, err = time.ParseDuration(d); err != nil {
				t.Fatalf("%s: %v", envDuration, err)
			}
		}
		return nil, n, budget
	}
	return fixedSeeds, 0, 0
}

// TestChaos runs schedules on one fleet: the fixed seeds, or those the
// environment asks for. Each schedule's overlaps (outside the documented
// limit), token regressions, non-linearizable lease API history or failure
// to converge fail the test, naming the seed.
func TestChaos(t *testing.T) {
	list, random, budget := seeds(t)
	dir := os.Getenv(envWorkDir)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Every cluster's agent runs as two replicas with leader election, as the
	// chart runs it: a freeze stops the leader.
	opts := localfleet.Options{Clusters: 3, BinDir: binaries.Dir, WorkDir: dir, Workload: workload, Log: testr.NewWithOptions(t, testr.Options{}),
		AgentArgs: []string{"--leader-elect", "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=1500ms", "--leader-elect-retry-period=250ms"}}
	started := time.Now()
	f, err := localfleet.Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Stop(ctx); err != nil {
			t.Errorf("stop fleet: %v", err)
		}
	})
	s, err := NewSuite(f, workload, binaries.Path("berthctl"), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Nemesis.StartStandbys(); err != nil {
		t.Fatal(err)
	}
	defer s.Nemesis.StopStandbys()
	// The fleet's first holder, judged like every schedule's end.
	first := s.Run(t.Context(), Schedule{})
	if first.Failed() {
		t.Fatalf("the fleet did not settle before any fault: %s", strings.Join(first.Problems(), "\n"))
	}
	t.Logf("fleet ready in %s", time.Since(started).Round(time.Millisecond))

	var tally Tally
	defer func() {
		fmt.Println(tally)
		t.Log(tally)
	}()
	soakStart := time.Now()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	for i := 0; ; i++ {
		var seed uint64
		switch {
		case list != nil && i < len(list):
			seed = list[i]
		case random > 0 && i < random && (budget == 0 || time.Since(soakStart) < budget):
			seed = rng.Uint64N(1 << 32)
		default:
			return
		}
		sched := Plan(seed, s.Timing)
		t.Logf("schedule %s", sched)
		r := s.Run(t.Context(), sched)
		tally.Add(r)
		for _, e := range r.Verdict.Episodes {
			if e.Limit != "" {
				fmt.Printf("chaos: seed %d: %s\n", seed, e)
			}
		}
		if r.Failed() {
			fmt.Printf("chaos: seed %d FAILED (replay: make soak SEED=%d):\n  %s\n  faults: %s\n", seed, seed, strings.Join(r.Problems(), "\n  "), faultList(r.Faults))
			t.Errorf("seed %d (%s): %s", seed, sched, strings.Join(r.Problems(), "\n"))
			for _, m := range f.Members {
				t.Logf("end of %s:\n%s", m.Agent.Log, m.Agent.LogTail(30))
			}
		} else {
			fmt.Printf("chaos: seed %d ok in %s (%d lease API calls checked)\n", seed, r.Took.Round(time.Millisecond), r.Lin.Ops)
		}
		if r.Broken {
			t.Fatalf("seed %d left the fleet unable to converge; stopping", seed)
		}
	}
}

func faultList(faults []Fault) string {
	parts := make([]string, len(faults))
	for i, f := range faults {
		parts[i] = f.String()
	}
	return strings.Join(parts, "; ")
}
