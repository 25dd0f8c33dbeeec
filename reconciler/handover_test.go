package reconciler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// grantingLeases grants every acquire and renewal, counting renewals,
// releases and revocations.
type grantingLeases struct {
	token             int32
	renewals          atomic.Int32
	releases, revokes atomic.Int32
}

func (g *grantingLeases) Acquire(_ context.Context, _, _, holder string, _ time.Duration) (leaseclient.AcquireResult, error) {
	return leaseclient.AcquireResult{Acquired: true, Holder: holder, FencingToken: g.token}, nil
}
func (g *grantingLeases) Renew(_ context.Context, _, _, holder string, tok int32, _ time.Duration) (leaseclient.AcquireResult, error) {
	g.renewals.Add(1)
	return leaseclient.AcquireResult{Acquired: true, Holder: holder, FencingToken: tok}, nil
}
func (g *grantingLeases) Release(context.Context, string, string, string, int32) error {
	g.releases.Add(1)
	return nil
}
func (g *grantingLeases) Revoke(context.Context, string, string, string, int32) error {
	g.revokes.Add(1)
	return nil
}
func (g *grantingLeases) RenewBatch(_ context.Context, holder string, rn []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
	g.renewals.Add(int32(len(rn)))
	out := make([]leaseclient.AcquireResult, len(rn))
	for i, r := range rn {
		out[i] = leaseclient.AcquireResult{Acquired: true, Holder: holder, FencingToken: r.FencingToken}
	}
	return out, nil
}

func managedPod(name string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: name, Labels: map[string]string{ManagedLease: "exporter", ManagedUID: string(uid)}},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: SchedulingGate}},
			Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
}

// TestFailedReconcileStillHandsTheTermOver: a reconcile that decides to run
// the Pods but fails after settle (here: one Pod's ungate refused) has
// handed the term to the renewer already, so it is renewed while the
// retries fail, and the Pod that runs is not stopped.
func TestFailedReconcileStillHandsTheTermOver(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = berthv1alpha1.AddToScheme(scheme)
	uid := types.UID("uid-exporter")
	bl := &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "exporter", UID: uid, Finalizers: []string{FinalizerName}},
		Spec: berthv1alpha1.BerthLeaseSpec{TTLSeconds: 30, HeartbeatIntervalSeconds: 10}}
	var deleted []string
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(bl, managedPod("a", uid), managedPod("b", uid)).
		WithStatusSubresource(&berthv1alpha1.BerthLease{}).
		WithIndex(&berthv1alpha1.BerthLease{}, IndexLeaseName, func(o ctrlclient.Object) []string {
			return []string{o.(*berthv1alpha1.BerthLease).EffectiveLeaseName()}
		}).
		WithInterceptorFuncs(interceptor.Funcs{Delete: func(ctx context.Context, cl ctrlclient.WithWatch, obj ctrlclient.Object, opts ...ctrlclient.DeleteOption) error {
			deleted = append(deleted, obj.GetName())
			return cl.Delete(ctx, obj, opts...)
		}, Update: func(ctx context.Context, cl ctrlclient.WithWatch, obj ctrlclient.Object, opts ...ctrlclient.UpdateOption) error {
			if p, ok := obj.(*corev1.Pod); ok && p.Name == "b" {
				return apierrors.NewInternalError(errors.New("admission webhook \"x\" timed out"))
			}
			return cl.Update(ctx, obj, opts...)
		}}).Build()
	leases := &grantingLeases{token: 4}
	clk := clocktesting.NewFakeClock(time.Now())
	r := &BerthLeaseReconciler{Client: c, LeaseClient: leases, ClusterIdentity: us, ManagedWorkloads: true, Clock: clk,
		Wake: func(context.Context, types.NamespacedName) {}}
	r.defaults()
	r.renewals.running.Store(true)
	r.renewals.running.Store(true) // the renewer runs (its loop is driven below)
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "payments", Name: "exporter"}}
	_ = schema.GroupVersion{}
	firstStop := 0
	defer func() { t.Logf("first stop of a running Pod at %d s", firstStop) }()
	for i := 0; i < 60; i++ { // controller-runtime retries every <=500 ms; step 1 s
		_, err := r.Reconcile(t.Context(), req)
		if i == 0 && err == nil {
			t.Fatalf("expected the reconcile to fail at the ungate of Pod b")
		}
		r.renewDue(t.Context(), leases, r.Log) // the renewer's loop
		if n := len(deleted); n > 0 && firstStop == 0 {
			firstStop = i
		}
		clk.Step(time.Second)
	}
	t.Logf("Pods deleted (stopped) by the agent: %v", deleted)
	a := &corev1.Pod{}
	_ = c.Get(t.Context(), types.NamespacedName{Namespace: "payments", Name: "a"}, a)
	mem := r.memory[uid]
	tn := mem.read()
	t.Logf("renewals sent in 60 s: %d; Pod a gated=%v; selfFenced=%v; batch handed over=%v", leases.renewals.Load(), gated(a), tn.selfFenced, mem.batch != nil)
	if len(deleted) > 0 {
		t.Errorf("the running Pod a was stopped at %d s: its term was never renewed before its local deadline (every failing reconcile skipped the renewal, BatchRenewed, and never handed the term over)", firstStop)
	}
}

// TestFencedTermIsRevokedNotReleased: a BerthLease deleted on the holder
// stops its Pods, then gives its term up. Unfenced, by a release, which frees
// the term at once; fenced (spec.podFencing Exec), by revoking its own term,
// so that the lease API grants it to no one before its expiry: a Pod gone
// from the API server (forced away from a partitioned node) may still run
// there under berth-fence until its deadline, which precedes the expiry.
func TestFencedTermIsRevokedNotReleased(t *testing.T) {
	for name, tc := range map[string]struct {
		fencing berthv1alpha1.PodFencing
		// podFenced: the Pod runs under berth-fence (made while the spec asked
		// it); statusFenced: status records the term as fenced (an agent that
		// starts anew).
		podFenced, statusFenced   bool
		wantReleases, wantRevokes int32
	}{
		"unfenced: released": {fencing: berthv1alpha1.PodFencingNone, wantReleases: 1},
		"fenced: revoked":    {fencing: berthv1alpha1.PodFencingExec, wantRevokes: 1},
		"podFencing switched off, its Pod still fenced: revoked": {
			fencing: berthv1alpha1.PodFencingNone, podFenced: true, wantRevokes: 1},
		"podFencing switched off, the term recorded fenced, no Pod left to show it: revoked": {
			fencing: berthv1alpha1.PodFencingNone, statusFenced: true, wantRevokes: 1},
	} {
		t.Run(name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = corev1.AddToScheme(scheme)
			_ = berthv1alpha1.AddToScheme(scheme)
			_ = appsv1.AddToScheme(scheme)
			_ = batchv1.AddToScheme(scheme)
			uid := types.UID("uid-exporter")
			bl := &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "exporter", UID: uid, Finalizers: []string{FinalizerName}},
				Spec: berthv1alpha1.BerthLeaseSpec{TTLSeconds: 30, HeartbeatIntervalSeconds: 10, PodFencing: tc.fencing}}
			pod := managedPod("a", uid)
			if tc.podFenced {
				pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: FenceVolume})
			}
			c := fake.NewClientBuilder().WithScheme(scheme).
				WithObjects(bl, pod).
				WithStatusSubresource(&berthv1alpha1.BerthLease{}).
				WithIndex(&berthv1alpha1.BerthLease{}, IndexLeaseName, func(o ctrlclient.Object) []string {
					return []string{o.(*berthv1alpha1.BerthLease).EffectiveLeaseName()}
				}).Build()
			leases := &grantingLeases{token: 4}
			clk := clocktesting.NewFakeClock(time.Now())
			r := &BerthLeaseReconciler{Client: c, LeaseClient: leases, ClusterIdentity: us, ManagedWorkloads: true, Clock: clk,
				Wake: func(context.Context, types.NamespacedName) {}}
			r.defaults()
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "payments", Name: "exporter"}}
			reconcile := func() {
				if _, err := r.Reconcile(t.Context(), req); err != nil {
					t.Logf("reconcile: %v", err)
				}
			}
			reconcile()
			if a := (&corev1.Pod{}); c.Get(t.Context(), types.NamespacedName{Namespace: "payments", Name: "a"}, a) != nil || gated(a) {
				t.Fatalf("Pod a not ungated under the term")
			}
			if got := r.memory[uid].fencedToken.Load(); (got == 4) != (tc.fencing == berthv1alpha1.PodFencingExec || tc.podFenced) {
				t.Errorf("term recorded fenced with token %d, spec %s, Pod fenced %v", got, tc.fencing, tc.podFenced)
			}
			if err := c.Get(t.Context(), req.NamespacedName, bl); err != nil {
				t.Fatal(err)
			}
			if got := bl.Status.FencedToken; (got == 4) != (tc.fencing == berthv1alpha1.PodFencingExec || tc.podFenced) {
				t.Errorf("status.fencedToken %d, spec %s, Pod fenced %v", got, tc.fencing, tc.podFenced)
			}
			if tc.statusFenced {
				// The agent starts anew: its memory is gone, status remains.
				if err := c.Get(t.Context(), req.NamespacedName, bl); err != nil {
					t.Fatal(err)
				}
				bl.Status.FencedToken = 4
				if err := c.Status().Update(t.Context(), bl); err != nil {
					t.Fatal(err)
				}
				r.memory[uid].fencedToken.Store(0)
			}
			if err := c.Delete(t.Context(), bl); err != nil {
				t.Fatal(err)
			}
			for range 10 {
				reconcile()
				clk.Step(time.Second)
			}
			if got, want := [2]int32{leases.releases.Load(), leases.revokes.Load()}, [2]int32{tc.wantReleases, tc.wantRevokes}; got != want {
				t.Errorf("releases, revocations = %v, want %v", got, want)
			}
		})
	}
}
