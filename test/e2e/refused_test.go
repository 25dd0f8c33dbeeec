package e2e

import (
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/test/poll"
)

// TestStatusWritesRefused: a hostile or careless administrator installs, in
// the holder's cluster, a policy that refuses every write of BerthLease
// status. Every reconcile of the holder then fails after it has renewed. A
// failed reconcile is retried with backoff instead of at its own wake-up;
// controller-runtime's default backoff grows to minutes, so the holder would
// renew late, its lease would expire at the lease API and another cluster
// would run beside its Pods. The agent's retries stay within the stop poll
// (half a second), so it keeps renewing: the workload stays where it is, and
// the history (judged when the test ends) shows no overlap.
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
	// are refused from then on.
	poll.For(t, 30*time.Second, "the holder's status writes are refused", func() bool {
		return m.Agent.LogContains("BerthLease status writes are refused")
	})
	// Four TTLs: without bounded retries the holder's lease expires well
	// within them and another cluster runs beside its Pods.
	r.stable(t, holder, 4*ttl)
	l, err := r.LeaseAPI.Admin.GetLease(ctx, workload.Namespace, workload.Name)
	if err != nil || l.Holder != holder {
		t.Fatalf("lease %s after the holder's status writes were refused: %+v, %v; want still held by %s", time.Since(refused).Round(time.Second), l, err, holder)
	}
	t.Logf("%s's status writes refused for %s: it kept renewing and running, nobody else ran", holder, time.Since(refused).Round(time.Second))

	if err := m.Client.Delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 30*time.Second, "the holder's status says held again once writes are allowed", func() bool {
		return m.BerthLease(ctx).Status.LeaseState == berthv1alpha1.LeaseStateHeld
	})
	r.record(t, "status writes refused in the holder", 0)
}
