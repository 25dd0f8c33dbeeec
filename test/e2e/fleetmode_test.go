package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/berthfleet/berth/fleet"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// TestFleetMode runs ONE berth-agent in fleet mode for all three clusters:
// it holds the lease for exactly one of them with exactly one running; a
// cluster whose kubeconfig is removed hands its lease over before it leaves
// the agent (another cluster takes over at once, with no overlap), and one
// whose kubeconfig comes back joins again.
func TestFleetMode(t *testing.T) {
	r := startFleetWith(t, localfleet.Options{NoAgents: true})
	agent, err := r.StartFleetAgent()
	if err != nil {
		t.Fatal(err)
	}
	holder, took := r.runner(t, 60*time.Second, "one cluster runs both replicas")
	t.Logf("fleet mode: %s runs the workload %s after the agent started", holder, took.Round(time.Millisecond))
	for _, m := range r.Members {
		poll.For(t, 20*time.Second, "the fleet agent's log says "+m.Name+" joined", func() bool {
			return agentLogged(agent, "cluster joined this agent", m.Name)
		})
		if m.Name == holder {
			continue
		}
		poll.For(t, 20*time.Second, m.Name+" reports the lease held by "+holder, func() bool {
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

	// The holder's kubeconfig is removed: before the agent lets the cluster
	// go, it hands the lease over as a cordon would (stop the Pods, wait
	// until they are gone, release), so another cluster takes over at once
	// and never while the left cluster's Pods run.
	if err := agent.Leave(holder); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	// Nothing else stops the left cluster's Pods: another cluster can run
	// both replicas only once the agent has stopped them.
	next, _ := r.runner(t, ttl+30*time.Second, "another cluster runs after "+holder+" left the agent", holder)
	took = time.Since(removed)
	t.Logf("%s left the agent: %s runs %s after the kubeconfig was removed (TTL %s)", holder, next, took.Round(time.Millisecond), ttl)
	r.record(t, "fleet mode: holder's kubeconfig removed", took)
	poll.For(t, 30*time.Second, "the agent says "+holder+" handed its leases over and left", func() bool {
		return agentLogged(agent, "cluster handed its leases over", holder) && agentLogged(agent, "cluster left this agent", holder)
	})
	m := r.Member(holder)
	st := m.BerthLease(t.Context()).Status
	if st.LeaseState != reconciler.StateReleased {
		t.Errorf("%s's status after it left: %q, want %q", holder, st.LeaseState, reconciler.StateReleased)
	}
	if c := apimeta.FindStatusCondition(st.Conditions, reconciler.ConditionAcquired); c == nil || c.Reason != fleet.ReasonLeaving {
		t.Errorf("%s's Acquired condition after it left: %+v, want reason %s", holder, c, fleet.ReasonLeaving)
	}

	// The kubeconfig comes back: the cluster joins again, registers, and
	// waits for the lease the other cluster now holds.
	if err := agent.Join(holder); err != nil {
		t.Fatal(err)
	}
	rejoined := poll.For(t, 30*time.Second, holder+" joins again and reports the lease held by "+next, func() bool {
		st := m.BerthLease(t.Context()).Status
		return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == next
	})
	t.Logf("%s joined again: its status reports %s's lease %s after its kubeconfig came back", holder, next, rejoined.Round(time.Millisecond))
	if n := agentLogCount(agent, "cluster joined this agent", holder); n != 2 {
		t.Errorf("the agent's log says %s joined %d times, want 2", holder, n)
	}
	r.stable(t, next, 2*time.Second)
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
