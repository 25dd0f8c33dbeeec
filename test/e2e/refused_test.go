package e2e

import (
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/poll"
)

// TestStatusWritesRefused: a hostile or careless administrator installs, in
// the holder's cluster, a policy that refuses every write of BerthLease
// status, and one of the holder's Pods is recreated, so that the holder
// must write status (its Pod counts) before it ungates the new Pod. Every
// reconcile of the holder then fails there. A failed reconcile is retried
// with backoff instead of at its own wake-up, and must not leave the term
// unrenewed: the reconcile hands the term to the renewer before anything
// that can fail, and retries stay within the stop poll (half a second).
// The workload stays where it is, and the history (judged when the test
// ends) shows no overlap.
func TestStatusWritesRefused(t *testing.T) {
	r := startFleet(t)
	holder, _ := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	m := r.Member(holder)
	ctx := t.Context()

	const name = "zz-refuse-berthlease-status"
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{berthv1alpha1.GroupVersion.Group}, APIVersions: []string{"*"},
						Resources: []string{"berthleases/status"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "BerthLease status writes are refused (test)"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	if err := m.Client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	if err := m.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	refused := time.Now()
	// Policies take effect within a second or so; the agent's status writes
	// are refused from then on. Status is written on transitions only: a
	// Pod recreated is one (the counts change, and status comes before the
	// new Pod is ungated).
	// One Pod at a time is recreated, until a status write is refused (the
	// policy takes a moment to apply): the other keeps running.
	poll.For(t, 60*time.Second, "the holder's status writes are refused", func() bool {
		if m.Agent.LogContains("BerthLease status writes are refused") {
			return true
		}
		pods := &corev1.PodList{}
		if err := m.Client.List(ctx, pods, ctrlclient.InNamespace(workload.Namespace), ctrlclient.MatchingLabels{reconciler.ManagedLease: workload.Name}); err != nil {
			return false
		}
		var running []*corev1.Pod
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp.IsZero() && len(pods.Items[i].Spec.SchedulingGates) == 0 {
				running = append(running, &pods.Items[i])
			}
		}
		if len(running) == int(workload.Replicas) {
			_ = m.Client.Delete(ctx, running[0])
		}
		return false
	})
	// Four TTLs: without bounded retries the holder's lease expires well
	// within them and another cluster runs beside its Pods.
	// The recreated Pod stays gated (status comes first), so the holder
	// runs one replica: the lease must stay its own, with the same token,
	// and nobody else may run (the history judges that).
	first := m.Lease(ctx)
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if l := m.Lease(ctx); l.Holder != holder || l.FencingToken != first.FencingToken {
			t.Fatalf("lease %s after the holder's status writes were refused: %+v; want still held by %s with token %d", time.Since(refused).Round(time.Second), l, holder, first.FencingToken)
		}
	}
	t.Logf("%s's status writes refused for %s: it kept renewing and running, nobody else ran", holder, time.Since(refused).Round(time.Second))

	if err := m.Client.Delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, "the holder's status says held again once writes are allowed", func() bool {
		return m.BerthLease(ctx).Status.LeaseState == berthv1alpha1.LeaseStateHeld
	})
	r.runner(t, 30*time.Second, "the holder runs both replicas again")
	r.record(t, "status writes refused in the holder", 0)
}
