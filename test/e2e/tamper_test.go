package e2e

import (
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/admission"
	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// renamed is the BerthLease a rename makes beside the workload's: a new
// name with the old lease name.
const renamed = "exporter-v2"

// TestTamperedObjects walks what a user with rights over BerthLeases in the
// namespace (or a GitOps tool) can do to the objects, on the holder cluster:
// remove the finalizer, rename a BerthLease by making a second one with the
// same lease name, and delete a BerthLease whose finalizer an administrator
// forced off. Each of these once let two clusters run the workload at once;
// the history of both BerthLeases' Pods in every cluster judges that none
// does now. It also checks that the agent's rights over Leases end at its
// own namespace.
func TestTamperedObjects(t *testing.T) {
	r := startFleet(t)
	// Pods of the renamed BerthLease run the same workload under the same
	// lease: they count with the workload's.
	both := history.StartLeases(r.Readers(), workload.Namespace, []string{workload.Name, renamed}, sweepInterval)
	t.Cleanup(func() {
		if err := both.Stop().Check(); err != nil {
			t.Errorf("both BerthLeases' Pods: %v", err)
		}
	})
	holder, _ := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	m := r.Member(holder)
	ctx := t.Context()

	// The agent may write Leases for its election in its own namespace
	// only, never kube-node-lease's (node heartbeats) or kube-system's.
	agent, err := ctrlclient.New(m.Cluster.ConfigAs(admission.DefaultOperatorUser, "system:serviceaccounts", "system:serviceaccounts:berth-system"), ctrlclient.Options{Scheme: builders.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for ns, wantAllowed := range map[string]bool{"berth-system": true, "kube-node-lease": false, "kube-system": false} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "berth-rbac-probe"}}
		err := agent.Create(ctx, l, ctrlclient.DryRunAll)
		if allowed := err == nil; allowed != wantAllowed || (err != nil && !apierrors.IsForbidden(err)) {
			t.Errorf("the agent creating a Lease in %s: %v, want allowed %v", ns, err, wantAllowed)
		}
	}

	// Only the agent may remove a BerthLease's finalizer.
	bl := m.BerthLease(ctx)
	err = m.Client.Patch(ctx, &bl, ctrlclient.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "reserved to the Berth agent") {
		t.Fatalf("removing the finalizer as an administrator: %v, want forbidden by the policy", err)
	}
	// The lease a BerthLease names cannot change under a running workload;
	// spelling out the name it already names is no change.
	bl = m.BerthLease(ctx)
	setLeaseName := func(name string) error {
		return m.Client.Patch(ctx, &bl, ctrlclient.RawPatch(types.MergePatchType, []byte(`{"spec":{"leaseName":"`+name+`"}}`)))
	}
	if err := setLeaseName(bl.Name); err != nil {
		t.Fatalf("setting spec.leaseName to the lease it already names: %v", err)
	}
	if err := setLeaseName("elsewhere"); !apierrors.IsInvalid(err) {
		t.Fatalf("changing spec.leaseName: %v, want invalid", err)
	}

	// A rename: a second BerthLease names the same lease, then the first is
	// deleted. One lease key has one term: the newer waits while the older
	// exists, the older stops its Pods and lets go of the term without
	// releasing it, and the newer carries the term on in the same cluster.
	token := m.BerthLease(ctx).Status.FencingToken
	applyRenamed(t, m)
	poll.For(t, 20*time.Second, "the renamed BerthLease waits behind the older one", func() bool {
		c := apimeta.FindStatusCondition(berthLease(t, m, renamed).Status.Conditions, reconciler.ConditionAcquired)
		return c != nil && c.Reason == reconciler.ReasonLeaseNameInUse
	})
	r.stable(t, holder, ttl)
	old := m.BerthLease(ctx)
	if err := m.Client.Delete(ctx, &old); err != nil {
		t.Fatal(err)
	}
	took := poll.For(t, 30*time.Second, holder+" runs the renamed BerthLease's Pods", func() bool {
		return both.Snapshot().Runner(int(workload.Replicas)) == holder && ungated(t, m, renamed) == int(workload.Replicas)
	})
	st := berthLease(t, m, renamed).Status
	t.Logf("rename in %s: the renamed BerthLease runs %s after the old one was deleted, token %d (was %d)", holder, took.Round(time.Millisecond), st.FencingToken, token)
	if st.LeaseState != reconciler.StateHeld || st.CurrentHolder != holder {
		t.Errorf("the renamed BerthLease's status: %s held by %q, want held by %s", st.LeaseState, st.CurrentHolder, holder)
	}
	r.record(t, "rename: second BerthLease with the same lease name, first deleted", 0)

	// Back to the suite's workload: the renamed BerthLease goes, as a
	// GitOps tool reverting the rename would do.
	if err := m.Client.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: workload.Namespace, Name: renamed}}); err != nil {
		t.Fatal(err)
	}
	v2 := berthLease(t, m, renamed)
	if err := m.Client.Delete(ctx, &v2); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, "the renamed BerthLease is gone", func() bool { return berthLease(t, m, renamed).Name == "" })
	if err := m.ApplyWorkload(ctx); err != nil {
		t.Fatal(err)
	}
	holder, _ = r.runner(t, 60*time.Second, "one cluster runs the workload again")
	m = r.Member(holder)

	// An administrator forces the finalizer off (deleting the policy's
	// binding first) and deletes the BerthLease: the agent stops the Pods
	// of the BerthLease that is gone, releases, and only then may another
	// cluster run.
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := m.Client.Get(ctx, types.NamespacedName{Name: admission.FinalizerPolicyName}, binding); err != nil {
		t.Fatal(err)
	}
	if err := m.Client.Delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	bl = m.BerthLease(ctx)
	poll.For(t, 10*time.Second, "the finalizer is removed once the policy's binding is gone", func() bool {
		bl = m.BerthLease(ctx)
		return m.Client.Patch(ctx, &bl, ctrlclient.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`))) == nil
	})
	// Its kubelets are frozen first, so the Pods stay Terminating; and a
	// GitOps tool makes the BerthLease anew at once. The term the vanished
	// BerthLease held must be renewed until its Pods are gone.
	thaw := freezeKubelets(t, m)
	if err := m.Client.Delete(ctx, &bl); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// The agent may have put the finalizer back between the patch and the
	// delete (it adds a missing one); the administrator insists.
	poll.For(t, 10*time.Second, "the BerthLease is gone", func() bool {
		bl = m.BerthLease(ctx)
		if bl.Name != "" && len(bl.Finalizers) > 0 {
			_ = m.Client.Patch(ctx, &bl, ctrlclient.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)))
		}
		return bl.Name == ""
	})
	if err := m.ApplyWorkload(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl)
	if l, err := r.LeaseAPI.Admin.GetLease(ctx, workload.Namespace, workload.Name); err != nil || l.Holder != holder {
		t.Fatalf("lease two TTLs after the forced delete, Pods Terminating: %+v, %v; want still held by %s", l, err, holder)
	}
	thaw()
	stopped := poll.For(t, ttl+5*time.Second, holder+" has stopped the Pods of its BerthLease that is gone", func() bool {
		return ungated(t, m, workload.Name) == 0 || r.rec.Snapshot().Runner(int(workload.Replicas)) == holder
	})
	t.Logf("finalizer forced off in %s, BerthLease made anew at once, kubelets frozen for %s: the term was kept; its Pods were gone %s after the thaw (%s after the delete)",
		holder, 2*ttl, stopped.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond))
	if !m.Agent.LogContains("stopping the Pods of a BerthLease that is gone") && !m.Agent.LogContains("stopping Pod") {
		t.Errorf("%s's agent did not log stopping the Pods of the vanished BerthLease", holder)
	}
	r.record(t, "finalizer forced off, BerthLease deleted and made anew in the holder", 0)

	binding.ObjectMeta = metav1.ObjectMeta{Name: binding.Name, Labels: binding.Labels}
	if err := m.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	after, _ := r.runner(t, 30*time.Second, "one cluster runs the workload after the thaw")
	r.stable(t, after, ttl)
}

// applyRenamed makes, in m, the BerthLease renamed with the workload's lease
// name and a Deployment of its managed Pods.
func applyRenamed(t *testing.T, m *localfleet.Member) {
	t.Helper()
	bl := builders.BerthLease(workload.Namespace, renamed).LeaseName(workload.Name).TTL(workload.TTLSeconds).Heartbeat(workload.HeartbeatSeconds).Obj()
	deploy := builders.Deployment(workload.Namespace, renamed).ManagedBy(renamed).Replicas(workload.Replicas).Obj()
	for _, obj := range []ctrlclient.Object{bl, deploy} {
		if err := m.Client.Create(t.Context(), obj); err != nil {
			t.Fatalf("%s: create %s: %v", m.Name, obj.GetName(), err)
		}
	}
}

// berthLease reads a BerthLease of the workload's namespace; a missing one
// is the zero value.
func berthLease(t *testing.T, m *localfleet.Member, name string) berthv1alpha1.BerthLease {
	bl := berthv1alpha1.BerthLease{}
	_ = m.Client.Get(t.Context(), types.NamespacedName{Namespace: workload.Namespace, Name: name}, &bl)
	return bl
}

// ungated counts the ungated managed Pods of BerthLease name in m.
func ungated(t *testing.T, m *localfleet.Member, name string) int {
	pods := &corev1.PodList{}
	if err := m.Client.List(t.Context(), pods, ctrlclient.InNamespace(workload.Namespace), ctrlclient.MatchingLabels{reconciler.ManagedLease: name}); err != nil {
		return -1
	}
	n := 0
	for _, p := range pods.Items {
		if len(p.Spec.SchedulingGates) == 0 {
			n++
		}
	}
	return n
}
