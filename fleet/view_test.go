package fleet

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/reconciler"
)

// listed is a ClusterLister that answers what it was last given.
type listed struct {
	clusters []leaseapi.Cluster
	err      error
}

func (l *listed) ListClusters(context.Context) ([]leaseapi.Cluster, error) {
	return l.clusters, l.err
}

func TestViewHealthySince(t *testing.T) {
	start := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	l := &listed{}
	var changes atomic.Int32
	v := &View{Lister: l, Clock: clk, OnChange: func(context.Context) { changes.Add(1) }}
	look := func(what string, clusters []leaseapi.Cluster, err error) []reconciler.ViewedCluster {
		t.Helper()
		clk.Step(time.Second)
		l.clusters, l.err = clusters, err
		_ = v.Look(t.Context())
		got, current := v.Clusters()
		if current != (err == nil) {
			t.Fatalf("%s: current %t, want %t", what, current, err == nil)
		}
		return got
	}
	healthy := func(ids ...string) []leaseapi.Cluster {
		var cs []leaseapi.Cluster
		for _, id := range ids {
			cs = append(cs, leaseapi.Cluster{ID: id, Healthy: true, Labels: map[string]string{"site": id}})
		}
		return cs
	}
	since := func(cs []reconciler.ViewedCluster, id string) time.Time {
		for _, c := range cs {
			if c.ID == id {
				return c.HealthySince
			}
		}
		t.Fatalf("%s not in the view %v", id, cs)
		return time.Time{}
	}

	first := look("first look", healthy("a", "b"), nil)
	if want := start.Add(time.Second); !since(first, "a").Equal(want) || first[0].ID != "a" || first[1].Labels["site"] != "b" {
		t.Fatalf("first look: %+v, want a and b healthy since %s", first, want)
	}
	kept := look("second look", healthy("a", "b"), nil)
	if !since(kept, "a").Equal(start.Add(time.Second)) {
		t.Errorf("a healthy at every look: since %s, want the first look", since(kept, "a"))
	}

	cut := healthy("a", "b")
	cut[0].Healthy = false
	if got := look("a unhealthy", cut, nil); !since(got, "a").IsZero() {
		t.Errorf("a unhealthy: since %s, want zero", since(got, "a"))
	}
	if got := look("a back", healthy("a", "b"), nil); !since(got, "a").Equal(start.Add(4 * time.Second)) {
		t.Errorf("a back: since %s, want this look", since(got, "a"))
	}

	cordoned := healthy("a", "b")
	cordoned[1].Cordoned = true
	if got := look("b cordoned", cordoned, nil); !since(got, "b").IsZero() {
		t.Errorf("b cordoned: since %s, want zero (a cordoned cluster is not healthy for failback)", since(got, "b"))
	}

	// A failed look forgets every healthy stretch: a flap unseen must not
	// count as stable.
	if got := look("lease API unreachable", nil, errors.New("unreachable")); !since(got, "a").IsZero() {
		t.Errorf("after a failed look: a since %s, want zero", since(got, "a"))
	}
	if got := look("reachable again", healthy("a"), nil); !since(got, "a").Equal(start.Add(7*time.Second)) || len(got) != 1 {
		t.Errorf("after the view was blind: %+v, want only a, healthy since this look", got)
	}

	// Changes: the first look, a unhealthy, a back, b cordoned, blind, current
	// again (and b gone); not the second look.
	deadline := time.Now().Add(5 * time.Second)
	for changes.Load() < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := changes.Load(); n != 6 {
		t.Errorf("OnChange called %d times, want 6", n)
	}
}
