package reconciler_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/poll"
)

const (
	namespace = "payments"
	leaseName = "exporter"
	ttl       = 9 // seconds
	heartbeat = 3 // seconds
)

var scheme = builders.Scheme

// faultyLeases passes calls to the real lease API client unless cut off,
// when every call hangs until its context ends, as against a partitioned
// or hung server.
type faultyLeases struct {
	reconciler.LeaseClient
	cut atomic.Bool
}

func (f *faultyLeases) hang(ctx context.Context) error {
	<-ctx.Done()
	return fmt.Errorf("lease API unreachable (injected): %w", ctx.Err())
}

func (f *faultyLeases) Acquire(ctx context.Context, ns, name, holder string, ttl time.Duration) (leaseclient.AcquireResult, error) {
	if f.cut.Load() {
		return leaseclient.AcquireResult{}, f.hang(ctx)
	}
	return f.LeaseClient.Acquire(ctx, ns, name, holder, ttl)
}

func (f *faultyLeases) Renew(ctx context.Context, ns, name, holder string, token int32, ttl time.Duration) (leaseclient.AcquireResult, error) {
	if f.cut.Load() {
		return leaseclient.AcquireResult{}, f.hang(ctx)
	}
	return f.LeaseClient.Renew(ctx, ns, name, holder, token, ttl)
}

func (f *faultyLeases) RenewBatch(ctx context.Context, holder string, renewals []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
	if f.cut.Load() {
		return nil, f.hang(ctx)
	}
	return f.LeaseClient.(reconciler.BatchRenewer).RenewBatch(ctx, holder, renewals)
}

func (f *faultyLeases) GetLease(ctx context.Context, ns, name string) (leaseapi.Lease, error) {
	if f.cut.Load() {
		return leaseapi.Lease{}, f.hang(ctx)
	}
	return f.LeaseClient.(reconciler.LeaseReader).GetLease(ctx, ns, name)
}

// WatchLeases passes the change stream through: a cut fails the calls
// that decide, not the news of changes.
func (f *faultyLeases) WatchLeases(ctx context.Context, namespaces []string, handle func(leaseclient.LeaseEvent), connected func(bool)) error {
	return f.LeaseClient.(reconciler.LeaseStreamer).WatchLeases(ctx, namespaces, handle, connected)
}

func (f *faultyLeases) Release(ctx context.Context, ns, name, holder string, token int32) error {
	if f.cut.Load() {
		return f.hang(ctx)
	}
	return f.LeaseClient.Release(ctx, ns, name, holder, token)
}

func (f *faultyLeases) Revoke(ctx context.Context, ns, name, holder string, token int32) error {
	if f.cut.Load() {
		return f.hang(ctx)
	}
	return f.LeaseClient.Revoke(ctx, ns, name, holder, token)
}

// member is one cluster of the test fleet with its agent.
type member struct {
	name   string
	client ctrlclient.Client
	leases *faultyLeases
}

// startMember installs the CRD in the cluster and runs an agent for it.
func startMember(t *testing.T, c *kubeenv.Cluster, leases reconciler.LeaseClient) *member {
	t.Helper()
	cfg := c.RESTConfig()
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("..", "deploy", "crd")}, Scheme: scheme}); err != nil {
		t.Fatalf("%s: install CRDs: %v", c.Name, err)
	}
	managed, err := labels.Parse(reconciler.ManagedLease)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 testr.NewWithOptions(t, testr.Options{Verbosity: 1}).WithValues("cluster", c.Name),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:                  cache.Options{ByObject: map[ctrlclient.Object]cache.ByObject{&corev1.Pod{}: {Label: managed}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The test reads and writes without the manager's cache, so that what it
	// judges is the API server's state, not an informer's lagging copy.
	direct, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{name: c.Name, client: direct, leases: &faultyLeases{LeaseClient: leases}}
	r := &reconciler.BerthLeaseReconciler{
		Log:              mgr.GetLogger().WithName("berthlease"),
		LeaseClient:      m.leases,
		ClusterIdentity:  c.Name,
		ManagedWorkloads: true,
		CallTimeout:      2 * time.Second,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("%s: manager: %v", c.Name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

// applyWorkload creates the BerthLease and a Deployment of managed Pods, as
// GitOps would in every cluster. Admission is not part of this test, so the
// Pod template carries the gate and the UID label itself.
func (m *member) applyWorkload(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if err := m.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	bl := builders.BerthLease(namespace, leaseName).TTL(ttl).Heartbeat(heartbeat).Obj()
	if err := m.client.Create(ctx, bl); err != nil {
		t.Fatalf("%s: create BerthLease: %v", m.name, err)
	}
	deploy := builders.Deployment(namespace, leaseName).ManagedBy(leaseName).ManagedUID(bl.UID).Gated().Replicas(2).Obj()
	if err := m.client.Create(ctx, deploy); err != nil {
		t.Fatalf("%s: create Deployment: %v", m.name, err)
	}
}

// podState is what one look at a cluster's managed Pods saw.
type podState struct {
	ungated int // ungated Pods that exist (running or terminating)
	running int // ungated Pods reported Running
	gated   int
	tokens  []int32
}

func (m *member) pods(ctx context.Context) (podState, error) {
	var s podState
	list := &corev1.PodList{}
	if err := m.client.List(ctx, list, ctrlclient.InNamespace(namespace), ctrlclient.MatchingLabels{reconciler.ManagedLease: leaseName}); err != nil {
		return s, err
	}
	for _, p := range list.Items {
		if slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == reconciler.SchedulingGate }) {
			s.gated++
			continue
		}
		s.ungated++
		if p.Status.Phase == corev1.PodRunning {
			s.running++
		}
		if tok, err := strconv.ParseInt(p.Annotations[reconciler.AnnotationFencingToken], 10, 32); err == nil {
			s.tokens = append(s.tokens, int32(tok))
		}
	}
	return s, nil
}

// runner returns the one member running both replicas, or nil.
func runner(t *testing.T, members []*member) *member {
	var found *member
	for _, m := range members {
		s, err := m.pods(t.Context())
		if err != nil {
			return nil
		}
		if s.running == 2 && s.ungated == 2 {
			if found != nil {
				return nil
			}
			found = m
		}
	}
	return found
}

func status(t *testing.T, m *member) berthv1alpha1.BerthLeaseStatus {
	bl := &berthv1alpha1.BerthLease{}
	if err := m.client.Get(t.Context(), ctrlclient.ObjectKey{Namespace: namespace, Name: leaseName}, bl); err != nil {
		return berthv1alpha1.BerthLeaseStatus{}
	}
	return bl.Status
}

func TestTwoClustersOneLease(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 2})
	leases := leaseapitest.Start(t, leaseapitest.Options{}).Client(t, leaseclient.Config{Timeout: 2 * time.Second})
	var members []*member
	for _, c := range env.Clusters {
		members = append(members, startMember(t, c, leases))
	}
	for _, m := range members {
		m.applyWorkload(t)
	}
	readers := map[string]ctrlclient.Reader{}
	for _, m := range members {
		readers[m.name] = m.client
	}
	rec := history.Start(readers, namespace, leaseName, 100*time.Millisecond)
	defer rec.Stop()

	// 1. Both race for the lease: exactly one runs, the other stays gated.
	var holder *member
	took := poll.For(t, 60*time.Second, "one cluster runs the workload", func() bool {
		holder = runner(t, members)
		return holder != nil
	})
	t.Logf("%s runs the workload %s after the race began", holder.name, took.Round(time.Millisecond))
	other := members[0]
	if other == holder {
		other = members[1]
	}
	poll.For(t, 20*time.Second, "the waiting cluster reports held-by-other", func() bool {
		c := apimeta.FindStatusCondition(status(t, other).Conditions, reconciler.ConditionAcquired)
		return c != nil && c.Reason == reconciler.ReasonHeldByOther
	})
	poll.For(t, 20*time.Second, "the waiting cluster's two Pods are gated", func() bool {
		s, err := other.pods(t.Context())
		return err == nil && s.gated == 2 && s.ungated == 0
	})
	// The status counts Running Pods when it is written; it catches up with
	// the kubelet's report on the next reconcile, so it is awaited, not read once.
	poll.For(t, 20*time.Second, "the holder's status reports held, Active, 2 running", func() bool {
		st := status(t, holder)
		return st.LeaseState == reconciler.StateHeld && st.Phase == reconciler.PhaseActive && st.RunningPods == 2
	})
	time.Sleep(2 * heartbeat * time.Second) // it stays that way over renewals
	if runner(t, members) != holder {
		t.Fatalf("the workload moved away from %s without a fault", holder.name)
	}

	// 2. The holder is cut off from the lease API: it stops its Pods before
	// its TTL runs out, then the other cluster takes over.
	cutAt := time.Now()
	holder.leases.cut.Store(true)
	// Whether it stopped in time is judged by the history (no other cluster
	// runs before the lease expires); this wait only needs to end.
	stopped := poll.For(t, (ttl+5)*time.Second, "the cut-off holder stops its Pods", func() bool {
		s, err := holder.pods(t.Context())
		return err == nil && s.ungated == 0
	})
	t.Logf("%s stopped its Pods %s after it was cut off (TTL %ds)", holder.name, stopped.Round(time.Millisecond), ttl)
	poll.For(t, 10*time.Second, "the cut-off holder reports HeartbeatHealthy False", func() bool {
		c := apimeta.FindStatusCondition(status(t, holder).Conditions, reconciler.ConditionHeartbeatHealthy)
		return c != nil && c.Status == metav1.ConditionFalse
	})
	poll.For(t, 30*time.Second, "the other cluster takes over", func() bool { return runner(t, members) == other })
	t.Logf("%s took over %s after the holder was cut off", other.name, time.Since(cutAt).Round(time.Millisecond))

	// The old holder comes back: it finds the lease lost and stays gated.
	holder.leases.cut.Store(false)
	poll.For(t, 20*time.Second, "the old holder sees the lease held by the other", func() bool {
		st := status(t, holder)
		return st.LeaseState == reconciler.StateWaiting && st.CurrentHolder == other.name
	})
	poll.For(t, 20*time.Second, "the old holder's Pods come back gated", func() bool {
		s, err := holder.pods(t.Context())
		return err == nil && s.gated == 2 && s.ungated == 0
	})

	// 3. The BerthLease is deleted in the new holder: it stops its Pods,
	// releases, lets the object go, and the first cluster takes over.
	bl := &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: leaseName}}
	deletedAt := time.Now()
	if err := other.client.Delete(t.Context(), bl); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, "the deleted BerthLease is gone", func() bool {
		err := other.client.Get(t.Context(), ctrlclient.ObjectKeyFromObject(bl), &berthv1alpha1.BerthLease{})
		return apierrors.IsNotFound(err)
	})
	if s, _ := other.pods(t.Context()); s.ungated != 0 {
		t.Errorf("%s: %d ungated Pods after its BerthLease was deleted", other.name, s.ungated)
	}
	poll.For(t, 30*time.Second, "the first cluster takes over after the release", func() bool { return runner(t, members) == holder })
	t.Logf("%s took over %s after the BerthLease was deleted in %s", holder.name, time.Since(deletedAt).Round(time.Millisecond), other.name)

	// Tokens on ungated Pods strictly increase across the takeovers, and no
	// two clusters ever had ungated Pods at once.
	poll.For(t, 10*time.Second, "the recorder sees the third term", func() bool { return len(rec.Snapshot().Terms()) >= 3 })
	h := rec.Stop()
	for _, term := range h.Terms() {
		t.Logf("term: %s token %d", term.Cluster, term.Token)
	}
	if err := h.Check(); err != nil {
		t.Error(err)
	}
}
