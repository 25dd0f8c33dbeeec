package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/reconciler"
)

// LeaseClient is what a member cluster does at the lease API: register, and
// hold leases. A client that also offers reconciler.BatchRenewer,
// LeaseStreamer and LeaseReader (leaseclient.Client does) gives its
// reconciler batched renewals, the change stream, and recovery from the
// lease API's record after a restart.
type LeaseClient interface {
	Registry
	reconciler.LeaseClient
}

// minLeaveTimeout is the least a leaving cluster's handover may take; Leave
// waits up to two TTLs of the cluster's longest BerthLease when that is
// longer, enough for its stop budget (a third of the TTL) and the release.
const minLeaveTimeout = 2 * time.Minute

// handoverPoll is how often Leave looks whether a leaving cluster has
// handed its leases over.
const handoverPoll = 250 * time.Millisecond

// Members is fleet mode's side of the BerthLease controller: one member per
// cluster the provider engages, each registered at the lease API with its
// own token and running its own reconciler. It dispatches each reconcile to
// its cluster's reconciler, and when a cluster leaves (its kubeconfig is
// removed) it hands the cluster's leases over before letting it go.
type Members struct {
	// LeaseClient returns the lease API client a cluster acts with (each
	// cluster needs its own token: the lease API lets a token act only for
	// its own subject). Required.
	LeaseClient func(clusterID string) (LeaseClient, error)
	// ManagedWorkloads and OperatorNamespace are each member reconciler's.
	ManagedWorkloads  bool
	OperatorNamespace string
	// LeadingUntil is each member reconciler's (reconciler.BerthLeaseReconciler).
	LeadingUntil func() time.Time
	// AgentVersion is registered with each cluster.
	AgentVersion string
	// HeartbeatInterval paces each cluster's registration
	// (DefaultHeartbeatInterval).
	HeartbeatInterval time.Duration
	// ConcurrentReconciles is how many BerthLeases the controller reconciles
	// at once, over all clusters (reconciler.DefaultConcurrentReconciles).
	ConcurrentReconciles int
	// Labels, when set, are the labels each cluster registers (spec.placement
	// selects clusters by them).
	Labels func(clusterID string) map[string]string
	// Fleet is each member reconciler's view of the fleet (failback).
	Fleet reconciler.ClusterView
	// Clock paces handovers and is each reconciler's clock (the real clock
	// when nil).
	Clock clock.WithTicker
	Log   logr.Logger

	wakes chan event.TypedGenericEvent[mcreconcile.Request]

	mu      sync.Mutex
	members map[multicluster.ClusterName]*member
}

// member is one engaged cluster.
type member struct {
	id        string
	r         *reconciler.BerthLeaseReconciler
	registrar *Registrar
	leases    LeaseClient
	// stop ends the member's engagement: its long polls and heartbeats.
	stop context.CancelFunc
	// leaving: the cluster's kubeconfig was removed; it hands its leases
	// over and takes none.
	leaving atomic.Bool
	// inflight counts the member's reconciles running now.
	inflight atomic.Int32
}

var (
	_ mcmanager.Runnable     = (*Members)(nil)
	_ mcreconcile.Reconciler = (*Members)(nil)
)

// SetupWithManager adds the members to mgr, which engages them with every
// cluster its provider engages, runs the BerthLease controller over those
// clusters, and adds the "registered" readiness check. The members are
// added before the controller, so that a joining cluster registers and has
// its reconciler before the controller watches it.
func (f *Members) SetupWithManager(mgr mcmanager.Manager) error {
	if f.LeaseClient == nil {
		return errors.New("fleet members need a LeaseClient")
	}
	if f.Clock == nil {
		f.Clock = clock.RealClock{}
	}
	f.wakes = make(chan event.TypedGenericEvent[mcreconcile.Request])
	f.members = map[multicluster.ClusterName]*member{}
	if err := mgr.Add(f); err != nil {
		return err
	}
	if err := reconciler.SetupController(mgr, f.wakes, f.ConcurrentReconciles, f.ManagedWorkloads, f); err != nil {
		return fmt.Errorf("set up the BerthLease controller: %w", err)
	}
	return mgr.AddReadyzCheck("registered", f.Checker)
}

// Start waits: members live and die with their clusters' engagements.
func (f *Members) Start(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Engage makes a cluster a member: it registers the cluster at the lease API
// with the cluster's own token (before anything is reconciled, as
// single-cluster mode does) and builds the cluster's reconciler. When ctx
// ends the member stops: no more reconciles, heartbeats or long polls. A
// cluster whose file was removed has normally handed its leases over by
// then (Leave; unless it could not in time); one whose agent shuts down
// keeps them, as a restarting single-cluster agent does.
func (f *Members) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	id := string(name)
	log := f.Log.WithValues("cluster", id)
	leases, err := f.LeaseClient(id)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", id, err)
	}
	ctx, stop := context.WithCancel(ctx)
	registrar := &Registrar{
		ClusterID:    id,
		AgentVersion: f.AgentVersion,
		Registry:     leases,
		Labels:       f.labels(id),
		Interval:     f.HeartbeatInterval,
		Log:          f.Log.WithName("fleet"), // it names the cluster itself
	}
	if err := registrar.RegisterFirst(ctx, cl.GetAPIReader()); err != nil {
		stop()
		return fmt.Errorf("cluster %s: %w", id, err)
	}
	m := &member{id: id, registrar: registrar, leases: leases, stop: stop}
	m.r = &reconciler.BerthLeaseReconciler{
		Client:            cl.GetClient(),
		APIReader:         cl.GetAPIReader(),
		Recorder:          cl.GetEventRecorder("berth-agent"),
		Log:               log.WithName("berthlease"),
		LeaseClient:       leases,
		ClusterIdentity:   id,
		ManagedWorkloads:  f.ManagedWorkloads,
		OperatorNamespace: f.OperatorNamespace,
		LeadingUntil:      f.LeadingUntil,
		Clock:             f.Clock,
		Membership:        m.membership,
		Fleet:             f.Fleet,
		Wake:              reconciler.WakeInto(f.wakes, name),
	}
	registrar.OnChange = func(ctx context.Context) { WakeAll(logr.NewContext(ctx, log), cl.GetClient(), m.r.Wake) }

	f.mu.Lock()
	if old, ok := f.members[name]; ok {
		old.stop() // replaced: its engagement ends too
	}
	f.members[name] = m
	f.mu.Unlock()

	go func() { _ = registrar.Start(ctx) }()
	go func() { _ = m.r.Start(ctx) }()
	go func() {
		<-ctx.Done()
		f.mu.Lock()
		if f.members[name] == m {
			delete(f.members, name)
		}
		f.mu.Unlock()
		log.Info("cluster left this agent: its reconciler stopped", "fileRemoved", m.leaving.Load())
	}()
	log.Info("cluster joined this agent", "fingerprint", registrar.Fingerprint)
	return nil
}

// labels are the labels cluster id registers.
func (f *Members) labels(id string) map[string]string {
	if f.Labels == nil {
		return nil
	}
	return f.Labels(id)
}

// WakePlacement wakes, in every member cluster, the BerthLeases whose
// failback the fleet view decides (reconciler.WakePlacement): the view
// changed.
func (f *Members) WakePlacement(ctx context.Context) {
	f.mu.Lock()
	members := slices.Collect(maps.Values(f.members))
	f.mu.Unlock()
	for _, m := range members {
		m.r.WakePlacement(ctx)
	}
}

// ListClusters lists the fleet's clusters at the lease API with a member's
// own token (in id order, the first that answers): fleet mode's View
// needs no token of its own.
func (f *Members) ListClusters(ctx context.Context) ([]leaseapi.Cluster, error) {
	f.mu.Lock()
	members := slices.SortedFunc(maps.Values(f.members), func(a, b *member) int { return cmp.Compare(a.id, b.id) })
	f.mu.Unlock()
	errs := []error{errors.New("no member cluster to list the fleet with")}
	for _, m := range members {
		lister, ok := m.leases.(ClusterLister)
		if !ok {
			continue
		}
		clusters, err := lister.ListClusters(ctx)
		if err == nil {
			return clusters, nil
		}
		errs = append(errs, fmt.Errorf("cluster %s: %w", m.id, err))
	}
	return nil, errors.Join(errs...)
}

// membership is what the member's reconciler is told: leaving comes first,
// then what the lease API says of the cluster.
func (m *member) membership() (reason, message string) {
	if m.leaving.Load() {
		return ReasonLeaving, fmt.Sprintf("cluster %q is leaving this agent (its kubeconfig was removed): it hands its leases over and takes none", m.id)
	}
	return m.registrar.Membership()
}

// Leave hands over every lease of a cluster whose kubeconfig was removed,
// before the cluster is disengaged (KubeconfigDir.BeforeLeave): the member
// is marked leaving, which its reconciler treats as a cordon (stop the
// Pods, wait until they are gone, release), and Leave waits until nothing
// is held, for at most two TTLs of the cluster's longest BerthLease
// (minLeaveTimeout at least). A cluster that cannot hand over in time
// (unreachable) is let go anyway: its leases expire after their TTL while
// Pods of it may still run. Leave returns at once when ctx ends.
func (f *Members) Leave(ctx context.Context, name multicluster.ClusterName) {
	m := f.member(name)
	if m == nil {
		return
	}
	log := f.Log.WithValues("cluster", string(name))
	log.Info("cluster is leaving this agent: handing its leases over")
	m.leaving.Store(true)
	timeout := minLeaveTimeout
	list := &berthv1alpha1.BerthLeaseList{}
	if err := m.r.APIReader.List(ctx, list); err == nil {
		for _, bl := range list.Items {
			timeout = max(timeout, 2*time.Duration(bl.Spec.TTLSeconds)*time.Second)
		}
	}
	start := f.Clock.Now()
	WakeAll(logr.NewContext(ctx, log), m.r.Client, m.r.Wake)
	for {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		done, err := m.handedOver(hctx)
		cancel()
		switch {
		case done:
			log.Info("cluster handed its leases over", "took", f.Clock.Since(start).Round(time.Millisecond))
			return
		case err != nil:
			log.V(1).Info("handover not confirmed yet", "error", err.Error())
		}
		if f.Clock.Since(start) >= timeout {
			log.Error(errors.New("handover timed out"), "cluster leaves without having handed its leases over: they expire after their TTL, and its managed Pods may still run until someone stops them",
				"waited", f.Clock.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-f.Clock.After(handoverPoll):
		}
	}
}

// handedOver reports whether the member's cluster holds no lease any more:
// no reconcile is running, none ended keeping a term or a token to recover
// or release, and no BerthLease's status (read from the API server) says
// held. Only meaningful once the member is leaving: a reconcile that starts
// after that acquires nothing, so once none runs, what is held can only
// shrink.
func (m *member) handedOver(ctx context.Context) (bool, error) {
	if m.inflight.Load() > 0 || m.r.Holding() > 0 {
		return false, nil
	}
	list := &berthv1alpha1.BerthLeaseList{}
	if err := m.r.APIReader.List(ctx, list); err != nil {
		return false, fmt.Errorf("list BerthLeases: %w", err)
	}
	for i := range list.Items {
		if list.Items[i].Status.LeaseState == reconciler.StateHeld {
			return false, nil
		}
	}
	return true, nil
}

// Reconcile dispatches to the reconciler of the request's cluster; a
// request for a cluster that is not a member (any more) is dropped.
func (f *Members) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	m := f.member(req.ClusterName)
	if m == nil {
		f.Log.V(1).Info("reconcile for a cluster that is not a member dropped", "cluster", req.ClusterName, "berthLease", req.NamespacedName)
		return reconcile.Result{}, nil
	}
	m.inflight.Add(1)
	defer m.inflight.Add(-1)
	return m.r.Reconcile(ctx, req.Request)
}

func (f *Members) member(name multicluster.ClusterName) *member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.members[name]
}

// Checker is a readiness check: ready when every member is registered and
// none is refused.
func (f *Members) Checker(req *http.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]multicluster.ClusterName, 0, len(f.members))
	for n := range f.members {
		names = append(names, n)
	}
	slices.Sort(names)
	var errs []error
	for _, name := range names {
		if err := f.members[name].registrar.Checker(req); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WakeAll asks for every BerthLease of a cluster to be reconciled now: a
// cluster's membership changed (cordoned, uncordoned, refused, leaving), so
// that a handover starts at once rather than at the next heartbeat. It
// never waits long for a controller that may not run (not the leader).
func WakeAll(ctx context.Context, c ctrlclient.Reader, wake func(context.Context, types.NamespacedName)) {
	if wake == nil {
		return
	}
	list := &berthv1alpha1.BerthLeaseList{}
	if err := c.List(ctx, list); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "list BerthLeases to wake them")
		return
	}
	for i := range list.Items {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		wake(wctx, ctrlclient.ObjectKeyFromObject(&list.Items[i]))
		timedOut := wctx.Err() != nil
		cancel()
		if timedOut {
			return
		}
	}
}
