package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/fleet"
	"github.com/berthfleet/berth/reconciler"
)

// noHostCluster is the local manager's configuration when fleet mode runs
// without --kubeconfig: nothing in fleet mode uses the local cluster
// (controllers engage only the folder's clusters, leader election is off),
// so it is never dialled.
var noHostCluster = &rest.Config{Host: "https://no-host-cluster.berth.invalid"}

// runFleet is fleet mode: one process serves every cluster whose kubeconfig
// is a file of --fleet-kubeconfig-dir, each cluster under its own id (the
// file name without extension) with its own BerthLeaseReconciler, lease API
// token and registration. Clusters join and leave as files come and go.
func runFleet(ctx context.Context, o options, log logr.Logger) error {
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	// The host cluster, when there is one, holds only leader election.
	host := noHostCluster
	if o.kubeconfig != "" {
		if host, err = restConfig(o.kubeconfig); err != nil {
			return err
		}
	}
	cacheOpts, err := managedPodsCache()
	if err != nil {
		return err
	}
	dir := fleet.NewKubeconfigDir(o.fleetKubeconfigDir, log.WithName("fleet-dir"), func(co *cluster.Options) {
		co.Scheme = scheme
		co.Cache = cacheOpts
	})
	mgr, err := mcmanager.New(host, dir, mcmanager.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: o.metricsBindAddress},
		HealthProbeBindAddress:        o.healthProbeBindAddress,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "berth-agent-fleet.berth.skaphos.io",
		LeaderElectionNamespace:       o.operatorNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	shared, err := newLeaseClient(o, o.leaseAPITokenFile, log)
	if err != nil {
		return err
	}
	members := &fleetMembers{o: o, log: log, dir: dir, members: map[multicluster.ClusterName]*member{}, wakes: make(chan event.TypedGenericEvent[mcreconcile.Request])}
	dir.BeforeLeave = members.Leave
	// Added before the controller, so that a joining cluster registers and
	// gets its reconciler before the controller watches it.
	if err := mgr.Add(members); err != nil {
		return err
	}
	if err := reconciler.IndexBerthLeases(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := mcbuilder.ControllerManagedBy(mgr).
		For(&berthv1alpha1.BerthLease{}).
		Watches(&corev1.Pod{}, mchandler.EnqueueRequestsFromMapFunc(reconciler.PodToBerthLease),
			mcbuilder.WithPredicates(predicate.NewPredicateFuncs(reconciler.IsManaged))).
		WatchesRawSource(source.TypedChannel[mcreconcile.Request, mcreconcile.Request](members.wakes, enqueueWake)).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{MaxConcurrentReconciles: 4}).
		Named("berthlease").
		Complete(members); err != nil {
		return fmt.Errorf("set up the BerthLease controller: %w", err)
	}
	if err := addProbes(mgr, shared); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("registered", members.checkRegistered); err != nil {
		return err
	}
	if o.managedWorkloads {
		log.Info("fleet mode serves no admission webhooks: install them in each member cluster (docs/operations.md)")
	}
	log.Info("starting berth-agent in fleet mode", "version", version, "dir", o.fleetKubeconfigDir, "hostCluster", o.kubeconfig != "",
		"managedWorkloads", o.managedWorkloads, "leaseAPI", o.leaseAPIURL)
	return mgr.Start(ctx)
}

// fleetMembers keeps one member per engaged cluster and dispatches each
// reconcile to its cluster's reconciler. It is a multicluster Runnable: the
// manager engages it with every cluster the folder provides.
type fleetMembers struct {
	o   options
	log logr.Logger
	dir multicluster.Provider
	// wakes carries every member's wake-ups, with their cluster, into the
	// controller.
	wakes chan event.TypedGenericEvent[mcreconcile.Request]

	mu      sync.Mutex
	members map[multicluster.ClusterName]*member
}

// member is one engaged cluster.
type member struct {
	r         *reconciler.BerthLeaseReconciler
	registrar *fleet.Registrar
	// leaving: the cluster's kubeconfig was removed; it hands its leases
	// over and takes none.
	leaving atomic.Bool
}

// membership is what the member's reconciler is told: leaving comes first,
// then what the lease API says of the cluster.
func (m *member) membership() (reason, message string) {
	if m.leaving.Load() {
		return fleet.ReasonLeaving, fmt.Sprintf("cluster %q is leaving this agent (its kubeconfig was removed): it hands its leases over and takes none", m.r.ClusterIdentity)
	}
	return m.registrar.Membership()
}

// minLeaveTimeout is the least a leaving cluster's handover may take; Leave
// waits up to two TTLs of the cluster's longest BerthLease when that is
// longer, enough for its stop budget (a third of the TTL) and the release.
const minLeaveTimeout = 2 * time.Minute

var (
	_ mcmanager.Runnable                             = (*fleetMembers)(nil)
	_ reconcile.TypedReconciler[mcreconcile.Request] = (*fleetMembers)(nil)
)

// Start waits: members live and die with their clusters' engagements.
func (f *fleetMembers) Start(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Engage makes a cluster a member: it reads the cluster's fingerprint,
// registers it at the lease API with the cluster's own token (before
// anything is reconciled, as single-cluster mode does), and builds the
// cluster's reconciler. When ctx ends the member stops: no more reconciles,
// heartbeats or long polls. A cluster whose file was removed has normally
// handed its leases over by then (Leave; unless it could not in time); one
// whose agent shuts down keeps them, as a restarting single-cluster agent
// does.
func (f *fleetMembers) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	id := string(name)
	log := f.log.WithValues("cluster", id)
	tokenFile := clusterTokenFile(f.o, id)
	leases, err := newLeaseClient(f.o, tokenFile, log)
	if err != nil {
		return err
	}
	registrar, err := newRegistrar(ctx, cl.GetAPIReader(), leases, id, f.o, log)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", id, err)
	}
	r := &reconciler.BerthLeaseReconciler{
		Client:            cl.GetClient(),
		APIReader:         cl.GetAPIReader(),
		Recorder:          cl.GetEventRecorder("berth-agent"),
		Log:               log.WithName("berthlease"),
		LeaseClient:       leases,
		ClusterIdentity:   id,
		ManagedWorkloads:  f.o.managedWorkloads,
		OperatorNamespace: f.o.operatorNamespace,
	}
	m := &member{r: r, registrar: registrar}
	r.Membership = m.membership
	registrar.OnChange = r.WakeAll
	wakes := r.Wakes()

	f.mu.Lock()
	if old, ok := f.members[name]; ok {
		old.r.Stop() // replaced: its engagement ends too
	}
	f.members[name] = m
	f.mu.Unlock()

	go func() { _ = registrar.Start(ctx) }()
	go f.forward(ctx, name, wakes)
	go func() {
		<-ctx.Done()
		r.Stop()
		f.mu.Lock()
		if f.members[name] == m {
			delete(f.members, name)
		}
		f.mu.Unlock()
		log.Info("cluster left this agent: its reconciler stopped", "fileRemoved", m.leaving.Load())
	}()
	log.Info("cluster joined this agent", "tokenFile", tokenFile, "fingerprint", registrar.Fingerprint)
	return nil
}

// Leave hands over every lease of a cluster whose kubeconfig was removed,
// before the cluster is disengaged: the member is marked leaving, which its
// reconciler treats as a cordon (stop the Pods, wait until they are gone,
// release), and Leave waits until nothing is held, for at most two TTLs of
// the cluster's longest BerthLease (minLeaveTimeout at least). A cluster
// that cannot hand over in time (unreachable) is let go anyway: its leases
// expire after their TTL while Pods of it may still run. Leave returns at
// once when the agent shuts down.
func (f *fleetMembers) Leave(ctx context.Context, name multicluster.ClusterName) {
	f.mu.Lock()
	m := f.members[name]
	f.mu.Unlock()
	if m == nil {
		return
	}
	log := f.log.WithValues("cluster", string(name))
	log.Info("cluster is leaving this agent: handing its leases over")
	m.leaving.Store(true)
	timeout := minLeaveTimeout
	list := &berthv1alpha1.BerthLeaseList{}
	if err := m.r.APIReader.List(ctx, list); err == nil {
		for _, bl := range list.Items {
			timeout = max(timeout, 2*time.Duration(bl.Spec.TTLSeconds)*time.Second)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	m.r.WakeAll(ctx)
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		done, err := m.r.HandedOver(ctx)
		if err != nil {
			log.V(1).Info("handover not confirmed yet", "error", err.Error())
		}
		return done, nil
	})
	if err != nil {
		log.Error(err, "cluster leaves without having handed its leases over: they expire after their TTL, and its managed Pods may still run until someone stops them",
			"waited", time.Since(start).Round(time.Millisecond))
		return
	}
	log.Info("cluster handed its leases over", "took", time.Since(start).Round(time.Millisecond))
}

// forward carries a member's wake-ups into the controller with its cluster.
func (f *fleetMembers) forward(ctx context.Context, name multicluster.ClusterName, wakes <-chan event.GenericEvent) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-wakes:
			req := mcreconcile.Request{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.Object)}}
			select {
			case f.wakes <- event.TypedGenericEvent[mcreconcile.Request]{Object: req}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// Reconcile dispatches to the reconciler of the request's cluster; a
// request for a cluster that left is dropped.
func (f *fleetMembers) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	f.mu.Lock()
	m := f.members[req.ClusterName]
	f.mu.Unlock()
	if m == nil {
		f.log.V(1).Info("reconcile for a cluster that is not a member dropped", "cluster", req.ClusterName, "berthLease", req.NamespacedName)
		return ctrl.Result{}, nil
	}
	return m.r.Reconcile(ctx, req.Request)
}

// checkRegistered is ready when every member is registered and none is
// refused.
func (f *fleetMembers) checkRegistered(req *http.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, name := range slices.Sorted(func(yield func(multicluster.ClusterName) bool) {
		for n := range f.members {
			if !yield(n) {
				return
			}
		}
	}) {
		if err := f.members[name].registrar.Checker(req); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// clusterTokenFile is the lease API token of a fleet-mode cluster:
// DIR/<cluster>.token when it exists, else --lease-api-token-file. The lease
// API lets a token act only for its own subject, so each cluster needs its own.
func clusterTokenFile(o options, id string) string {
	path := filepath.Join(o.fleetKubeconfigDir, id+".token")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	return o.leaseAPITokenFile
}

// enqueueWake adds a wake-up's request to the controller's queue.
var enqueueWake = handler.TypedFuncs[mcreconcile.Request, mcreconcile.Request]{
	GenericFunc: func(_ context.Context, e event.TypedGenericEvent[mcreconcile.Request], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
		q.Add(e.Object)
	},
}
