package reconciler_test

import (
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/test/kubeenv"
)

// TestCRDValidation creates BerthLeases (dry run) on a real API server with
// deploy/crd installed: the schema and its rules refuse what the agent could
// only report at run time, and take every valid form. A selector's
// operators are left to the agent (InvalidPlacement): a rule over
// metav1.LabelSelector's unbounded lists exceeds the API server's cost
// budget.
func TestCRDValidation(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 1})
	cfg := env.Clusters[0].RESTConfig()
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("..", "deploy", "crd")}, Scheme: scheme}); err != nil {
		t.Fatalf("install CRDs: %v", err)
	}
	c, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	selector := func(s metav1.LabelSelector) berthv1alpha1.ClusterPreference {
		return berthv1alpha1.ClusterPreference{Selector: &s}
	}
	expr := func(op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "site", Operator: op, Values: values}}}
	}
	failback := &berthv1alpha1.Failback{StabilizationSeconds: 60}
	cases := map[string]struct {
		spec berthv1alpha1.BerthLeaseSpec
		want string // a part of the refusal; empty: accepted
	}{
		"preferred ids and selectors with failback": {spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{
			Preferred: []berthv1alpha1.ClusterPreference{
				{Cluster: "eu-west-1.prod"},
				selector(metav1.LabelSelector{MatchLabels: map[string]string{"site": "primary"}}),
				selector(expr(metav1.LabelSelectorOpIn, "a", "b")),
				selector(expr(metav1.LabelSelectorOpDoesNotExist)),
			},
			Failback: failback,
		}}},
		"preferred without failback": {spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{
			Preferred: []berthv1alpha1.ClusterPreference{{Cluster: "east"}},
		}}},
		"failover": {spec: berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 100, WindowSeconds: 60}}},

		"failback without preferred": {
			spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{Failback: failback}},
			want: "failback needs at least one preferred cluster",
		},
		"a cluster id that no agent can have": {
			spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{Preferred: []berthv1alpha1.ClusterPreference{{Cluster: "Not A/Cluster"}}}},
			want: "spec.placement.preferred[0].cluster",
		},
		"both cluster and selector": {
			spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{Preferred: []berthv1alpha1.ClusterPreference{
				{Cluster: "east", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "primary"}}},
			}}},
			want: "set exactly one of cluster and selector",
		},
		"an empty selector": {
			spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{Preferred: []berthv1alpha1.ClusterPreference{selector(metav1.LabelSelector{})}}},
			want: "an empty selector names no cluster",
		},
		"a stabilization window under 5 s": {
			spec: berthv1alpha1.BerthLeaseSpec{Placement: &berthv1alpha1.Placement{
				Preferred: []berthv1alpha1.ClusterPreference{{Cluster: "east"}}, Failback: &berthv1alpha1.Failback{StabilizationSeconds: 1},
			}},
			want: "spec.placement.failback.stabilizationSeconds",
		},
		"unreadySeconds 0": {
			spec: berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 0}},
			want: "spec.failover.unreadySeconds",
		},
		"maxMoves over 100": {
			spec: berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, MaxMoves: 1000}},
			want: "spec.failover.maxMoves",
		},
		"a window under a minute": {
			spec: berthv1alpha1.BerthLeaseSpec{Failover: &berthv1alpha1.Failover{UnreadySeconds: 5, WindowSeconds: 10}},
			want: "spec.failover.windowSeconds",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			bl := &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "exporter"}, Spec: tc.spec}
			err := c.Create(t.Context(), bl, ctrlclient.DryRunAll)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want == "":
			case !apierrors.IsInvalid(err):
				t.Errorf("create: %v, want it refused as invalid", err)
			case !strings.Contains(err.Error(), tc.want):
				t.Errorf("refused with %q, want it to say %q", err, tc.want)
			}
		})
	}
}
