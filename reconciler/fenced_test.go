package reconciler

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
)

// The fenced-term tests run agents (reconcilers with their own memory, as a
// process has) against a fake cluster and a real lease API, and judge by
// whether another cluster could take the lease at once.

// countingLeases counts the calls that give a term up.
type countingLeases struct {
	*leaseclient.Client
	releases, revokes atomic.Int32
}

func (c *countingLeases) Release(ctx context.Context, ns, n, h string, tok int32) error {
	c.releases.Add(1)
	return c.Client.Release(ctx, ns, n, h, tok)
}

func (c *countingLeases) Revoke(ctx context.Context, ns, n, h string, tok int32) error {
	c.revokes.Add(1)
	return c.Client.Revoke(ctx, ns, n, h, tok)
}

type fencedRig struct {
	t      *testing.T
	c      ctrlclient.WithWatch
	leases *countingLeases
	clk    *clocktesting.FakeClock
	logs   *strings.Builder
	cordon atomic.Bool
}

func newFencedRig(t *testing.T, objs ...ctrlclient.Object) *fencedRig {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, berthv1alpha1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&berthv1alpha1.BerthLease{}).
		WithIndex(&berthv1alpha1.BerthLease{}, IndexLeaseName, func(o ctrlclient.Object) []string {
			return []string{o.(*berthv1alpha1.BerthLease).EffectiveLeaseName()}
		}).Build()
	srv := leaseapitest.Start(t, leaseapitest.Options{})
	return &fencedRig{t: t, c: c, leases: &countingLeases{Client: srv.Client(t, leaseclient.Config{Timeout: 2 * time.Second})},
		clk: clocktesting.NewFakeClock(time.Now()), logs: &strings.Builder{}}
}

// agent is a fresh agent process of cluster us: an empty memory.
func (g *fencedRig) agent() *BerthLeaseReconciler {
	r := &BerthLeaseReconciler{Client: g.c, APIReader: g.c, LeaseClient: g.leases, ClusterIdentity: us, ManagedWorkloads: true, Clock: g.clk,
		Log:  funcr.New(func(prefix, args string) { g.logs.WriteString(prefix + " " + args + "\n") }, funcr.Options{}),
		Wake: func(context.Context, types.NamespacedName) {},
		Membership: func() (string, string) {
			if g.cordon.Load() {
				return "Cordoned", "cordoned by the test"
			}
			return "", ""
		}}
	r.defaults()
	return r
}

func (g *fencedRig) reconcile(r *BerthLeaseReconciler, n int) {
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "payments", Name: "exporter"}}
	for range n {
		if _, err := r.Reconcile(g.t.Context(), req); err != nil {
			g.t.Logf("reconcile: %v", err)
		}
		g.clk.Step(200 * time.Millisecond)
	}
}

func (g *fencedRig) berthLease() *berthv1alpha1.BerthLease {
	bl := &berthv1alpha1.BerthLease{}
	if err := g.c.Get(g.t.Context(), types.NamespacedName{Namespace: "payments", Name: "exporter"}, bl); err != nil {
		g.t.Fatal(err)
	}
	return bl
}

// checkNotFreed fails when another cluster can take the lease at once: the
// fenced term was freed instead of kept to its expiry.
func (g *fencedRig) checkNotFreed() {
	g.t.Helper()
	res, err := g.leases.Acquire(g.t.Context(), "payments", "exporter", "cluster-west", 30*time.Second)
	if err != nil {
		g.t.Fatal(err)
	}
	if res.Acquired {
		g.t.Errorf("another cluster took the lease at once (token %d): the fenced term was freed (releases %d, revocations %d)",
			res.FencingToken, g.leases.releases.Load(), g.leases.revokes.Load())
	}
}

func berthLeaseFenced(uid types.UID, f berthv1alpha1.PodFencing) *berthv1alpha1.BerthLease {
	return &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "exporter", UID: uid, Finalizers: []string{FinalizerName}},
		Spec: berthv1alpha1.BerthLeaseSpec{TTLSeconds: 30, HeartbeatIntervalSeconds: 10, PodFencing: f}}
}

// TestFencedTermSurvivesASwitchAndARestart: podFencing switched off while
// fenced Pods run (they stay fenced), then the agent restarts, then the
// BerthLease is deleted: the new process knows the term as fenced from status
// and does not free it.
func TestFencedTermSurvivesASwitchAndARestart(t *testing.T) {
	g := newFencedRig(t, berthLeaseFenced("uid-1", berthv1alpha1.PodFencingExec), managedPod("a", "uid-1"))
	g.reconcile(g.agent(), 3)
	bl := g.berthLease()
	if bl.Status.FencedToken != 1 {
		t.Fatalf("status.fencedToken %d after ungating under token 1", bl.Status.FencedToken)
	}
	bl.Spec.PodFencing = berthv1alpha1.PodFencingNone
	if err := g.c.Update(t.Context(), bl); err != nil {
		t.Fatal(err)
	}
	restarted := g.agent()
	g.reconcile(restarted, 3)
	if err := g.c.Delete(t.Context(), g.berthLease()); err != nil {
		t.Fatal(err)
	}
	g.reconcile(restarted, 10)
	g.checkNotFreed()
}

// TestFencedTermSurvivesARecreation: the BerthLease is made anew without
// podFencing (a GitOps prune and sync) while its fenced Pod runs: the term
// carried over to the new one stays fenced.
func TestFencedTermSurvivesARecreation(t *testing.T) {
	g := newFencedRig(t, berthLeaseFenced("uid-1", berthv1alpha1.PodFencingExec), managedPod("a", "uid-1"))
	r := g.agent()
	g.reconcile(r, 3)
	old := g.berthLease()
	old.Finalizers = nil
	if err := g.c.Update(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	if err := g.c.Delete(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	anew := berthLeaseFenced("uid-2", berthv1alpha1.PodFencingNone)
	if err := g.c.Create(t.Context(), anew); err != nil {
		t.Fatal(err)
	}
	g.reconcile(r, 5)
	if err := g.c.Delete(t.Context(), g.berthLease()); err != nil {
		t.Fatal(err)
	}
	g.reconcile(r, 10)
	g.checkNotFreed()
}

// TestOwnRevokedTermIsWaitedOut: a cordon makes the agent give its fenced
// term up by revoking it; uncordoned at once, it finds that term still held
// by itself, revoked, until its expiry. It waits it out, without revoking it
// again on every look.
func TestOwnRevokedTermIsWaitedOut(t *testing.T) {
	g := newFencedRig(t, berthLeaseFenced("uid-1", berthv1alpha1.PodFencingExec), managedPod("a", "uid-1"))
	r := g.agent()
	g.reconcile(r, 3)
	g.cordon.Store(true)
	g.reconcile(r, 5)
	if g.leases.revokes.Load() != 1 || g.leases.releases.Load() != 0 {
		t.Fatalf("after the cordon: %d revocations, %d releases; want the fenced term revoked once", g.leases.revokes.Load(), g.leases.releases.Load())
	}
	g.checkNotFreed()
	g.cordon.Store(false)
	if err := g.c.Create(t.Context(), managedPod("b", "uid-1")); err != nil {
		t.Fatal(err)
	}
	g.reconcile(r, 50)
	if n := g.leases.revokes.Load(); n != 1 {
		t.Errorf("%d revocations after the uncordon, want none more: the agent handed its own given-up term over again", n-1)
	}
	if n := strings.Count(g.logs.String(), "lease revoked: stopping the Pods"); n > 0 {
		t.Errorf("logged its own given-up term as revoked %d times", n)
	}
	b := &corev1.Pod{}
	if err := g.c.Get(t.Context(), types.NamespacedName{Namespace: "payments", Name: "b"}, b); err != nil || !gated(b) {
		t.Errorf("Pod b ungated (%v) while the given-up term was not yet expired", err)
	}
}
