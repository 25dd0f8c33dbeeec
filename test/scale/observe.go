package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/localfleet"
)

// listPage is the largest page the lease API serves.
const listPage = 1000

// leaseLister reads every lease from the lease API as its administrator,
// page by page.
type leaseLister struct {
	client *leaseclient.Client
}

func newLeaseLister(api *localfleet.LeaseAPI) (*leaseLister, error) {
	cl, err := leaseclient.New(leaseclient.Config{URL: api.URL, TokenFile: api.TokenFiles[localfleet.AdminSubject], Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	return &leaseLister{client: cl}, nil
}

// holders maps a lease key to its live holder ("" when free or expired).
type holders map[string]string

// list reads every lease. seen is called with each page's holders as the
// page arrives, so that a caller timing changes stamps each lease with when
// its page was read rather than when the whole list was.
func (l *leaseLister) list(ctx context.Context, seen func(page holders)) (holders, error) {
	out := holders{}
	opts := leaseclient.ListOptions{Limit: listPage}
	for {
		page, err := l.client.ListLeases(ctx, opts)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		got := make(holders, len(page.Items))
		for _, it := range page.Items {
			holder := it.Holder
			if !it.ExpiresAt.After(now) {
				holder = "" // expired, not yet swept
			}
			got[it.Namespace+"/"+it.Name] = holder
		}
		if seen != nil {
			seen(got)
		}
		for k, h := range got {
			out[k] = h
		}
		if page.Continue == "" {
			return out, nil
		}
		opts.Continue = page.Continue
	}
}

// statusTracker follows status.leaseState of every BerthLease in every
// cluster through a watch (an informer per cluster), so that reading them
// costs the clusters nothing beyond the changes.
type statusTracker struct {
	mu sync.Mutex
	// states maps a cluster to its BerthLeases' lease keys and states.
	states map[string]map[string]string
}

func startStatusTracker(ctx context.Context, f *localfleet.Fleet) (*statusTracker, error) {
	t := &statusTracker{states: map[string]map[string]string{}}
	for _, m := range f.Members {
		t.states[m.Name] = map[string]string{}
		c, err := ctrlcache.New(m.Cluster.RESTConfig(), ctrlcache.Options{Scheme: builders.Scheme, DefaultTransform: slimBerthLease})
		if err != nil {
			return nil, err
		}
		inf, err := c.GetInformer(ctx, &berthv1alpha1.BerthLease{})
		if err != nil {
			return nil, err
		}
		cluster := m.Name
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { t.set(cluster, obj, false) },
			UpdateFunc: func(_, obj any) { t.set(cluster, obj, false) },
			DeleteFunc: func(obj any) { t.set(cluster, obj, true) },
		}); err != nil {
			return nil, err
		}
		go func() { _ = c.Start(ctx) }()
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		synced := c.WaitForCacheSync(sctx)
		cancel()
		if !synced {
			return nil, fmt.Errorf("%s: BerthLeases not listed within 2m", m.Name)
		}
	}
	return t, nil
}

// slimBerthLease keeps only what the tracker reads, so that tens of
// thousands of cached BerthLeases cost little memory.
func slimBerthLease(obj any) (any, error) {
	bl, ok := obj.(*berthv1alpha1.BerthLease)
	if !ok {
		return obj, nil
	}
	slim := &berthv1alpha1.BerthLease{}
	slim.Namespace, slim.Name, slim.UID, slim.ResourceVersion = bl.Namespace, bl.Name, bl.UID, bl.ResourceVersion
	slim.Spec.LeaseName = bl.Spec.LeaseName
	slim.Status.LeaseState = bl.Status.LeaseState
	return slim, nil
}

func (t *statusTracker) set(cluster string, obj any, deleted bool) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	bl, ok := obj.(*berthv1alpha1.BerthLease)
	if !ok {
		return
	}
	key := leaseKeyOf(bl)
	t.mu.Lock()
	defer t.mu.Unlock()
	if deleted {
		delete(t.states[cluster], key)
		return
	}
	t.states[cluster][key] = bl.Status.LeaseState
}

// leaseKeyOf is the lease key of a BerthLease at the lease API.
func leaseKeyOf(bl *berthv1alpha1.BerthLease) string {
	name := bl.Spec.LeaseName
	if name == "" {
		name = bl.Name
	}
	return ctrlclient.ObjectKey{Namespace: bl.Namespace, Name: name}.String()
}

// agreement counts how far the fleet is from settled.
type agreement struct {
	// Held counts keys held at the lease API.
	Held int
	// Waiting counts (key, cluster) pairs where a cluster that does not hold
	// a held key shows `waiting`, of WantWaiting: every key's in every
	// cluster but one.
	Waiting, WantWaiting int
	// Right counts keys whose status agrees in every cluster: the holder's
	// `held`, every other cluster's `waiting`.
	Right int
}

// agree compares the lease API's holders of keys with every cluster's
// status.leaseState.
func agree(keys []string, leases holders, states map[string]map[string]string) agreement {
	a := agreement{WantWaiting: len(keys) * max(len(states)-1, 0)}
	for _, k := range keys {
		holder := leases[k]
		if holder == "" {
			continue
		}
		a.Held++
		right := true
		for cluster, st := range states {
			if cluster == holder {
				right = right && st[k] == berthv1alpha1.LeaseStateHeld
				continue
			}
			if st[k] == berthv1alpha1.LeaseStateWaiting {
				a.Waiting++
			} else {
				right = false
			}
		}
		if right {
			a.Right++
		}
	}
	return a
}

// agreeWith reads the tracker's states and compares them with leases.
func (t *statusTracker) agreeWith(keys []string, leases holders) agreement {
	t.mu.Lock()
	defer t.mu.Unlock()
	return agree(keys, leases, t.states)
}

// mostHeld returns the cluster that holds the most of keys, and those keys.
func mostHeld(keys []string, leases holders) (string, []string) {
	byHolder := map[string][]string{}
	for _, k := range keys {
		if h := leases[k]; h != "" {
			byHolder[h] = append(byHolder[h], k)
		}
	}
	best := ""
	for h, ks := range byHolder {
		if best == "" || len(ks) > len(byHolder[best]) || (len(ks) == len(byHolder[best]) && h < best) {
			best = h
		}
	}
	return best, byHolder[best]
}
