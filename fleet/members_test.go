package fleet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/poll"
)

// These tests drive Members as the controller would, on an injected clock:
// each cluster is a fake Kubernetes client, the lease API is the real
// service on SQLite, and faultyClient injects one failure at a time. The
// end-to-end suites (test/e2e/fleetmode_test.go) run the same paths with
// the real binaries on real clusters.

var (
	blKey = types.NamespacedName{Namespace: "payments", Name: "exporter"}
	// hold is how far fake time moves between two reconciles of a test.
	hold = 100 * time.Millisecond
)

// faultyClient passes calls to the real lease API client, except the ones
// a test breaks.
type faultyClient struct {
	*leaseclient.Client
	// refuse answers registrations with a conflict: another cluster holds
	// the id.
	refuse atomic.Bool
	// failReleases fails every release with an error.
	failReleases atomic.Bool
	// releaseGate, when set, holds every release until it is closed.
	releaseGate chan struct{}
	releases    atomic.Int32
}

func (f *faultyClient) RegisterCluster(ctx context.Context, id string, reg leaseapi.ClusterRegistration) (leaseapi.ClusterRegistrationResponse, error) {
	if f.refuse.Load() {
		return leaseapi.ClusterRegistrationResponse{}, leaseclient.ErrConflict
	}
	return f.Client.RegisterCluster(ctx, id, reg)
}

func (f *faultyClient) Release(ctx context.Context, ns, name, holder string, token int32) error {
	f.releases.Add(1)
	if f.releaseGate != nil {
		select {
		case <-f.releaseGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.failReleases.Load() {
		return errors.New("lease API unreachable (injected)")
	}
	return f.Client.Release(ctx, ns, name, holder, token)
}

// testCluster is a member cluster: a fake API server behind the parts of
// cluster.Cluster that Members uses.
type testCluster struct {
	cluster.Cluster
	c ctrlclient.Client
}

func (c *testCluster) GetClient() ctrlclient.Client    { return c.c }
func (c *testCluster) GetAPIReader() ctrlclient.Reader { return c.c }
func (c *testCluster) GetEventRecorder(string) events.EventRecorder {
	return &events.FakeRecorder{}
}

// indexInto adds the reconciler's field indexes to a fake client builder.
type indexInto struct{ b *fake.ClientBuilder }

func (i indexInto) IndexField(_ context.Context, obj ctrlclient.Object, field string, fn ctrlclient.IndexerFunc) error {
	i.b.WithIndex(obj, field, fn)
	return nil
}

func newCluster(t *testing.T, name string) *testCluster {
	t.Helper()
	bl := builders.BerthLease(blKey.Namespace, blKey.Name).TTL(9).Heartbeat(3).Obj()
	bl.UID = types.UID("uid-" + name)
	b := fake.NewClientBuilder().WithScheme(builders.Scheme).
		WithStatusSubresource(&berthv1alpha1.BerthLease{}).
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: types.UID("fingerprint-" + name)}}, bl)
	if err := reconciler.IndexBerthLeases(t.Context(), indexInto{b}); err != nil {
		t.Fatal(err)
	}
	return &testCluster{c: b.Build()}
}

// fleetUnderTest is Members with the controller's part played by the test.
type fleetUnderTest struct {
	t       *testing.T
	members *Members
	clock   *clocktesting.FakeClock
	leases  map[string]*faultyClient
	api     *leaseclient.Client
}

func newFleet(t *testing.T) *fleetUnderTest {
	t.Helper()
	api := leaseapitest.Start(t, leaseapitest.Options{}).Client(t, leaseclient.Config{Timeout: 2 * time.Second})
	fc := clocktesting.NewFakeClock(time.Now())
	f := &fleetUnderTest{t: t, clock: fc, api: api, leases: map[string]*faultyClient{}}
	f.members = &Members{
		LeaseClient: func(id string) (LeaseClient, error) {
			return f.leases[id], nil
		},
		AgentVersion: "test",
		Clock:        fc,
		Log:          testr.New(t),
	}
	// What SetupWithManager does, without a manager.
	f.members.wakes = make(chan event.TypedGenericEvent[mcreconcile.Request], 64)
	f.members.members = map[multicluster.ClusterName]*member{}
	return f
}

// join engages a cluster for as long as the test runs (or until the
// returned cancel).
func (f *fleetUnderTest) join(name string) (*testCluster, context.CancelFunc) {
	f.t.Helper()
	f.leases[name] = &faultyClient{Client: f.api}
	cl := newCluster(f.t, name)
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	if err := f.members.Engage(ctx, multicluster.ClusterName(name), cl); err != nil {
		f.t.Fatalf("engage %s: %v", name, err)
	}
	return cl, cancel
}

// reconcile runs one reconcile of the BerthLease in a cluster, as the
// controller would, after moving fake time on.
func (f *fleetUnderTest) reconcile(name string) {
	f.t.Helper()
	f.clock.Step(hold)
	if _, err := f.members.Reconcile(f.t.Context(), mcreconcile.Request{ClusterName: multicluster.ClusterName(name), Request: reconcile.Request{NamespacedName: blKey}}); err != nil {
		f.t.Fatalf("reconcile %s: %v", name, err)
	}
}

// runController plays the controller while ctx lasts: every wake-up is
// reconciled. It returns when ctx ends.
func (f *fleetUnderTest) runController(ctx context.Context) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-f.members.wakes:
				_, _ = f.members.Reconcile(ctx, e.Object)
			}
		}
	})
	return &wg
}

// leave runs Leave as KubeconfigDir does, moving fake time on whenever Leave
// waits, and returns how much fake time it took.
func (f *fleetUnderTest) leave(name string) time.Duration {
	f.t.Helper()
	start := f.clock.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.members.Leave(f.t.Context(), multicluster.ClusterName(name))
	}()
	for {
		select {
		case <-done:
			return f.clock.Since(start)
		case <-time.After(time.Millisecond):
			if f.clock.HasWaiters() {
				f.clock.Step(handoverPoll)
			}
		}
	}
}

func (f *fleetUnderTest) status(cl *testCluster) berthv1alpha1.BerthLeaseStatus {
	f.t.Helper()
	bl := &berthv1alpha1.BerthLease{}
	if err := cl.c.Get(f.t.Context(), blKey, bl); err != nil {
		f.t.Fatal(err)
	}
	return bl.Status
}

func (f *fleetUnderTest) holder() string {
	f.t.Helper()
	l, err := f.api.GetLease(f.t.Context(), blKey.Namespace, blKey.Name)
	if errors.Is(err, leaseclient.ErrNotFound) {
		return "" // never held
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return l.Holder
}

func TestJoinRegistersAndCompetes(t *testing.T) {
	f := newFleet(t)
	east, _ := f.join("east")
	west, _ := f.join("west")
	for range 2 { // the first adds the finalizer
		f.reconcile("east")
		f.reconcile("west")
	}
	if got := f.holder(); got != "east" {
		t.Fatalf("lease holder = %q, want east (it asked first)", got)
	}
	if got := f.status(east).LeaseState; got != reconciler.StateHeld {
		t.Errorf("east's BerthLease is %q, want held", got)
	}
	if got := f.status(west).LeaseState; got != reconciler.StateWaiting {
		t.Errorf("west's BerthLease is %q, want waiting", got)
	}
	if err := f.members.Checker(nil); err != nil {
		t.Errorf("readiness with two registered members: %v", err)
	}
}

func TestRefusedRegistrationTakesNothing(t *testing.T) {
	f := newFleet(t)
	f.members.LeaseClient = func(id string) (LeaseClient, error) {
		c := &faultyClient{Client: f.api}
		c.refuse.Store(true)
		f.leases[id] = c
		return c, nil
	}
	cl := newCluster(t, "east")
	if err := f.members.Engage(t.Context(), "east", cl); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		f.reconcile("east")
	}
	if got := f.holder(); got != "" {
		t.Errorf("a cluster whose registration was refused acquired the lease: holder %q", got)
	}
	if err := f.members.Checker(nil); err == nil {
		t.Error("readiness passed although the member's registration is refused")
	}
}

func TestLeaveHandsOver(t *testing.T) {
	f := newFleet(t)
	east, _ := f.join("east")
	f.join("west")
	for range 2 {
		f.reconcile("east")
		f.reconcile("west")
	}
	ctx, cancel := context.WithCancel(t.Context())
	wg := f.runController(ctx)
	took := f.leave("east")
	cancel()
	wg.Wait()
	t.Logf("east handed over in %v of fake time", took)

	// West's long poll saw the release, so west may have taken over
	// already: the lease is free or west's.
	if got := f.holder(); got == "east" {
		t.Errorf("lease holder after east left = %q, want free or west", got)
	}
	if st := f.status(east); st.LeaseState == reconciler.StateHeld {
		t.Errorf("east's BerthLease still says held after the handover: %+v", st)
	}
	if took >= minLeaveTimeout {
		t.Errorf("Leave took %v: it waited for its timeout instead of the handover", took)
	}
	// A leaving cluster takes nothing, and the other takes over.
	f.reconcile("east")
	f.reconcile("west")
	if got := f.holder(); got != "west" {
		t.Errorf("lease holder after the handover = %q, want west", got)
	}
}

func TestLeaveWaitsForAReleaseInFlight(t *testing.T) {
	f := newFleet(t)
	f.join("east")
	for range 2 {
		f.reconcile("east")
	}
	gate := make(chan struct{})
	f.leases["east"].releaseGate = gate
	ctx, cancel := context.WithCancel(t.Context())
	wg := f.runController(ctx)
	defer func() { cancel(); wg.Wait() }()

	left := make(chan time.Duration)
	go func() { left <- f.leave("east") }()
	// Leave must still wait while the release hangs, however much fake
	// time passes.
	poll.For(t, 5*time.Second, "the leaving cluster sends its release", func() bool { return f.leases["east"].releases.Load() > 0 })
	select {
	case took := <-left:
		t.Fatalf("Leave returned after %v while the release was still in flight", took)
	case <-time.After(200 * time.Millisecond):
	}
	close(gate)
	took := <-left
	if got := f.holder(); got != "" {
		t.Errorf("lease holder after the release = %q, want free", got)
	}
	t.Logf("Leave returned %v of fake time after it began, once the release was through", took)
}

func TestLeaveGivesUpAfterItsTimeout(t *testing.T) {
	f := newFleet(t)
	f.join("east")
	for range 2 {
		f.reconcile("east")
	}
	f.leases["east"].failReleases.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	wg := f.runController(ctx)
	// Release failures retry on the reconcile's own requeue, which the
	// test's controller does not run: wake the BerthLease now and then.
	go func() {
		for ctx.Err() == nil {
			f.members.member("east").r.Wake(ctx, blKey)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	took := f.leave("east")
	cancel()
	wg.Wait()
	if took < minLeaveTimeout {
		t.Errorf("Leave returned after %v although the lease could not be released; want it to wait %v", took, minLeaveTimeout)
	}
	if took > minLeaveTimeout+time.Second {
		t.Errorf("Leave waited %v, past its timeout of %v", took, minLeaveTimeout)
	}
	if got := f.holder(); got != "east" {
		t.Errorf("lease holder = %q, want east still (its release failed; the term must not be given up by anyone else)", got)
	}
	if n := f.members.member("east").r.Holding(); n != 1 {
		t.Errorf("the leaving member's reconciler holds %d BerthLeases, want 1 (the release failed)", n)
	}
}

func TestRejoinReplacesTheMember(t *testing.T) {
	f := newFleet(t)
	f.join("east")
	first := f.members.member("east")
	f.join("east")
	second := f.members.member("east")
	if first == second {
		t.Fatal("engaging a cluster again kept the old member")
	}
	// The old member's engagement ended: once its goroutine notices, the
	// new member stays.
	time.Sleep(50 * time.Millisecond)
	if got := f.members.member("east"); got != second {
		t.Error("the replaced member's end removed its successor")
	}
}

func TestReconcileOfANonMemberIsDropped(t *testing.T) {
	f := newFleet(t)
	res, err := f.members.Reconcile(t.Context(), mcreconcile.Request{ClusterName: "gone", Request: reconcile.Request{NamespacedName: blKey}})
	if err != nil || res != (reconcile.Result{}) {
		t.Errorf("Reconcile for a cluster that is not a member = %+v, %v; want nothing done", res, err)
	}
}

func TestEndedEngagementLeavesTheMemberSet(t *testing.T) {
	f := newFleet(t)
	_, cancel := f.join("east")
	cancel()
	poll.For(t, 5*time.Second, "a cluster whose engagement ended leaves the member set", func() bool { return f.members.member("east") == nil })
}
