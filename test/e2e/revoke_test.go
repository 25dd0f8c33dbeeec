package e2e

import (
	"testing"
	"time"
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
