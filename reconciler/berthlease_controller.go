package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// LeaseClient is the subset of [leaseclient.Client] consumed by the reconciler.
// Defined as an interface so tests can inject a fault.
type LeaseClient interface {
	Acquire(ctx context.Context, namespace, name, holder string, ttl time.Duration) (leaseclient.AcquireResult, error)
	Renew(ctx context.Context, namespace, name, holder string, fencingToken int32, ttl time.Duration) (leaseclient.AcquireResult, error)
	Release(ctx context.Context, namespace, name, holder string, fencingToken int32) error
	// Revoke is how the agent gives up a fenced term (fencedTerm).
	Revoke(ctx context.Context, namespace, name, holder string, fencingToken int32) error
}

var _ LeaseClient = (*leaseclient.Client)(nil)

// DefaultCallTimeout bounds one lease API call or one local cleanup step; a
// call is also cut short at the local deadline.
const DefaultCallTimeout = 5 * time.Second

// The agent's permissions in each cluster (deploy/rbac is generated from these).
// +kubebuilder:rbac:groups=berth.skaphos.io,resources=berthleases,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=berth.skaphos.io,resources=berthleases/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=berth.skaphos.io,resources=berthleases/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
//
// Leader election among the agent's replicas needs Leases in the agent's own
// namespace only (deploy/ installs it in berth-system): a Role, never rights
// over the Leases of kube-system or kube-node-lease.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=berth-system
// The election records its events as core Events there.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=berth-system

// BerthLeaseReconciler reconciles BerthLease resources by holding (or
// renewing) a lease against the central API server and applying the
// configured workload actions in response to lease state.
type BerthLeaseReconciler struct {
	ctrlclient.Client
	// Log is the reconciler's logger.
	Log logr.Logger
	// LeaseClient is the central API server client. Required.
	LeaseClient LeaseClient
	// ClusterIdentity, when non-empty, is used as the holder identity for
	// every Acquire / Renew / Release call, overriding spec.holderIdentity:
	// the same BerthLease applied to several clusters then competes for the
	// lease (the cross-cluster singleton). When empty, spec.holderIdentity
	// is the holder.
	ClusterIdentity string
	// ManagedWorkloads turns on gating: ungate the managed Pods while held.
	// It requires the fail-closed admission installation. Every agent,
	// with it or without, deletes the ungated managed Pods it finds when
	// the lease must be given up, and gives it up only once they are gone.
	ManagedWorkloads bool
	// OperatorNamespace is the agent's own namespace.
	OperatorNamespace string

	// APIReader reads Pods without the informer cache, so that a decision to
	// ungate or release never rests on a stale view. Defaults to the
	// manager's API reader.
	APIReader ctrlclient.Reader
	// Clock is the agent's clock; its readings must carry the monotonic
	// clock (the real clock does). Defaults to the real clock.
	Clock clock.PassiveClock
	// Recorder emits an Event on every lease transition. Defaults to the
	// manager's recorder.
	Recorder events.EventRecorder
	// CallTimeout bounds each lease API call and cleanup step
	// (DefaultCallTimeout).
	CallTimeout time.Duration
	// Membership, when set, says whether the fleet asks this cluster to hand
	// its leases over and take none (cordoned at the lease API, registration
	// refused), with a condition reason and message; an empty reason means
	// it may hold leases. package fleet's Registrar provides it.
	Membership func() (reason, message string)

	// Fleet, when set, is the fleet as this agent sees it at the lease API
	// (fleet.View): spec.placement's failback decides on it. Without it,
	// no failback is made.
	Fleet ClusterView

	// Wake asks for a BerthLease to be reconciled now, when no watch event
	// would bring it: the change stream saw its lease change, or the
	// renewer has news of its term. Whoever runs the reconciler's
	// controller sets it: SetupWithManager, or fleet mode for each member
	// cluster. Start needs it.
	Wake func(ctx context.Context, name types.NamespacedName)

	// ConcurrentReconciles is how many BerthLeases are reconciled at once
	// (DefaultConcurrentReconciles).
	ConcurrentReconciles int

	// LeadingUntil, when set, is the instant (on Clock) before which this
	// process is certainly the only replica of its cluster's agent that
	// acts (the leader election's, cmd/berth-agent); zero when it is not.
	// Nothing is done outside it: no lease API call, no Pod ungated or
	// stopped, no status written (see leading.go). Nil: the process is
	// alone.
	LeadingUntil func() time.Time

	// moveUnsupported: the lease API answered that it has no moves (an
	// earlier release); placement is off.
	moveUnsupported atomic.Bool

	defaultsOnce sync.Once
	mu           sync.Mutex
	memory       map[types.UID]*memory
	// renewals renews the running terms in batches (Start).
	renewals renewer
	// changes follows the lease API's change stream (Start).
	changes stream
	// acquisitions takes leases over that the stream reports free (Start).
	acquisitions acquirer
}

// SetupWithManager runs the reconciler under a controller of mgr's own
// cluster (single-cluster mode): the controller SetupController declares,
// and the reconciler's renewals and change stream (Start) for as long as
// the manager leads.
func (r *BerthLeaseReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.LeaseClient == nil {
		return errors.New("BerthLeaseReconciler needs a LeaseClient")
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("berth-agent")
	}
	wakes := make(chan event.TypedGenericEvent[mcreconcile.Request])
	if r.Wake == nil {
		r.Wake = WakeInto(wakes, "")
	}
	if err := mgr.Add(r); err != nil {
		return err
	}
	local, err := mcmanager.WithMultiCluster(mgr, nil)
	if err != nil {
		return err
	}
	r.defaults()
	return SetupController(local, wakes, r.ConcurrentReconciles, r.ManagedWorkloads, mcreconcile.Func(func(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
		return r.Reconcile(ctx, req.Request)
	}))
}

// DefaultConcurrentReconciles is how many BerthLeases a cluster's
// controller reconciles at once by default. A reconcile mostly waits on
// the API server (a few requests in a row), so with thousands of
// BerthLeases the workers, not the CPU, pace a cluster's first start, a
// restart or a cordon; the client rate limit (--kube-api-qps) caps them.
const DefaultConcurrentReconciles = 32

// SetupController declares the BerthLease controller, once for both modes:
// it reconciles each BerthLease on changes to it, to its managed Pods, and
// on the wake-ups its reconciler asks for (wakes). On a manager without a
// provider it watches the manager's own cluster (single-cluster mode); with
// one, every cluster the provider engages (fleet mode), each request naming
// its cluster. It runs concurrent reconciles at once. With workloads
// (managed workloads) it also watches the labelled Deployments,
// StatefulSets and CronJobs it marks.
func SetupController(mgr mcmanager.Manager, wakes <-chan event.TypedGenericEvent[mcreconcile.Request], concurrent int, workloads bool, r mcreconcile.Reconciler) error {
	if err := IndexBerthLeases(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	b := mcbuilder.ControllerManagedBy(mgr).
		For(&berthv1alpha1.BerthLease{}, mcbuilder.WithPredicates(predicate.Funcs{UpdateFunc: notStatusOnly})).
		Watches(&corev1.Pod{}, mchandler.EnqueueRequestsFromMapFunc(PodToBerthLease),
			mcbuilder.WithPredicates(predicate.NewPredicateFuncs(IsManaged)))
	if workloads {
		// Only with managed workloads: the agent needs no rights over
		// Deployments, StatefulSets and CronJobs otherwise.
		for _, o := range WorkloadKinds() {
			b = b.Watches(o, mchandler.EnqueueRequestsFromMapFunc(PodToBerthLease), workloadPredicates)
		}
	}
	return b.WatchesRawSource(source.TypedChannel(wakes, enqueueWake)).
		// multicluster-runtime's builder does not apply the manager's
		// SkipNameValidation itself (tests run many managers in one process).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{MaxConcurrentReconciles: cmp.Or(concurrent, DefaultConcurrentReconciles),
			RateLimiter:        failureBackoff(),
			SkipNameValidation: mgr.GetControllerOptions().SkipNameValidation}).
		Named("berthlease").
		Complete(r)
}

// failureBackoff paces the retries of a reconcile that failed: from 5 ms,
// doubling, but never later than stopPollInterval. controller-runtime's
// default backs off to 1,000 s and ignores RequeueAfter when a reconcile
// fails, so a BerthLease whose reconciles keep failing (a status write
// refused by a policy, a Pod delete failing) would renew late and miss its
// local deadline. Each retry renews first, and stops the Pods at the
// deadline whatever else fails.
func failureBackoff() workqueue.TypedRateLimiter[mcreconcile.Request] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](5*time.Millisecond, stopPollInterval)
}

// WakeInto is a Wake that sends the BerthLease's request, in cluster, into
// wakes: the channel SetupController watches. It gives up when ctx ends.
func WakeInto(wakes chan<- event.TypedGenericEvent[mcreconcile.Request], cluster multicluster.ClusterName) func(context.Context, types.NamespacedName) {
	return func(ctx context.Context, name types.NamespacedName) {
		req := mcreconcile.Request{ClusterName: cluster, Request: reconcile.Request{NamespacedName: name}}
		select {
		case wakes <- event.TypedGenericEvent[mcreconcile.Request]{Object: req}:
		case <-ctx.Done():
		}
	}
}

// enqueueWake adds a wake-up's request to the controller's queue.
var enqueueWake = handler.TypedFuncs[mcreconcile.Request, mcreconcile.Request]{
	GenericFunc: func(_ context.Context, e event.TypedGenericEvent[mcreconcile.Request], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
		q.Add(e.Object)
	},
}

// notStatusOnly passes every update of a BerthLease but the agent's own
// writes that need no look: a status change (only the agent may write
// status), and the finalizer added (the reconcile that adds it goes on).
// Each would bring one more reconcile that finds nothing to do, and with
// thousands of BerthLeases those reconciles are most of the work. Spec,
// labels, annotations, any other finalizer change (the finalizer removed)
// and deletion all pass.
func notStatusOnly(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	if o == nil || n == nil {
		return true
	}
	finalizers := o.GetFinalizers()
	if !slices.Contains(finalizers, FinalizerName) {
		finalizers = append(slices.Clone(finalizers), FinalizerName)
	}
	return o.GetGeneration() != n.GetGeneration() ||
		!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
		!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) ||
		!slices.Equal(finalizers, n.GetFinalizers()) ||
		!equality.Semantic.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences()) ||
		!equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp())
}

// workloadPredicates pass the events of managed workloads that may need
// marking again: created, deleted, or their spec, labels or annotations
// changed, or who owns a CronJob's spec.suspend (not their status, which
// their controllers write often).
var workloadPredicates = mcbuilder.WithPredicates(predicate.NewPredicateFuncs(IsManaged),
	predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{},
		predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return suspendOwnersChanged(e.ObjectOld, e.ObjectNew) }}))

// IsManaged reports whether o is a managed Pod (it names a BerthLease).
func IsManaged(o ctrlclient.Object) bool {
	_, ok := o.GetLabels()[ManagedLease]
	return ok
}

// PodToBerthLease maps a managed Pod to the BerthLease it names (a
// controller's MapFunc).
func PodToBerthLease(_ context.Context, o ctrlclient.Object) []reconcile.Request {
	name := o.GetLabels()[ManagedLease]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// defaults fills in what was left unset, once, before the first reconcile.
func (r *BerthLeaseReconciler) defaults() {
	r.defaultsOnce.Do(func() {
		if r.Clock == nil {
			r.Clock = clock.RealClock{}
		}
		if r.CallTimeout <= 0 {
			r.CallTimeout = DefaultCallTimeout
		}
		if r.APIReader == nil {
			r.APIReader = r.Client
		}
		if r.ConcurrentReconciles <= 0 {
			r.ConcurrentReconciles = DefaultConcurrentReconciles
		}
		r.renewals.kick = make(chan struct{}, 1)
		r.acquisitions.queue = make(chan *memory, acquireQueue)
		r.mu.Lock()
		r.memory = map[types.UID]*memory{}
		r.mu.Unlock()
	})
}

// Reconcile bounds both central calls and local cleanup operations. The
// client supplied by main bypasses the informer cache for security-sensitive
// reads.
func (r *BerthLeaseReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.defaults()
	log := r.Log.WithValues("berthLease", req.NamespacedName)
	ctx = logr.NewContext(ctx, log)
	ctx, cancel, ok := r.whileLeading(ctx)
	if !ok {
		log.V(1).Info("not certainly the leader: acting on nothing until leadership is renewed or this process ends")
		return ctrl.Result{RequeueAfter: leadershipRetry}, nil
	}
	defer cancel()

	bl := &berthv1alpha1.BerthLease{}
	if err := r.Get(ctx, req.NamespacedName, bl); err != nil {
		if apierrors.IsNotFound(err) {
			return r.reconcileGone(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, fmt.Errorf("get BerthLease: %w", err)
	}
	if bl.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(bl, FinalizerName) {
		controllerutil.AddFinalizer(bl, FinalizerName)
		if err := r.Update(ctx, bl); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	mem := r.memoryOf(bl)
	p, d := r.settle(ctx, bl, mem)
	// The term goes to the renewer (or comes back from it) before anything
	// below can fail: a reconcile that fails is retried, and the term must
	// be renewed meanwhile, by one or the other.
	p.handedOver = r.handOver(mem, r.batchSpecFor(bl, p, mem, d))
	mem.setWaiting(r.waitSpecFor(p, mem, d))
	if err := r.actOnPods(ctx, bl, p, d, PodsStop); err != nil {
		return ctrl.Result{}, err
	}
	// Status is written before any Pod is ungated.
	if err := r.writeStatus(ctx, bl, p, mem, d); err != nil {
		return ctrl.Result{}, err
	}
	// The workloads are marked before any Pod is ungated too. A failure is
	// retried but holds nothing up: whether a CronJob's Job may run is
	// judged again for each of its Pods (jobMayRun).
	workloadsErr := r.syncWorkloads(ctx, bl, d, podJobs(p))
	if workloadsErr != nil {
		log.Error(workloadsErr, "cannot mark the managed workloads")
	}
	if err := r.actOnPods(ctx, bl, p, d, PodsUngate); err != nil {
		return ctrl.Result{}, err
	}
	if !p.facts.Deleting {
		if err := r.recycle(ctx, p); err != nil {
			return ctrl.Result{}, err
		}
	}
	if len(p.strays) > 0 {
		// Pods of an earlier BerthLease of this name (stopPods logs each
		// one it stops).
		if err := r.stopPods(ctx, p, p.strays); err != nil {
			return ctrl.Result{}, err
		}
	}
	observeLease(r.ClusterIdentity, bl, p.facts, d)
	supersededLeft := r.settleSuperseded(ctx, bl)
	if d.RemoveFinalizer {
		r.forget(bl.UID)
		r.lettingGo(ctx, bl)
		if controllerutil.RemoveFinalizer(bl, FinalizerName) {
			if err := r.Update(ctx, bl); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
			}
			log.Info("finalizer removed: nothing of the BerthLease runs or is held here any more")
		}
		return ctrl.Result{}, nil
	}
	res := r.result(p, mem, d)
	if wake := r.place(ctx, bl, p, d); !wake.IsZero() {
		if after := max(wake.Sub(r.Clock.Now()), 10*time.Millisecond); res.RequeueAfter == 0 || after < res.RequeueAfter {
			res.RequeueAfter = after
		}
	}
	if supersededLeft && (res.RequeueAfter == 0 || res.RequeueAfter > stopPollInterval) {
		res.RequeueAfter = stopPollInterval
	}
	if workloadsErr != nil {
		return ctrl.Result{}, workloadsErr
	}
	return res, nil
}

// settleSuperseded settles the terms that earlier BerthLeases of bl's name
// held for other leases (memoryOf): each is carried through the vanished
// BerthLease's path (renew while its Pods stop, then release) and forgotten
// when done. It reports whether any is left.
func (r *BerthLeaseReconciler) settleSuperseded(ctx context.Context, bl *berthv1alpha1.BerthLease) bool {
	r.mu.Lock()
	var olds []*memory
	for uid, m := range r.memory {
		if uid != bl.UID && m.superseded && m.name == ctrlclient.ObjectKeyFromObject(bl) {
			olds = append(olds, m)
		}
	}
	r.mu.Unlock()
	left := false
	for _, old := range olds {
		gone := r.goneCopy(old.last)
		log := logr.FromContextOrDiscard(ctx).WithValues("supersededUID", gone.UID, "lease", gone.EffectiveLeaseName())
		sctx := logr.NewContext(ctx, log)
		p, d := r.settle(sctx, gone, old)
		if err := r.actOnPods(sctx, gone, p, d, PodsStop); err != nil {
			log.Error(err, "stop the Pods of an earlier BerthLease of this name")
		}
		if d.RemoveFinalizer {
			log.Info("the term of an earlier BerthLease of this name is settled")
			r.forget(gone.UID)
			continue
		}
		left = true
	}
	return left
}

// settle gathers the facts and decides. A decision that calls the lease API
// (or lets go of a term) is carried out at once and decided anew, so that
// what the reconcile does next acts on the answer.
func (r *BerthLeaseReconciler) settle(ctx context.Context, bl *berthv1alpha1.BerthLease, mem *memory) (*observation, Decision) {
	p := r.observe(ctx, bl, mem, nil)
	d := r.decide(ctx, bl, p)
	if d.Call == CallNone && !d.DropTerm {
		return p, d
	}
	// Stopping never waits on the lease API.
	if err := r.actOnPods(ctx, bl, p, d, PodsStop); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "stop Pods")
	}
	if d.DropTerm {
		r.dropTerm(ctx, mem, p)
	} else {
		r.call(ctx, bl, p, mem, d.Call)
	}
	// The Pods were read from the API server a moment ago; only the ones
	// just stopped need reading again.
	pods := p
	if d.Pods == PodsStop {
		pods = nil
	}
	p = r.observe(ctx, bl, mem, pods)
	return p, r.decide(ctx, bl, p)
}

// decide is Decide, with what a release needs read first: a release must
// not free a term that another BerthLease, or a BerthLease that is gone,
// may still run under (checkRelease).
func (r *BerthLeaseReconciler) decide(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation) Decision {
	d := Decide(p.facts)
	if d.Call != CallRelease {
		return d
	}
	if err := r.checkRelease(ctx, bl, p); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "cannot confirm that nothing the term covers still runs; holding on to the lease")
		p.facts.PodsUnknown = true
	}
	return Decide(p.facts)
}

// dropTerm lets go of the term without releasing it: another BerthLease
// names the same lease and keeps renewing it, or it expires.
func (r *BerthLeaseReconciler) dropTerm(ctx context.Context, mem *memory, p *observation) {
	var token int32
	mem.update(func(t tenure) tenure {
		t, token = t.dropTerm()
		return t
	})
	logr.FromContextOrDiscard(ctx).Info("letting go of the term without releasing it: another BerthLease names the same lease",
		"token", token, "otherBerthLease", p.sharedWith)
}

// reconcileGone handles a BerthLease that is gone from the API server
// although its finalizer should have kept it until its lease was given up:
// someone removed the finalizer, or the agent restarted and finds Pods that
// name a BerthLease that no longer exists. Its running Pods are stopped, and
// a term it held is kept (renewed) until they are gone and then released
// (or let go of, when another BerthLease names the same lease), exactly as
// for a BerthLease being deleted.
func (r *BerthLeaseReconciler) reconcileGone(ctx context.Context, name types.NamespacedName) (ctrl.Result, error) {
	live := &berthv1alpha1.BerthLease{}
	switch err := r.APIReader.Get(ctx, name, live); {
	case err == nil:
		// The cache has not caught up; the object's event follows.
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, fmt.Errorf("get BerthLease: %w", err)
	}
	bl, mem := r.goneOf(name)
	mem.gone = true
	r.handOver(mem, nil)
	mem.setWaiting(nil)
	p, d := r.settle(ctx, bl, mem)
	if err := r.actOnPods(ctx, bl, p, d, PodsStop); err != nil {
		return ctrl.Result{}, err
	}
	if d.Pods == PodsStop {
		logr.FromContextOrDiscard(ctx).Info("stopping the Pods of a BerthLease that is gone (its finalizer was removed)", "runningPods", len(p.running))
	}
	if !d.RemoveFinalizer {
		return r.result(p, mem, d), nil
	}
	r.forgetName(name)
	r.lettingGo(ctx, bl)
	return ctrl.Result{}, nil
}

// lettingGo is the last of a BerthLease in this cluster, once nothing of it
// runs or is held: its gauges go, and so do the marks on its workloads.
func (r *BerthLeaseReconciler) lettingGo(ctx context.Context, bl *berthv1alpha1.BerthLease) {
	leaseHeld.DeleteLabelValues(r.ClusterIdentity, bl.Namespace, bl.Name)
	deadlineRemaining.DeleteLabelValues(r.ClusterIdentity, bl.Namespace, bl.Name)
	if err := r.clearMarks(ctx, bl); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "cannot clear the marks of the managed workloads")
	}
}

// goneOf is what is known of a BerthLease that is gone: the last seen
// object and its memory, or, when the agent never saw it (it restarted),
// a stand-in that knows only the name, with the shortest TTL, so that its
// Pods are stopped with the shortest grace period. Either is marked deleted.
func (r *BerthLeaseReconciler) goneOf(name types.NamespacedName) (*berthv1alpha1.BerthLease, *memory) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var found *memory
	for _, m := range r.memory {
		if m.name == name && m.last != nil && (found == nil || m.read().term != nil) {
			found = m
		}
	}
	if found != nil {
		return r.goneCopy(found.last), found
	}
	bl := r.goneCopy(&berthv1alpha1.BerthLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name},
		// PodFencing: whether its Pods ran under berth-fence is not known, so its
		// term is given up as a fenced one is (fencedTerm), never sooner.
		Spec: berthv1alpha1.BerthLeaseSpec{TTLSeconds: minTTLSeconds, HeartbeatIntervalSeconds: 1, PodFencing: berthv1alpha1.PodFencingExec},
	})
	return bl, &memory{name: name, key: leaseapi.Key{Namespace: name.Namespace, Name: name.Name}.String(), tenure: tenure{started: true}}
}

// goneCopy is bl as a BerthLease that is gone is decided on: marked deleted.
func (r *BerthLeaseReconciler) goneCopy(bl *berthv1alpha1.BerthLease) *berthv1alpha1.BerthLease {
	gone := bl.DeepCopy()
	now := metav1.NewTime(r.Clock.Now())
	gone.DeletionTimestamp = &now
	return gone
}

// result schedules the next look: at the decision's wake-up, or, while
// waiting for another holder's lease, when that lease could next be free.
// A term the renewer renews needs none: the renewer wakes the BerthLease
// when there is news of it or its deadline passes.
func (r *BerthLeaseReconciler) result(p *observation, mem *memory, d Decision) ctrl.Result {
	now := r.Clock.Now()
	wake := d.Wake
	switch {
	case !wake.IsZero():
	case p.facts.MayRun() && p.facts.BatchRenewed && !p.handedOver:
		// The renewer stopped (or the lease API refused batches) after
		// the facts were taken: the next reconcile renews the term.
		wake = earliest(p.facts.Term.RenewDue, p.facts.Term.Deadline)
	case p.facts.MayRun() && p.facts.BatchRenewed && p.facts.PodsUnknown:
		// The Pods could not be listed: gated ones may wait unseen, and no
		// event need come to bring them back.
		wake = now.Add(p.heartbeat)
	case p.facts.MayRun() && p.facts.BatchRenewed:
	case !p.facts.mustYield() && p.facts.Term == nil:
		wake = now.Add(r.waitInterval(p, mem.read()))
	case p.facts.Shadowed && !p.facts.Deleting:
		// No event says when the older BerthLease is gone for good.
		wake = now.Add(p.heartbeat)
	case !p.facts.Deleting:
		// Cordoned or invalid: a membership change or an edit wakes the
		// BerthLease; this is the backstop if that wake-up is lost.
		wake = now.Add(3 * p.heartbeat)
	}
	if wake.IsZero() {
		return ctrl.Result{}
	}
	return ctrl.Result{RequeueAfter: max(wake.Sub(now), 10*time.Millisecond)}
}

// waitInterval is how long a waiting cluster waits before trying again.
// While the change stream is connected, it tells when the lease changes,
// and the wait is only a backstop. Without it: a heartbeat, or less when
// the holder's term ends sooner, so that a takeover follows an expiry
// closely.
func (r *BerthLeaseReconciler) waitInterval(p *observation, t tenure) time.Duration {
	wait := p.heartbeat
	switch {
	case t.apiErr != nil:
		return retryInterval(p.heartbeat)
	case r.changes.up.Load() && t.observed.Holder != "" && t.observed.Holder != p.holder:
		return waitBackstop()
	}
	if exp := t.observed.ExpiresAt; !exp.IsZero() && t.observed.Holder != "" {
		// Wall clocks of two machines: good enough to schedule a retry,
		// never used to decide anything.
		until := time.Until(exp) + 50*time.Millisecond
		wait = min(wait, max(until, 50*time.Millisecond))
	}
	if end := t.observed.ReservedUntil; !end.IsZero() && t.observed.Holder == "" {
		// Free but reserved for another cluster (a move): ask again when
		// the reservation runs out, if nothing wakes it sooner (the
		// destination's new term, or the sweep's clearing write, comes
		// through the change stream).
		wait = min(wait, max(time.Until(end)+50*time.Millisecond, 50*time.Millisecond))
	}
	return wait
}

func (r *BerthLeaseReconciler) memoryOf(bl *berthv1alpha1.BerthLease) *memory {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.memory[bl.UID]
	if !ok {
		m = &memory{name: ctrlclient.ObjectKeyFromObject(bl), key: leaseapi.Key{Namespace: bl.Namespace, Name: bl.EffectiveLeaseName()}.String()}
		// An earlier BerthLease of this name is gone (made anew without its
		// finalizer having run). A term it held for the same lease is this
		// one's to carry on, with its deadline, so that it is renewed while
		// the earlier one's Pods (strays) stop. A term it held for another
		// lease stays in its memory, superseded, and is settled as a
		// vanished BerthLease's (settleSuperseded).
		for uid, old := range r.memory {
			if old.name != m.name {
				continue
			}
			if t := old.read(); t.holds() {
				if old.last != nil && old.last.EffectiveLeaseName() != bl.EffectiveLeaseName() {
					old.superseded = true
					old.mu.Lock()
					old.batch, old.waiting = nil, nil
					old.mu.Unlock()
					continue
				}
				m.tenure = t.carriedOver()
				m.fencedToken.Store(old.fencedToken.Load())
			}
			r.dropLocked(uid)
		}
		r.memory[bl.UID] = m
		r.index(m, true)
	}
	m.last = bl.DeepCopy()
	return m
}

// forgetName forgets every BerthLease of that name, whatever its UID.
func (r *BerthLeaseReconciler) forgetName(name types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, m := range r.memory {
		if m.name == name {
			r.dropLocked(uid)
		}
	}
}

func (r *BerthLeaseReconciler) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropLocked(uid)
}

// dropLocked forgets one BerthLease; r.mu is held. The renewer no longer
// sees its term.
func (r *BerthLeaseReconciler) dropLocked(uid types.UID) {
	if m, ok := r.memory[uid]; ok {
		r.index(m, false)
	}
	delete(r.memory, uid)
}

// batchSpecFor is how the renewer renews bl's term after this reconcile:
// while the decision is to run its Pods and renewals go in batches, nil
// otherwise (the reconcile renews the term itself while it stops, and the
// renewer no longer sees it).
func (r *BerthLeaseReconciler) batchSpecFor(bl *berthv1alpha1.BerthLease, p *observation, mem *memory, d Decision) *batchSpec {
	if !p.facts.BatchRenewed || d.Phase != PhaseActive || p.facts.Term == nil || mem.gone || mem.superseded {
		return nil
	}
	return p.batchSpec(bl.Namespace, bl.EffectiveLeaseName())
}

// holder is the identity this agent acts as for bl.
func (r *BerthLeaseReconciler) holder(bl *berthv1alpha1.BerthLease) string {
	if r.ClusterIdentity != "" {
		return r.ClusterIdentity
	}
	return bl.Spec.HolderIdentity
}
