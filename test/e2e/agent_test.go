package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/fleet"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/kubeenv"
)

// TestAgentsHoldOneLeaseAcrossClusters runs one berth-agent per cluster in
// single-cluster mode: exactly one cluster runs the workload, a second agent
// claiming a registered cluster id is refused, and cordoning the holder
// hands the workload over with no moment where two clusters run it.
func TestAgentsHoldOneLeaseAcrossClusters(t *testing.T) {
	dir := t.TempDir()
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 3, WorkDir: filepath.Join(dir, "clusters")})
	var ids []string
	for _, c := range env.Clusters {
		ids = append(ids, c.Name)
	}
	api := startLeaseAPI(t, dir, ids)
	members := map[string]*member{}
	readers := map[string]ctrlclient.Reader{}
	for _, c := range env.Clusters {
		m := newMember(t, c, dir)
		members[c.Name] = m
		readers[c.Name] = m.client
	}
	rec := history.Start(readers, workloadNS, workload, 100*time.Millisecond)
	defer func() {
		h := rec.Stop()
		for _, term := range h.Terms() {
			t.Logf("term: %s token %d from %s to %s", term.Cluster, term.Token, term.First.Format("15:04:05.000"), term.Last.Format("15:04:05.000"))
		}
		if err := h.Check(); err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	for _, m := range members {
		m.startAgent(t, api, m.name)
	}

	// Exactly one cluster runs the workload, and keeps it over several TTLs.
	var holder string
	took := waitFor(t, 90*time.Second, "one cluster runs both replicas", func() bool {
		holder = rec.Snapshot().Runner(replicas)
		return holder != ""
	})
	t.Logf("%s runs the workload %s after the agents started", holder, took.Round(time.Millisecond))
	for name, m := range members {
		if name == holder {
			continue
		}
		waitFor(t, 20*time.Second, name+" reports the lease held by "+holder, func() bool {
			st := m.berthLease(t).Status
			return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == holder
		})
	}
	time.Sleep(2 * ttlSeconds * time.Second)
	if got := rec.Snapshot().Runner(replicas); got != holder {
		t.Fatalf("after two TTLs the runner is %q, want %s still", got, holder)
	}
	clusters, err := api.admin.ListClusters(t.Context())
	if err != nil || len(clusters) != 3 {
		t.Fatalf("registered clusters: %+v, %v; want 3", clusters, err)
	}

	// A second cluster claiming the holder's id is refused and acts on nothing.
	var other *member
	for name, m := range members {
		if name != holder {
			other = m
			break
		}
	}
	other.agent.kill()
	other.startAgent(t, api, holder)
	waitFor(t, 30*time.Second, "the impostor's BerthLease reports the refused registration", func() bool {
		c := apimeta.FindStatusCondition(other.berthLease(t).Status.Conditions, reconciler.ConditionAcquired)
		return c != nil && c.Reason == fleet.ReasonRegistrationRefused
	})
	if !other.agent.logContains("refused this cluster's registration") {
		t.Errorf("the impostor's log does not say its registration was refused")
	}
	if got := rec.Snapshot().Runner(replicas); got != holder {
		t.Fatalf("with an impostor about, the runner is %q, want %s", got, holder)
	}
	other.agent.kill()
	other.startAgent(t, api, other.name)

	// Cordon the holder: a planned handover with no overlap.
	if _, err := api.admin.Cordon(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	var next string
	handover := waitFor(t, 60*time.Second, "another cluster runs the workload after the cordon", func() bool {
		next = rec.Snapshot().Runner(replicas)
		return next != "" && next != holder
	})
	t.Logf("cordon of %s: %s runs the workload %s later (TTL %ds)", holder, next, handover.Round(time.Millisecond), ttlSeconds)
	c := apimeta.FindStatusCondition(members[holder].berthLease(t).Status.Conditions, reconciler.ConditionAcquired)
	if c == nil || c.Reason != fleet.ReasonCordoned {
		t.Errorf("cordoned holder's Acquired condition: %+v, want reason %s", c, fleet.ReasonCordoned)
	}
	if _, err := api.admin.Uncordon(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	t.Logf("suite ran %s", time.Since(start).Round(time.Second))

}
