package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/admission"
	"github.com/berthfleet/berth/fleet"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

var ttl = time.Duration(workload.TTLSeconds) * time.Second

// TestAgentsHoldOneLeaseAcrossClusters: exactly one cluster runs the
// workload and keeps it; a second agent claiming a registered cluster id is
// refused; cordoning the holder hands the workload over with no overlap.
func TestAgentsHoldOneLeaseAcrossClusters(t *testing.T) {
	r := startFleet(t)
	holder, took := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	t.Logf("%s runs the workload %s after the fleet started", holder, took.Round(time.Millisecond))
	for _, m := range r.Members {
		if m.Name == holder {
			continue
		}
		poll.For(t, 20*time.Second, m.Name+" reports the lease held by "+holder, func() bool {
			st := m.BerthLease(t.Context()).Status
			return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == holder
		})
	}
	r.stable(t, holder, 2*ttl)
	r.record(t, "steady state over two TTLs", 0)
	// Each agent ran as deploy/'s service account user, with only
	// deploy/rbac's rights, and admission stamped the Pods its
	// cluster's ReplicaSet created.
	for _, m := range r.Members {
		if !m.Agent.LogContains(admission.DefaultOperatorUser) {
			t.Errorf("%s's agent did not log serving admission as %s:\n%s", m.Name, admission.DefaultOperatorUser, m.Agent.LogTail(20))
		}
	}
	clusters, err := r.LeaseAPI.Admin.ListClusters(t.Context())
	if err != nil || len(clusters) != 3 {
		t.Fatalf("registered clusters: %+v, %v; want 3", clusters, err)
	}

	// A second cluster claiming the holder's id is refused and acts on nothing.
	var other = r.Members[0]
	if other.Name == holder {
		other = r.Members[1]
	}
	other.StopAgent()
	if err := other.StartAgent(holder); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, "the impostor's BerthLease reports the refused registration", func() bool {
		c := apimeta.FindStatusCondition(other.BerthLease(t.Context()).Status.Conditions, reconciler.ConditionAcquired)
		return c != nil && c.Reason == fleet.ReasonRegistrationRefused
	})
	if !other.Agent.LogContains("refused this cluster's registration") {
		t.Errorf("the impostor's log does not say its registration was refused")
	}
	r.stable(t, holder, time.Second)
	other.StopAgent()
	if err := other.StartAgent(other.Name); err != nil {
		t.Fatal(err)
	}

	// Cordon the holder: a planned handover with no overlap.
	if _, err := r.LeaseAPI.Admin.Cordon(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	next, handover := r.runner(t, 60*time.Second, "another cluster runs the workload after the cordon", holder)
	t.Logf("cordon of %s: %s runs the workload %s later", holder, next, handover.Round(time.Millisecond))
	r.record(t, "cordon the holder", handover)
	// The cordoned holder writes its status after it released; the next
	// holder may run before that write lands.
	poll.For(t, 20*time.Second, "the cordoned holder's Acquired condition says "+fleet.ReasonCordoned, func() bool {
		c := apimeta.FindStatusCondition(r.Member(holder).BerthLease(t.Context()).Status.Conditions, reconciler.ConditionAcquired)
		return c != nil && c.Reason == fleet.ReasonCordoned
	})
	if _, err := r.LeaseAPI.Admin.Uncordon(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
}

// TestFailover runs the failure scenarios one after the other on one fleet.
func TestFailover(t *testing.T) {
	r := startFleet(t)
	holder, _ := r.runner(t, 90*time.Second, "one cluster runs both replicas")

	// The holder's agent is killed and restarted within the TTL: no failover.
	// It is killed right after a renewal, so that the new process has the
	// rest of the term to start and renew, whatever this machine's load.
	m := r.Member(holder)
	afterRenewal(t, m)
	m.StopAgent()
	time.Sleep(time.Second)
	if err := m.StartAgent(holder); err != nil {
		t.Fatal(err)
	}
	r.stable(t, holder, 2*ttl)
	if got := r.tokens(); len(got) != 1 {
		t.Fatalf("terms after an agent restart: tokens %v, want the one term still", got)
	}
	r.record(t, "holder agent restarted within the TTL", 0)

	// The lease API is killed with SIGKILL and restarted: no failover, no
	// token reused. It is killed right after the holder renewed, so that its
	// restart fits in the holder's local validity.
	afterRenewal(t, m)
	r.LeaseAPI.Kill()
	time.Sleep(time.Second)
	if err := r.LeaseAPI.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.stable(t, holder, 2*ttl)
	if got := r.tokens(); len(got) != 1 {
		t.Fatalf("terms after a lease API restart: tokens %v, want the one term still", got)
	}
	r.record(t, "lease API kill -9 and restart", 0)

	// The holder's agent is cut off from the lease API while its cluster
	// stays up: it stops its Pods before its TTL runs out, then another
	// cluster takes over.
	m.Proxy.Cut()
	cut := time.Now()
	// The bound that matters (stopped before the lease expires at the lease
	// API) is judged by the history: no other cluster may run before. This
	// wait only needs to end.
	stopped := poll.For(t, ttl+5*time.Second, "the cut-off holder stops its Pods", func() bool {
		sweeps := r.rec.Snapshot()
		last := sweeps[len(sweeps)-1]
		return last.At.After(cut) && last.Ungated[holder] == 0
	})
	t.Logf("%s, cut off, stopped its Pods %s after the cut (TTL %s)", holder, stopped.Round(time.Millisecond), ttl)
	next, _ := r.runner(t, ttl+30*time.Second, "another cluster runs after the holder was cut off", holder)
	took := time.Since(cut)
	t.Logf("%s runs %s after %s was cut off", next, took.Round(time.Millisecond), holder)
	r.record(t, "holder cut off from the lease API", took)
	m.Proxy.Heal()
	poll.For(t, 30*time.Second, holder+" finds the lease held by "+next, func() bool {
		st := m.BerthLease(t.Context()).Status
		return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == next
	})
	holder, m = next, r.Member(next)

	// The BerthLease is deleted in the holder cluster: it stops, releases,
	// and another cluster takes over.
	bl := m.BerthLease(t.Context())
	deleted := time.Now()
	if err := m.Client.Delete(t.Context(), &bl); err != nil {
		t.Fatal(err)
	}
	next, took = r.runner(t, 60*time.Second, "another cluster runs after the BerthLease was deleted", holder)
	poll.For(t, 30*time.Second, "the deleted BerthLease is gone", func() bool {
		return m.BerthLease(t.Context()).Name == ""
	})
	t.Logf("BerthLease deleted in %s at %s: %s runs %s later", holder, deleted.Format("15:04:05.000"), next, took.Round(time.Millisecond))
	r.record(t, "BerthLease deleted in the holder", took)
	// Bring the BerthLease back so the cluster competes again.
	if err := m.ApplyWorkload(t.Context()); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, holder+" waits for the lease again", func() bool {
		return m.BerthLease(t.Context()).Status.LeaseState == reconciler.StateWaiting
	})

	// The BerthLease is deleted and made anew in a waiting cluster, as a
	// GitOps prune and sync would: its gated Pods, stamped with the old UID,
	// can never run, so the agent recycles them and admission stamps their
	// successors with the new UID.
	var waiting *localfleet.Member
	for _, c := range r.Members {
		if c.Name != holder && c.Name != next {
			waiting = c
		}
	}
	old := waiting.BerthLease(t.Context())
	if err := waiting.Client.Delete(t.Context(), &old); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, "the waiting cluster's BerthLease is gone", func() bool {
		return waiting.BerthLease(t.Context()).Name == ""
	})
	if err := waiting.ApplyWorkload(t.Context()); err != nil {
		t.Fatal(err)
	}
	recycled := poll.For(t, 30*time.Second, waiting.Name+"'s Pods come back stamped with the new BerthLease's UID", func() bool {
		bl := waiting.BerthLease(t.Context())
		pods := &corev1.PodList{}
		if bl.UID == "" || bl.UID == old.UID || waiting.Client.List(t.Context(), pods, ctrlclient.InNamespace(workload.Namespace), ctrlclient.MatchingLabels{reconciler.ManagedLease: workload.Name}) != nil {
			return false
		}
		fresh := 0
		for _, p := range pods.Items {
			if p.Labels[reconciler.ManagedUID] == string(bl.UID) && len(p.Spec.SchedulingGates) > 0 {
				fresh++
			}
		}
		return fresh == int(workload.Replicas) && len(pods.Items) == fresh
	})
	t.Logf("BerthLease made anew in %s: its Pods were recycled under the new UID in %s", waiting.Name, recycled.Round(time.Millisecond))

	// The holder cluster is lost: its control plane and its agent die.
	third, took := r.loseHolder(t, next)
	t.Logf("cluster %s lost: %s runs %s later (TTL %s)", next, third, took.Round(time.Millisecond), ttl)
	if took > ttl+15*time.Second {
		t.Errorf("takeover after a lost cluster took %s, want within the TTL plus a few seconds", took)
	}
	r.record(t, "holder cluster lost", took)

	tokens := r.tokens()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("tokens %v do not strictly increase", tokens)
		}
	}
}

// afterRenewal waits until m's agent has just renewed its lease (the lease
// API's record shows a new renew time), so that a fault injected next meets
// nearly a whole term, as the scenario's bounds assume.
func afterRenewal(t *testing.T, m *localfleet.Member) {
	t.Helper()
	last := m.Lease(t.Context())
	poll.For(t, ttl+10*time.Second, m.Name+" renews its lease", func() bool {
		l := m.Lease(t.Context())
		return l.Holder == m.Name && l.FencingToken == last.FencingToken && l.RenewedAt.After(last.RenewedAt)
	})
}
