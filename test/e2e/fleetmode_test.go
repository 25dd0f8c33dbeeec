package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/localfleet"
)

// TestFleetMode runs ONE berth-agent in fleet mode for all three clusters:
// it holds the lease for exactly one of them with exactly one running; a
// cluster whose kubeconfig is removed leaves the agent without releasing
// (another cluster takes over only once the lease expires), and one whose
// kubeconfig comes back joins again.
func TestFleetMode(t *testing.T) {
	r := startFleetWith(t, localfleet.Options{NoAgents: true})
	agent, err := r.StartFleetAgent()
	if err != nil {
		t.Fatal(err)
	}
	holder, took := r.runner(t, 60*time.Second, "one cluster runs both replicas")
	t.Logf("fleet mode: %s runs the workload %s after the agent started", holder, took.Round(time.Millisecond))
	for _, m := range r.Members {
		waitFor(t, 20*time.Second, "the fleet agent's log says "+m.Name+" joined", func() bool {
			return agentLogged(agent, "cluster joined this agent", m.Name)
		})
		if m.Name == holder {
			continue
		}
		waitFor(t, 20*time.Second, m.Name+" reports the lease held by "+holder, func() bool {
			st := m.BerthLease(t.Context()).Status
			return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == holder
		})
	}
	clusters, err := r.LeaseAPI.Admin.ListClusters(t.Context())
	if err != nil || len(clusters) != 3 {
		t.Fatalf("registered clusters: %+v, %v; want 3, each registered with its own token", clusters, err)
	}
	r.stable(t, holder, ttl)
	r.record(t, "fleet mode: steady state over a TTL", 0)

	// The holder's kubeconfig is removed: the agent leaves that cluster.
	// It releases nothing (the cluster's Pods are out of its reach), so the
	// lease stays the holder's until it expires.
	if err := agent.Leave(holder); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	left := waitFor(t, 15*time.Second, "the agent leaves "+holder, func() bool {
		return agentLogged(agent, "cluster left this agent", holder)
	})
	t.Logf("the agent left %s %s after its kubeconfig was removed", holder, left.Round(time.Millisecond))
	l, err := r.LeaseAPI.Admin.GetLease(t.Context(), workload.Namespace, workload.Name)
	if err != nil || l.Holder != holder {
		t.Fatalf("lease right after %s left: %+v, %v; want it still held by %s (leaving releases nothing)", holder, l, err, holder)
	}
	// Nothing stops the left cluster's Pods any more: an operator has to.
	// Stop them here, as the runbook says, so that the history judges the
	// takeover alone.
	m := r.Member(holder)
	stopUngatedPods(t, m)
	next, _ := r.runner(t, ttl+30*time.Second, "another cluster runs after "+holder+" left the agent", holder)
	took = time.Since(removed)
	t.Logf("%s left the agent: %s runs %s after the kubeconfig was removed (TTL %s)", holder, next, took.Round(time.Millisecond), ttl)
	r.record(t, "fleet mode: holder's kubeconfig removed", took)

	// The kubeconfig comes back: the cluster joins again, registers, and
	// its BerthLease's status is written again (it was left at Held).
	if st := m.BerthLease(t.Context()).Status; st.LeaseState != reconciler.StateHeld || st.CurrentHolder != holder {
		t.Errorf("%s's status while out of the agent: %s held by %q, want it untouched (Held by itself)", holder, st.LeaseState, st.CurrentHolder)
	}
	if err := agent.Join(holder); err != nil {
		t.Fatal(err)
	}
	rejoined := waitFor(t, 30*time.Second, holder+" joins again and reports the lease held by "+next, func() bool {
		st := m.BerthLease(t.Context()).Status
		return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == next
	})
	t.Logf("%s joined again: its status reports %s's lease %s after its kubeconfig came back", holder, next, rejoined.Round(time.Millisecond))
	if n := agentLogCount(agent, "cluster joined this agent", holder); n != 2 {
		t.Errorf("the agent's log says %s joined %d times, want 2", holder, n)
	}
	r.stable(t, next, 2*time.Second)
}

// stopUngatedPods deletes the member's ungated managed Pods (their
// Deployment recreates them gated).
func stopUngatedPods(t *testing.T, m *localfleet.Member) {
	t.Helper()
	pods := &corev1.PodList{}
	if err := m.Client.List(t.Context(), pods, ctrlclient.InNamespace(workload.Namespace), ctrlclient.MatchingLabels{reconciler.ManagedLease: workload.Name}); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if len(p.Spec.SchedulingGates) > 0 {
			continue
		}
		if err := m.Client.Delete(t.Context(), p, ctrlclient.GracePeriodSeconds(0)); ctrlclient.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
}

// agentLogged reports whether the fleet agent logged msg for cluster.
func agentLogged(a *localfleet.FleetAgent, msg, cluster string) bool {
	return agentLogCount(a, msg, cluster) > 0
}

// agentLogCount counts the fleet agent's log lines with msg for cluster.
func agentLogCount(a *localfleet.FleetAgent, msg, cluster string) int {
	b, _ := os.ReadFile(a.Log)
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, msg) && strings.Contains(line, `cluster="`+cluster+`"`) {
			n++
		}
	}
	return n
}
