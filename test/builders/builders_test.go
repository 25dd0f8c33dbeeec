package builders_test

import (
	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/berthfleet/berth/test/builders"
)

func TestDeploymentTemplate(t *testing.T) {
	gate := []corev1.PodSchedulingGate{{Name: berthv1alpha1.LeaseHeldSchedulingGate}}
	cases := map[string]struct {
		build      *builders.DeploymentWrapper
		wantLabels map[string]string
		wantGates  []corev1.PodSchedulingGate
		wantReps   int32
	}{
		"plain": {build: builders.Deployment("ns", "web"), wantLabels: map[string]string{"app": "web"}, wantReps: 1},
		"managed, as a user writes it": {
			build:      builders.Deployment("ns", "web").ManagedBy("lease").Replicas(2),
			wantLabels: map[string]string{"app": "web", berthv1alpha1.ManagedLeaseLabel: "lease"}, wantReps: 2,
		},
		"managed, as admission would stamp it": {
			build:      builders.Deployment("ns", "web").ManagedBy("lease").ManagedUID("uid-1").Gated(),
			wantLabels: map[string]string{"app": "web", berthv1alpha1.ManagedLeaseLabel: "lease", berthv1alpha1.ManagedLeaseUIDLabel: "uid-1"},
			wantGates:  gate, wantReps: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := tc.build.Obj()
			if diff := cmp.Diff(tc.wantLabels, d.Spec.Template.Labels); diff != "" {
				t.Errorf("template labels (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantGates, d.Spec.Template.Spec.SchedulingGates); diff != "" {
				t.Errorf("template gates (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]string{"app": "web"}, d.Spec.Selector.MatchLabels); diff != "" {
				t.Errorf("selector (-want +got):\n%s", diff)
			}
			if *d.Spec.Replicas != tc.wantReps {
				t.Errorf("replicas %d, want %d", *d.Spec.Replicas, tc.wantReps)
			}
		})
	}
}

func TestBerthLease(t *testing.T) {
	bl := builders.BerthLease("payments", "exporter-v2").LeaseName("exporter").TTL(9).Heartbeat(3).Obj()
	if bl.Namespace != "payments" || bl.Name != "exporter-v2" || bl.Spec.LeaseName != "exporter" ||
		bl.Spec.TTLSeconds != 9 || bl.Spec.HeartbeatIntervalSeconds != 3 {
		t.Errorf("BerthLease %+v", bl)
	}
}
