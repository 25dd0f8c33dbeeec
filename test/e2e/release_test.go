package e2e

import (
	"testing"
	"time"

	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// TestReleaseOfUnknownOutcome: the holder, cordoned, stops its Pods and
// releases its term, but the network holds the release back (as a proxy or
// load balancer that delivers a request after its client gave up): the agent
// does not know whether it landed. The cordon is lifted and the agent
// restarts at once, within the term's validity. The new process must not
// recover that term and run under it, since the release may still land and
// free it under its Pods: status recorded the release before it was sent
// (ReleasingToken), so the new process releases again instead and competes
// afresh. The held release is then delivered. The history (judged when the
// test ends) shows no moment with two clusters running.
func TestReleaseOfUnknownOutcome(t *testing.T) {
	// A TTL long enough that the restarted agent is back well within the
	// term's validity, when recovering it is what an agent does.
	w := workload
	w.TTLSeconds, w.HeartbeatSeconds = 15, 5
	r := startFleetWith(t, localfleet.Options{Workload: w})
	holder, _ := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	m := r.Member(holder)
	ctx := t.Context()

	afterRenewal(t, m)
	m.Proxy.HoldReleases(true)
	if _, err := r.LeaseAPI.Admin.Cordon(ctx, holder); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, holder+"'s release is sent and held back", func() bool { return m.Proxy.Held() > 0 })
	if l, err := r.LeaseAPI.Admin.GetLease(ctx, workload.Namespace, workload.Name); err != nil || l.Holder != holder {
		t.Fatalf("lease while %s's release is held back: %+v, %v; want still %s's", holder, l, err, holder)
	}
	if st := m.BerthLease(ctx).Status; st.ReleasingToken == 0 {
		t.Errorf("status while the release is in flight: releasingToken 0, want the token released (status %+v)", st)
	}
	if _, err := r.LeaseAPI.Admin.Uncordon(ctx, holder); err != nil {
		t.Fatal(err)
	}
	m.Proxy.HoldReleases(false) // later requests pass; the one held stays held
	m.StopAgent()
	if err := m.StartAgent(holder); err != nil {
		t.Fatal(err)
	}
	// Whoever runs now runs under a term the held release cannot free.
	r.runner(t, 60*time.Second, "some cluster runs both replicas after the restart")
	delivered := time.Now()
	m.Proxy.DeliverHeld()
	time.Sleep(time.Duration(w.TTLSeconds) * time.Second) // the holder renews at least three times meanwhile
	runner, _ := r.runner(t, 60*time.Second, "some cluster runs both replicas after the late release landed")
	t.Logf("the held release of %s landed %s ago; %s runs, tokens %v", holder, time.Since(delivered).Round(time.Millisecond), runner, r.tokens())
	r.record(t, "release of unknown outcome, agent restarted", 0)
}
