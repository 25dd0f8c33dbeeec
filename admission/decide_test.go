package admission

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

const (
	testAgent = "system:serviceaccount:berth-system:berth-agent"
	testUID   = types.UID("0b5c1b1e-5a4e-4c5b-9d7e-0c2b8f4a1d10")
)

var found = BerthLeaseRef{Found: true, UID: testUID}

type podOpt func(*corev1.Pod)

func newPod(opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "exporter-0", Labels: map[string]string{"app": "exporter"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "exporter"}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// managedPod is a managed Pod as admission leaves it at creation.
func managedPod(opts ...podOpt) *corev1.Pod {
	return newPod(append([]podOpt{withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter"), withLabel(berthv1alpha1.ManagedLeaseUIDLabel, string(testUID)), withGate(berthv1alpha1.LeaseHeldSchedulingGate)}, opts...)...)
}

func withLabel(k, v string) podOpt { return func(p *corev1.Pod) { p.Labels[k] = v } }
func withoutLabel(k string) podOpt { return func(p *corev1.Pod) { delete(p.Labels, k) } }
func withGate(name string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: name})
	}
}
func withoutGates() podOpt { return func(p *corev1.Pod) { p.Spec.SchedulingGates = nil } }
func ownedBy(kind string) podOpt {
	return func(p *corev1.Pod) {
		apiVersion := "apps/v1"
		if kind == "Job" {
			apiVersion = "batch/v1"
		}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "exporter-1", UID: "7c6e", Controller: ptr.To(true)}}
	}
}
func withNodeName(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func withImage(i string) podOpt    { return func(p *corev1.Pod) { p.Spec.Containers[0].Image = i } }
func withAnnotation(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

func TestDecideCreate(t *testing.T) {
	cases := map[string]struct {
		pod         *corev1.Pod
		lease       BerthLeaseRef
		want        Decision
		wantMessage []string
	}{
		"unmanaged": {
			pod:  newPod(),
			want: Decision{Allowed: true, Reason: ReasonUnmanaged},
		},
		"unmanaged, bound at creation": {
			pod:  newPod(withNodeName("node-1")),
			want: Decision{Allowed: true, Reason: ReasonUnmanaged},
		},
		"unmanaged with Berth's gate": {
			pod:  newPod(withGate(berthv1alpha1.LeaseHeldSchedulingGate)),
			want: Decision{Allowed: true, Reason: ReasonUnmanaged},
		},
		"managed, gated, stamped": {
			pod:   managedPod(),
			lease: found,
			want:  Decision{Allowed: true, Reason: ReasonValid},
		},
		"managed among other gates": {
			pod:   managedPod(withoutGates(), withGate("example.com/other"), withGate(berthv1alpha1.LeaseHeldSchedulingGate)),
			lease: found,
			want:  Decision{Allowed: true, Reason: ReasonValid},
		},
		"UID label alone": {
			pod:         newPod(withLabel(berthv1alpha1.ManagedLeaseUIDLabel, string(testUID))),
			want:        Decision{Reason: ReasonUIDWithoutLease},
			wantMessage: []string{"payments/exporter-0", berthv1alpha1.ManagedLeaseUIDLabel},
		},
		"without the gate": {
			pod:         managedPod(withoutGates(), withGate("example.com/other")),
			lease:       found,
			want:        Decision{Reason: ReasonGateMissing},
			wantMessage: []string{"must be created with scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate},
		},
		"with nodeName": {
			pod:         managedPod(withNodeName("node-1")),
			lease:       found,
			want:        Decision{Reason: ReasonNodeNameSet},
			wantMessage: []string{"spec.nodeName", "node-1"},
		},
		"BerthLease not made yet, a ReplicaSet's Pod: admitted gated, without a UID": {
			pod:  managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("ReplicaSet")),
			want: Decision{Allowed: true, Reason: ReasonAwaitingLease, Warning: `berth: BerthLease "exporter" does not exist in namespace payments yet: this Pod waits gated, and is made anew once it does`},
		},
		"BerthLease not made yet, a StatefulSet's Pod: admitted": {
			pod:  managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("StatefulSet")),
			want: Decision{Allowed: true, Reason: ReasonAwaitingLease, Warning: `berth: BerthLease "exporter" does not exist in namespace payments yet: this Pod waits gated, and is made anew once it does`},
		},
		"BerthLease not made yet, a Job's Pod: refused (a recycled Pod counts as a failure)": {
			pod:         managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("Job")),
			want:        Decision{Reason: ReasonLeaseNotFound},
			wantMessage: []string{"create the BerthLease first"},
		},
		"BerthLease not made yet, a bare Pod: refused": {
			pod:         managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel)),
			want:        Decision{Reason: ReasonLeaseNotFound},
			wantMessage: []string{`BerthLease "exporter"`, "does not exist in namespace payments", "create the BerthLease first"},
		},
		"BerthLease made between mutation and validation: waits unstamped": {
			pod:   managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("ReplicaSet")),
			lease: BerthLeaseRef{Found: true, UID: testUID, JustMade: true},
			want:  Decision{Allowed: true, Reason: ReasonAwaitingLease},
		},
		"BerthLease made long ago, Pod unstamped: refused": {
			pod:         managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("ReplicaSet")),
			lease:       found,
			want:        Decision{Reason: ReasonLeaseUIDMismatch},
			wantMessage: []string{"is missing"},
		},
		"a name that cannot be a BerthLease's": {
			pod:         managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("ReplicaSet"), withLabel(berthv1alpha1.ManagedLeaseLabel, "Billing_v2")),
			want:        Decision{Reason: ReasonLeaseNotFound},
			wantMessage: []string{`"Billing_v2", which cannot name a BerthLease`},
		},
		"BerthLease not made yet, but a UID label": {
			pod:         managedPod(),
			want:        Decision{Reason: ReasonLeaseNotFound},
			wantMessage: []string{`BerthLease "exporter"`, "does not exist in namespace payments"},
		},
		"BerthLease not made yet, ungated": {
			pod:         managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel), ownedBy("ReplicaSet"), withoutGates()),
			want:        Decision{Reason: ReasonGateMissing},
			wantMessage: []string{"scheduling gate"},
		},
		"UID of another BerthLease": {
			pod:         managedPod(withLabel(berthv1alpha1.ManagedLeaseUIDLabel, "stale")),
			lease:       found,
			want:        Decision{Reason: ReasonLeaseUIDMismatch},
			wantMessage: []string{`is "stale"`, string(testUID)},
		},
		"UID label missing": {
			pod:         managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel)),
			lease:       found,
			want:        Decision{Reason: ReasonLeaseUIDMismatch},
			wantMessage: []string{"is missing"},
		},
		"every rule broken: the first is the reason, all are said": {
			pod:         managedPod(withoutGates(), withNodeName("node-1")),
			want:        Decision{Reason: ReasonGateMissing},
			wantMessage: []string{"scheduling gate", "spec.nodeName", "does not exist"},
		},
		"generated name": {
			pod:         managedPod(withoutGates(), func(p *corev1.Pod) { p.Name, p.Namespace, p.GenerateName = "", "", "exporter-" }),
			lease:       found,
			want:        Decision{Reason: ReasonGateMissing},
			wantMessage: []string{"payments/exporter-*"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := DecideCreate("payments", tc.pod, tc.lease, testFence)
			checkDecision(t, got, tc.want, tc.wantMessage)
		})
	}
}

func TestDecideUpdate(t *testing.T) {
	cases := map[string]struct {
		old, new    *corev1.Pod
		user        string
		want        Decision
		wantMessage []string
	}{
		"unmanaged": {
			old: newPod(), new: newPod(withImage("other")), user: "alice",
			want: Decision{Allowed: true, Reason: ReasonUnmanaged},
		},
		"term annotations on an unmanaged Pod": {
			old: newPod(withAnnotation(berthv1alpha1.FencingTokenAnnotation, "7")), new: newPod(), user: "alice",
			want: Decision{Allowed: true, Reason: ReasonUnmanaged},
		},
		"other change to a managed Pod": {
			old: managedPod(), new: managedPod(withImage("other"), withLabel("tier", "web")), user: "alice",
			want: Decision{Allowed: true, Reason: ReasonValid},
		},
		"other gate removed": {
			old: managedPod(withGate("example.com/other")), new: managedPod(), user: "alice",
			want: Decision{Allowed: true, Reason: ReasonValid},
		},
		"gate removed": {
			old: managedPod(), new: managedPod(withoutGates()), user: "alice",
			want:        Decision{Reason: ReasonGateRemoved},
			wantMessage: []string{"payments/exporter-0", "removing scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate, testAgent, `user "alice"`},
		},
		"gate removed from a Pod with only the gate": {
			old: newPod(withGate(berthv1alpha1.LeaseHeldSchedulingGate)), new: newPod(), user: "alice",
			want: Decision{Reason: ReasonGateRemoved},
		},
		"gate removed by the agent, term written": {
			old: managedPod(), user: testAgent,
			new:  managedPod(withoutGates(), withAnnotation(berthv1alpha1.FencingTokenAnnotation, "7"), withAnnotation(berthv1alpha1.HolderAnnotation, "cluster-1")),
			want: Decision{Allowed: true, Reason: ReasonOperator},
		},
		"relabelled": {
			old: managedPod(), new: managedPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "other")), user: "alice",
			want:        Decision{Reason: ReasonLeaseLabelChange},
			wantMessage: []string{`"exporter" to "other"`},
		},
		"lease label removed": {
			old: managedPod(), new: managedPod(withoutLabel(berthv1alpha1.ManagedLeaseLabel)), user: "alice",
			want:        Decision{Reason: ReasonLeaseLabelChange},
			wantMessage: []string{`"exporter" to unset`},
		},
		"UID label removed": {
			old: managedPod(), new: managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel)), user: "alice",
			want:        Decision{Reason: ReasonUIDLabelChange},
			wantMessage: []string{berthv1alpha1.ManagedLeaseUIDLabel, "to unset"},
		},
		"made managed": {
			old: newPod(), new: newPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter")), user: "alice",
			want:        Decision{Reason: ReasonMadeManaged},
			wantMessage: []string{"a Pod becomes managed only at creation"},
		},
		"made managed by the agent": {
			old: newPod(), new: newPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter")), user: testAgent,
			want: Decision{Allowed: true, Reason: ReasonOperator},
		},
		"UID label added": {
			old: newPod(), new: newPod(withLabel(berthv1alpha1.ManagedLeaseUIDLabel, "x")), user: "alice",
			want: Decision{Reason: ReasonUIDLabelChange},
		},
		"fencing token forged": {
			old:  managedPod(withoutGates(), withAnnotation(berthv1alpha1.FencingTokenAnnotation, "7")),
			new:  managedPod(withoutGates(), withAnnotation(berthv1alpha1.FencingTokenAnnotation, "8")),
			user: "alice", want: Decision{Reason: ReasonTermChange},
			wantMessage: []string{berthv1alpha1.FencingTokenAnnotation, `"7" to "8"`},
		},
		"holder written by someone else": {
			old: managedPod(), new: managedPod(withAnnotation(berthv1alpha1.HolderAnnotation, "cluster-2")), user: "alice",
			want: Decision{Reason: ReasonTermChange},
		},
		"gate and labels dropped together": {
			old: managedPod(), new: newPod(), user: "alice",
			want:        Decision{Reason: ReasonGateRemoved},
			wantMessage: []string{"scheduling gate", berthv1alpha1.ManagedLeaseLabel, berthv1alpha1.ManagedLeaseUIDLabel},
		},
		"agent's name as a group does not count": {
			old: managedPod(), new: managedPod(withoutGates()), user: "",
			want: Decision{Reason: ReasonGateRemoved},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := DecideUpdate("payments", tc.old, tc.new, tc.user, testAgent)
			checkDecision(t, got, tc.want, tc.wantMessage)
		})
	}
}

func TestDecideUpdateWithoutOperator(t *testing.T) {
	// An unset operator user is nobody: not even an empty user name may ungate.
	got := DecideUpdate("payments", managedPod(), managedPod(withoutGates()), "", "")
	checkDecision(t, got, Decision{Reason: ReasonGateRemoved}, nil)
}

func checkDecision(t *testing.T, got, want Decision, wantMessage []string) {
	t.Helper()
	msg := got.Message
	got.Message = ""
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decision (-want +got):\n%s\nmessage: %s", diff, msg)
	}
	if !want.Allowed && !strings.HasPrefix(msg, "berth: Pod ") {
		t.Errorf("message %q does not start with %q", msg, "berth: Pod ")
	}
	for _, s := range wantMessage {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q does not say %q", msg, s)
		}
	}
}

func TestStamp(t *testing.T) {
	cases := map[string]struct {
		pod         *corev1.Pod
		lease       BerthLeaseRef
		want        *corev1.Pod
		wantChanged bool
	}{
		"unmanaged": {
			pod: newPod(), lease: found, want: newPod(),
		},
		"managed": {
			pod: newPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter")), lease: found,
			want: managedPod(), wantChanged: true,
		},
		"already stamped": {
			pod: managedPod(), lease: found, want: managedPod(),
		},
		"gate added after the user's gates": {
			pod:   newPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter"), withGate("example.com/other")),
			lease: found, wantChanged: true,
			want: managedPod(withoutGates(), withGate("example.com/other"), withGate(berthv1alpha1.LeaseHeldSchedulingGate)),
		},
		"stale UID replaced": {
			pod: managedPod(withLabel(berthv1alpha1.ManagedLeaseUIDLabel, "stale")), lease: found,
			want: managedPod(), wantChanged: true,
		},
		"BerthLease missing: gated, not stamped": {
			pod:  newPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter")),
			want: managedPod(withoutLabel(berthv1alpha1.ManagedLeaseUIDLabel)), wantChanged: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pod := tc.pod.DeepCopy()
			changed := Stamp(pod, tc.lease)
			if changed != tc.wantChanged {
				t.Errorf("Stamp changed = %v, want %v", changed, tc.wantChanged)
			}
			if diff := cmp.Diff(tc.want, pod); diff != "" {
				t.Errorf("stamped Pod (-want +got):\n%s", diff)
			}
			if again := Stamp(pod, tc.lease); again {
				t.Errorf("Stamp changed a stamped Pod again (not idempotent)")
			}
			if tc.lease.Found && tc.wantChanged {
				if d := DecideCreate("payments", pod, tc.lease, testFence); !d.Allowed {
					t.Errorf("stamped Pod denied at creation: %s", d.Message)
				}
			}
		})
	}
}
