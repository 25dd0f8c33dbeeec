package kubernetes_test

import (
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/kubernetes"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
	"github.com/berthfleet/berth/leaseapi/store/storetest"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/poll"
)

// TestReplicaClocks: two replicas on one API server, one with its clock 20 s
// ahead, agree on when a term ends: both judge by the API server's clock.
func TestReplicaClocks(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 1, Nodes: 1})
	cfg := env.Clusters[0].RESTConfig()
	storetest.RunReplicaClocks(t, func(t *testing.T, local clock.Clock) store.Store {
		s, err := kubernetes.OpenWith(t.Context(), cfg, "berth-clocks", kubernetes.Options{Clock: refclock.Options{Clock: local}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestClockNarrows: the API server's clock, seen to the whole second,
// is known to well under a second after some samples, and always holds
// this machine's clock (the API server runs here, on the same clock).
func TestClockNarrows(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 1, Nodes: 1})
	s, err := kubernetes.Open(t.Context(), env.Clusters[0].RESTConfig(), "berth-clock")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	check := func() store.Reading {
		t.Helper()
		before := time.Now()
		r, err := s.Now(t.Context())
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if r.Latest.Before(before) || r.Earliest.After(after) {
			t.Fatalf("reading [%s, %s] does not hold the local clock's [%s, %s]", r.Earliest, r.Latest, before, after)
		}
		return r
	}
	first := check()
	r := first
	took, err := poll.Until(t.Context(), 30*time.Second, "uncertainty under 250ms", poll.Condition(func() bool {
		r = check()
		return r.Uncertainty() < 250*time.Millisecond
	}))
	if err != nil {
		t.Fatalf("%v: still %v (%v at first)", err, r.Uncertainty(), first.Uncertainty())
	}
	t.Logf("uncertainty %v at first, %v %v later", first.Uncertainty(), r.Uncertainty(), took)
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("ping: %v", err)
	}
}
