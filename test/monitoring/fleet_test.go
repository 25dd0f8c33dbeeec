package monitoring

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
	"github.com/berthfleet/berth/test/process"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // the fleet logs through the test's logger
	// Build the binaries from the repository's root, so that they are the
	// product's: built with its go.mod and go.sum, not with this module's
	// graph, where Prometheus's requirements raise shared dependencies. From
	// there kubeenv also finds bin/k8s, as `make tools` leaves it.
	if err := os.Chdir(repoRoot); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaries.Main(m, "berth-leaseapi", "berth-agent")
}

// Bounds of the end-to-end test; its measured phases are logged.
const (
	startTimeout = 3 * time.Minute
	phaseTimeout = time.Minute
)

// TestDeployedMetricsExposed runs a fleet of real binaries, drives it until
// the metrics that appear only on events exist (a held lease with batched
// renewals, a self-fence and a takeover, a failback, watch streams,
// admitted Pods), and requires every metric the alert rules and the
// dashboard select to be exposed: the agent rules by the agents, the lease
// API rules by the lease API (with a shared store too, which adds the clock
// metrics), the dashboard by either.
func TestDeployedMetricsExposed(t *testing.T) {
	agentGroups, err := LoadRules(agentRules)
	if err != nil {
		t.Fatal(err)
	}
	leaseAPIGroups, err := LoadRules(leaseAPIRules)
	if err != nil {
		t.Fatal(err)
	}
	d, err := LoadDashboard(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dashboardExprs, err := DashboardExprs(filepath.Base(dashboardFile), d)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		exprs []Expr
		from  func(s scraped) Exposition
	}{
		{RuleExprs(filepath.Base(agentRules), agentGroups), func(s scraped) Exposition { return s.agents }},
		{RuleExprs(filepath.Base(leaseAPIRules), leaseAPIGroups), func(s scraped) Exposition { return s.leaseAPI }},
		{dashboardExprs, func(s scraped) Exposition { return s.all() }},
	}
	var all []Expr
	for _, c := range checks {
		all = append(all, c.exprs...)
	}
	names, err := MetricNames(all)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d expressions select %d metrics: %s", len(all), len(names), strings.Join(names, " "))

	began := time.Now()
	f := startFleet(t)
	t.Logf("fleet started in %s", time.Since(began).Round(time.Millisecond))
	shared := startSharedStoreLeaseAPI(t, f)
	targets := append([]string{f.LeaseAPI.MetricsURL, shared}, agentMetricsURLs(f)...)

	// A lease held, and renewed in batches by its holder.
	var holder *localfleet.Member
	took := poll.For(t, phaseTimeout, "a cluster holds the lease", func() bool {
		holder = f.Member(f.Members[0].Lease(t.Context()).Holder)
		return holder != nil
	})
	t.Logf("%s holds the lease after %s", holder.Name, took.Round(time.Millisecond))
	took = poll.For(t, phaseTimeout, holder.Name+" renews in batches", func() bool {
		return exposes(t, holder.MetricsURL, "berth_agent_renewals_total")
	})
	t.Logf("%s renewed in a batch after %s", holder.Name, took.Round(time.Millisecond))

	// Cut off from the lease API, the holder self-fences; another cluster
	// takes the lease over when the term expires.
	holder.Proxy.Cut()
	took = poll.For(t, phaseTimeout, holder.Name+" self-fences", func() bool {
		return exposes(t, holder.MetricsURL, "berth_agent_self_fence_total")
	})
	t.Logf("%s self-fenced %s after the cut", holder.Name, took.Round(time.Millisecond))
	holder.Proxy.Heal()

	// Another cluster takes the lease over once the term expires. Placement
	// then prefers the healed cluster, with failback: the new holder hands
	// the lease back once it has been healthy for the window, and counts the
	// move.
	fenced := holder
	took = poll.For(t, phaseTimeout, "another cluster takes the lease over", func() bool {
		holder = f.Member(f.Members[0].Lease(t.Context()).Holder)
		return holder != nil && holder != fenced
	})
	t.Logf("%s took the lease over %s after the heal", holder.Name, took.Round(time.Millisecond))
	prefer(t, f, fenced.Name)
	took = poll.For(t, phaseTimeout, "the lease fails back to "+fenced.Name, func() bool {
		return f.Members[0].Lease(t.Context()).Holder == fenced.Name
	})
	t.Logf("the lease failed back to %s %s after the placement changed", fenced.Name, took.Round(time.Millisecond))

	var problems []string
	took, err = poll.Until(t.Context(), phaseTimeout, "every selected metric exposed", func(ctx context.Context) (bool, error) {
		s := scrape(ctx, t, targets)
		problems = nil
		for _, c := range checks {
			problems = append(problems, berthCheck.Problems(c.exprs, c.from(s))...)
		}
		return len(problems) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v:\n%s", err, strings.Join(problems, "\n"))
	}
	t.Logf("every selected metric exposed %s after the failback; whole test %s", took.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// startFleet runs two clusters with the lease API and an agent each, all
// serving /metrics, and stops them when the test ends.
func startFleet(t *testing.T) *localfleet.Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	f, err := localfleet.Start(ctx, localfleet.Options{
		Clusters: 2,
		BinDir:   binaries.Dir,
		WorkDir:  t.TempDir(),
		Metrics:  true,
		// Placement's failback looks at the fleet each second.
		AgentArgs: []string{"--fleet-view-interval", "1s"},
		Log:       testr.NewWithOptions(t, testr.Options{}),
	})
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range f.Members {
				t.Logf("end of %s:\n%s", m.Agent.Log, m.Agent.LogTail(25))
			}
			t.Logf("end of %s:\n%s", f.LeaseAPI.Log, f.LeaseAPI.LogTail(10))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Stop(ctx); err != nil {
			t.Errorf("stop fleet: %v", err)
		}
	})
	return f
}

// prefer sets every cluster's BerthLease to prefer cluster, with the
// shortest failback window.
func prefer(t *testing.T, f *localfleet.Fleet, cluster string) {
	t.Helper()
	err := f.SetSpec(t.Context(), func(s *berthv1alpha1.BerthLeaseSpec) {
		s.Placement = &berthv1alpha1.Placement{
			Preferred: []berthv1alpha1.ClusterPreference{{Cluster: cluster}},
			Failback:  &berthv1alpha1.Failback{StabilizationSeconds: 5},
		}
	})
	if err != nil {
		t.Fatalf("set the placement: %v", err)
	}
}

// startSharedStoreLeaseAPI runs a second berth-leaseapi on the Lease objects
// of the fleet's first cluster (--store kubernetes), whose metrics include
// the clock of a shared store, and returns its /metrics URL once it serves
// them.
func startSharedStoreLeaseAPI(t *testing.T, f *localfleet.Fleet) string {
	t.Helper()
	ports, err := freeport.Ports(2)
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	p := process.StartForTest(t, "berth-leaseapi-kubernetes", binaries.Path("berth-leaseapi"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--store", "kubernetes", "--kubeconfig", f.Env.Clusters[0].KubeconfigPath)
	took := poll.For(t, phaseTimeout, "berth-leaseapi on the kubernetes store serves its clock metrics", func() bool {
		if p.Exited() {
			t.Fatalf("berth-leaseapi on the kubernetes store exited: %v\n%s", p.ExitError(), p.LogTail(20))
		}
		return exposes(t, metricsURL, "berth_leaseapi_clock_uncertainty_seconds")
	})
	t.Logf("berth-leaseapi on the kubernetes store ready after %s", took.Round(time.Millisecond))
	return metricsURL
}

func agentMetricsURLs(f *localfleet.Fleet) []string {
	var urls []string
	for _, m := range f.Members {
		urls = append(urls, m.MetricsURL)
	}
	return urls
}

// exposes reports whether the /metrics at url has a family called name.
func exposes(t *testing.T, url, name string) bool {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	families, err := Scrape(ctx, url)
	if err != nil {
		t.Logf("%v", err)
		return false
	}
	_, ok := families[name]
	return ok
}

// scraped is what every binary of the fleet exposes, by kind.
type scraped struct {
	agents, leaseAPI Exposition
}

func (s scraped) all() Exposition {
	e := Exposition{}
	for _, part := range []Exposition{s.agents, s.leaseAPI} {
		for name, f := range part {
			e[name] = f
		}
	}
	return e
}

// scrape reads every target: the lease APIs' /metrics are the first two,
// the agents' the rest. A target that cannot be read is logged and skipped:
// its metrics are then missing, which the check reports.
func scrape(ctx context.Context, t *testing.T, targets []string) scraped {
	s := scraped{agents: Exposition{}, leaseAPI: Exposition{}}
	for i, url := range targets {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		families, err := Scrape(sctx, url)
		cancel()
		if err != nil {
			t.Logf("%v", err)
			continue
		}
		if i < 2 {
			s.leaseAPI.Add(families)
		} else {
			s.agents.Add(families)
		}
	}
	return s
}
