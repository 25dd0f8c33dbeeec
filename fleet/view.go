package fleet

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/reconciler"
)

// DefaultViewInterval is how often a View looks at the fleet by default.
const DefaultViewInterval = 5 * time.Second

// ClusterLister is the part of the lease API client a View uses.
type ClusterLister interface {
	ListClusters(ctx context.Context) ([]leaseapi.Cluster, error)
}

var _ ClusterLister = (*leaseclient.Client)(nil)

// View is the fleet as this agent sees it: it lists the registered clusters
// at the lease API every Interval and keeps, for each, since when it has
// been healthy (heartbeating and not cordoned) at every look. A look that
// fails makes the view not current and forgets every healthy stretch: a
// cluster that flapped while the view was blind must not count as stable.
// It is a controller-runtime Runnable on every replica, and the
// reconciler's ClusterView.
type View struct {
	Lister ClusterLister
	// Interval between looks (DefaultViewInterval).
	Interval time.Duration
	// Clock is the real clock when nil.
	Clock clock.WithTicker
	Log   logr.Logger
	// OnChange, when set, is called in its own goroutine when a look
	// changes the view: a cluster turned healthy or not, came or went, or
	// changed its labels, or the view turned current or not.
	OnChange func(ctx context.Context)

	mu       sync.Mutex
	clusters map[string]reconciler.ViewedCluster
	current  bool
}

var _ reconciler.ClusterView = (*View)(nil)

// Clusters is the view as of the last look, sorted by id, and whether it
// is current.
func (v *View) Clusters() ([]reconciler.ViewedCluster, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := slices.Collect(maps.Values(v.clusters))
	slices.SortFunc(out, func(a, b reconciler.ViewedCluster) int { return cmp.Compare(a.ID, b.ID) })
	return out, v.current
}

// Look lists the clusters once and updates the view.
func (v *View) Look(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(v.interval(), time.Second))
	defer cancel()
	list, err := v.Lister.ListClusters(ctx)
	now := v.clock().Now()

	v.mu.Lock()
	changed := v.observe(list, err, now)
	v.mu.Unlock()
	if changed && v.OnChange != nil {
		go v.OnChange(context.WithoutCancel(ctx))
	}
	return err
}

// observe folds one look (list, or err) taken at now into the view, and
// reports whether anything placement decides on changed. v.mu is held.
func (v *View) observe(list []leaseapi.Cluster, err error, now time.Time) bool {
	if err != nil {
		if v.current {
			v.Log.Info("cannot see the fleet at the lease API: no failback until it can", "error", err.Error())
		}
		changed := v.current
		v.current = false
		for id, c := range v.clusters {
			c.HealthySince = time.Time{}
			v.clusters[id] = c
		}
		return changed
	}
	changed := !v.current
	next := make(map[string]reconciler.ViewedCluster, len(list))
	for _, c := range list {
		healthy := c.Healthy && !c.Cordoned
		old, seen := v.clusters[c.ID]
		vc := reconciler.ViewedCluster{ID: c.ID, Labels: c.Labels}
		switch {
		case !healthy:
		case seen && v.current && !old.HealthySince.IsZero():
			vc.HealthySince = old.HealthySince
		default:
			vc.HealthySince = now
		}
		if !seen || old.HealthySince.IsZero() != vc.HealthySince.IsZero() || !maps.Equal(old.Labels, vc.Labels) {
			changed = true
		}
		next[c.ID] = vc
	}
	if len(next) != len(v.clusters) {
		changed = true
	}
	v.clusters, v.current = next, true
	return changed
}

// Start looks at the fleet until ctx ends.
func (v *View) Start(ctx context.Context) error {
	t := v.clock().NewTicker(v.interval())
	defer t.Stop()
	for {
		if err := v.Look(ctx); err != nil {
			v.Log.V(1).Info("look at the fleet failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// NeedLeaderElection is false: every replica keeps its view current, so a
// new leader decides on a view that is already warm.
func (v *View) NeedLeaderElection() bool { return false }

func (v *View) interval() time.Duration {
	if v.Interval > 0 {
		return v.Interval
	}
	return DefaultViewInterval
}

func (v *View) clock() clock.WithTicker {
	if v.Clock != nil {
		return v.Clock
	}
	return clock.RealClock{}
}
