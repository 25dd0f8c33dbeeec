package e2e

import (
	"context"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/poll"
)

// TestAdminReleaseHandsOver: an administrator releases the holder's live
// lease, as `berthctl leases release` does (in the name of its current
// holder and token). The lease API revokes the term instead of freeing it,
// so the lease moves to another cluster only after the holder's agent has
// learnt of the revocation at its next renewal, stopped its Pods and
// released the term: the history shows no moment with two clusters running.
func TestAdminReleaseHandsOver(t *testing.T) {
	r := startFleet(t)
	holder, _ := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	m := r.Member(holder)
	ns, name := workload.Namespace, workload.Name

	// Released right after a renewal: the holder runs on for a whole
	// heartbeat before it renews again, the longest a freed lease would let
	// another cluster run beside it.
	afterRenewal(t, m)
	l, err := r.LeaseAPI.Admin.GetLease(t.Context(), ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Holder != holder {
		t.Fatalf("lease before the release: %+v, want held by %s", l, holder)
	}
	released := time.Now()
	if err := r.LeaseAPI.Admin.Release(t.Context(), ns, name, l.Holder, l.FencingToken); err != nil {
		t.Fatalf("administrator's release: %v", err)
	}
	if after, err := r.LeaseAPI.Admin.GetLease(t.Context(), ns, name); err != nil || after.Holder != holder || after.FencingToken != l.FencingToken || !after.Revoked {
		t.Errorf("lease right after the administrator's release: %+v, %v; want %s's term %d, revoked", after, err, holder, l.FencingToken)
	}

	next, took := r.runner(t, ttl+30*time.Second, "another cluster runs after the administrator's release", holder)
	h := r.rec.Snapshot()
	var stopped, started time.Time
	for _, s := range h {
		if s.At.After(released) && s.Ungated[holder] > 0 {
			stopped = s.At
		}
		if started.IsZero() && s.At.After(released) && s.Ungated[next] > 0 {
			started = s.At
		}
	}
	if !started.After(stopped) {
		t.Errorf("%s ran from %s, before %s's Pods were gone (last seen %s)", next, started.Format("15:04:05.000"), holder, stopped.Format("15:04:05.000"))
	}
	t.Logf("administrator released %s's term %d at %s: its Pods were gone %s later, %s ran %s later and both replicas ran %s later (TTL %ds, heartbeat %ds)",
		holder, l.FencingToken, released.Format("15:04:05.000"), stopped.Sub(released).Round(time.Millisecond),
		next, started.Sub(released).Round(time.Millisecond), took.Round(time.Millisecond), workload.TTLSeconds, workload.HeartbeatSeconds)
	if moved, err := r.LeaseAPI.Admin.GetLease(t.Context(), ns, name); err != nil || moved.Holder != next || moved.FencingToken <= l.FencingToken || moved.Revoked {
		t.Errorf("lease after the handover: %+v, %v; want %s's unrevoked term after %d", moved, err, next, l.FencingToken)
	}
	r.record(t, "administrator's release of the holder's lease", took)
}

// TestRevokeWhileStopping: the holder is handing its lease over (cordoned)
// but cannot confirm its Pods gone: its kubelets (kwok) are frozen, so the
// Pods stay Terminating. An administrator, impatient, revokes the term, and
// the holder's agent restarts meanwhile. The holder keeps renewing its
// revoked term while its Pods may run, so no other cluster may start,
// however long that takes; once the kubelets report the Pods gone, it
// releases and another cluster takes over.
func TestRevokeWhileStopping(t *testing.T) {
	r := startFleet(t)
	holder, _ := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	m := r.Member(holder)
	ns, name := workload.Namespace, workload.Name

	thaw := freezeKubelets(t, m)
	if _, err := r.LeaseAPI.Admin.Cordon(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 20*time.Second, holder+" is stopping", func() bool {
		return m.BerthLease(t.Context()).Status.Phase == reconciler.PhaseStopping
	})
	l, err := r.LeaseAPI.Admin.GetLease(t.Context(), ns, name)
	if err != nil || l.Holder != holder {
		t.Fatalf("lease while %s stops: %+v, %v", holder, l, err)
	}
	if err := r.LeaseAPI.Admin.Revoke(t.Context(), ns, name, l.Holder, l.FencingToken); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	// Two TTLs: without renewals of the revoked term it would have expired
	// and another cluster would run beside the Terminating Pods. Midway the
	// holder's agent restarts: the new process, which knows the term only
	// from status, must renew it while the Pods stop too.
	time.Sleep(ttl)
	m.StopAgent()
	if err := m.StartAgent(holder); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl)
	if got, err := r.LeaseAPI.Admin.GetLease(t.Context(), ns, name); err != nil || got.Holder != holder || got.FencingToken != l.FencingToken || !got.Revoked {
		t.Fatalf("lease %s after the revocation, Pods still Terminating: %+v, %v; want %s's term %d, revoked", ttl*2, got, err, holder, l.FencingToken)
	}
	if c := apimeta.FindStatusCondition(m.BerthLease(t.Context()).Status.Conditions, reconciler.ConditionAcquired); c == nil || c.Reason != reconciler.ReasonRevoked {
		t.Errorf("%s's Acquired condition: %+v, want reason %s", holder, c, reconciler.ReasonRevoked)
	}
	thaw()
	next, took := r.runner(t, 60*time.Second, "another cluster runs once the revoked holder's Pods are gone", holder)
	t.Logf("revoked %s's term %d while its Pods could not stop: it kept the term for %s until its kubelets were thawed; %s ran %s after that",
		holder, l.FencingToken, 2*ttl, next, took.Round(time.Millisecond))
	r.record(t, "revocation while the holder cannot confirm its Pods gone", 0)
	if _, err := r.LeaseAPI.Admin.Uncordon(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
}
