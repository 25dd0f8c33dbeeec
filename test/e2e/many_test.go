package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// bulkLeases is how many BerthLeases without Pods TestManyBerthLeases
// applies to every cluster, beside the suite's workload.
const bulkLeases = 40

// TestManyBerthLeases: with many BerthLeases per cluster, what a cluster
// sends does not grow with renewals. Once every lease is held somewhere, a
// holder renews all its leases in one request per heartbeat, a waiting
// cluster sends nothing at all (the change stream tells it of changes), and
// no BerthLease's status is written while nothing changes. When a holder's
// agent dies, its leases move together, as soon as their terms end.
func TestManyBerthLeases(t *testing.T) {
	r := startFleet(t)
	r.runner(t, 90*time.Second, "one cluster runs the workload")
	names := make([]string, bulkLeases)
	for i := range names {
		names[i] = fmt.Sprintf("bulk-%02d", i)
	}
	var wg sync.WaitGroup
	for _, m := range r.Members {
		for _, name := range names {
			wg.Go(func() {
				bl := builders.BerthLease(workload.Namespace, name).TTL(workload.TTLSeconds).Heartbeat(workload.HeartbeatSeconds).Obj()
				if err := m.Client.Create(t.Context(), bl); err != nil {
					t.Errorf("%s: create BerthLease %s: %v", m.Name, name, err)
				}
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	holders := map[string]string{}
	poll.For(t, 2*time.Minute, "every lease held somewhere, and every other cluster waiting", func() bool {
		held, err := leaseHolders(t.Context(), r.LeaseAPI.Admin, workload.Namespace)
		if err != nil {
			return false
		}
		for _, name := range names {
			if held[name] == "" {
				return false
			}
		}
		for _, m := range r.Members {
			for _, bl := range bulkStatuses(t, m) {
				want := reconciler.StateWaiting
				if held[bl.Name] == m.Name {
					want = reconciler.StateHeld
				}
				if bl.Status.LeaseState != want {
					return false
				}
			}
		}
		holders = held
		return true
	})

	// A quiet window of three heartbeats.
	heartbeat := time.Duration(workload.HeartbeatSeconds) * time.Second
	versions := func() map[string]string {
		out := map[string]string{}
		for _, m := range r.Members {
			for _, bl := range bulkStatuses(t, m) {
				out[m.Name+"/"+bl.Name] = bl.ResourceVersion
			}
		}
		return out
	}
	before := versions()
	from := time.Now()
	time.Sleep(3 * heartbeat)
	to := time.Now()
	after := versions()
	for key, v := range before {
		if after[key] != v {
			t.Errorf("BerthLease %s was written while nothing changed (resourceVersion %s, then %s)", key, v, after[key])
		}
	}
	calls, err := requestsBetween(r.LeaseAPI.Log, from, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lease API requests in %v, by subject and route: %v", to.Sub(from).Round(time.Millisecond), calls)
	clusters := map[string]bool{}
	for _, c := range holders {
		clusters[c] = true
	}
	for _, m := range r.Members {
		batches := calls[m.Name+" POST /v1alpha1/renewals"]
		if clusters[m.Name] && (batches == 0 || batches > 2*4) {
			t.Errorf("%s holds leases and sent %d batched renewals in three heartbeats, want one or two a heartbeat", m.Name, batches)
		}
		for _, route := range []string{"POST /v1alpha1/namespaces/{namespace}/leases/{name}/renew", "POST /v1alpha1/namespaces/{namespace}/leases/{name}/acquire", "GET /v1alpha1/namespaces/{namespace}/leases/{name}"} {
			// The suite's workload is one lease among the bulk: its term
			// may be renewed on its own while its Pods start.
			if n := calls[m.Name+" "+route]; n > 3 {
				t.Errorf("%s sent %d requests %s in three heartbeats, want none: renewals go in batches and waiting clusters follow the change stream", m.Name, n, route)
			}
		}
	}

	// The cluster that holds the most leases loses its agent: every lease it
	// held moves once its term ends, all within a few seconds of each other.
	counts := map[string]int{}
	for _, c := range holders {
		counts[c]++
	}
	victim := ""
	for c, n := range counts {
		if victim == "" || n > counts[victim] {
			victim = c
		}
	}
	var moving []string
	for name, c := range holders {
		if c == victim {
			moving = append(moving, name)
		}
	}
	killed := time.Now()
	r.Member(victim).StopAgent()
	moved := map[string]time.Duration{}
	ttl := time.Duration(workload.TTLSeconds) * time.Second
	poll.For(t, 3*ttl, fmt.Sprintf("the %d leases %s held move", len(moving), victim), func() bool {
		held, err := leaseHolders(t.Context(), r.LeaseAPI.Admin, workload.Namespace)
		if err != nil {
			return false
		}
		for _, name := range moving {
			if _, ok := moved[name]; !ok && held[name] != "" && held[name] != victim {
				moved[name] = time.Since(killed)
			}
		}
		return len(moved) == len(moving)
	})
	first, last := time.Hour, time.Duration(0)
	for _, d := range moved {
		first, last = min(first, d), max(last, d)
	}
	t.Logf("%d leases moved after the holder's agent died: the first after %v, the last after %v", len(moved), first.Round(time.Millisecond), last.Round(time.Millisecond))
	if last > ttl+3*time.Second {
		t.Errorf("the last lease moved %v after the holder's agent died, want within the TTL (%v) and 3 s", last, ttl)
	}
	if last-first > 3*time.Second {
		t.Errorf("the leases moved over %v, want within 3 s of each other", last-first)
	}
	if err := r.Member(victim).StartAgent(victim); err != nil {
		t.Fatal(err)
	}
}

// leaseHolders maps each lease of namespace to its holder ("" when free).
func leaseHolders(ctx context.Context, admin *leaseclient.Client, namespace string) (map[string]string, error) {
	out := map[string]string{}
	opts := leaseclient.ListOptions{Namespace: namespace, Limit: 1000}
	for {
		page, err := admin.ListLeases(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, l := range page.Items {
			out[l.Name] = l.Holder
		}
		if page.Continue == "" {
			return out, nil
		}
		opts.Continue = page.Continue
	}
}

// bulkStatuses lists m's bulk BerthLeases.
func bulkStatuses(t *testing.T, m *localfleet.Member) []berthv1alpha1.BerthLease {
	list := &berthv1alpha1.BerthLeaseList{}
	if err := m.Client.List(t.Context(), list, ctrlclient.InNamespace(workload.Namespace)); err != nil {
		t.Logf("%s: list BerthLeases: %v", m.Name, err)
		return nil
	}
	var out []berthv1alpha1.BerthLease
	for _, bl := range list.Items {
		if bl.Name != workload.Name {
			out = append(out, bl)
		}
	}
	return out
}

// requestsBetween counts the lease API's answered requests between from
// and to, from its access log, by "subject METHOD route".
func requestsBetween(log string, from, to time.Time) (map[string]int, error) {
	f, err := os.Open(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Time                        time.Time
			Msg, Method, Route, Subject string
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "request" || line.Time.Before(from) || line.Time.After(to) {
			continue
		}
		out[line.Subject+" "+line.Method+" "+line.Route]++
	}
	return out, sc.Err()
}
