package admission

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// fuzzPod builds a Pod from fuzz input: bits of marks say which of Berth's labels,
// annotations and gate it carries, the strings are their values.
func fuzzPod(marks uint8, lease, uid, token, nodeName string) *corev1.Pod {
	p := newPod()
	if marks&1 != 0 {
		p.Labels[berthv1alpha1.ManagedLeaseLabel] = lease
	}
	if marks&2 != 0 {
		p.Labels[berthv1alpha1.ManagedLeaseUIDLabel] = uid
	}
	if marks&4 != 0 {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: berthv1alpha1.LeaseHeldSchedulingGate})
	}
	if marks&8 != 0 {
		p.Spec.SchedulingGates = append([]corev1.PodSchedulingGate{{Name: "example.com/other"}}, p.Spec.SchedulingGates...)
	}
	if marks&16 != 0 {
		withAnnotation(berthv1alpha1.FencingTokenAnnotation, token)(p)
	}
	if marks&32 != 0 {
		withAnnotation(berthv1alpha1.HolderAnnotation, token)(p)
	}
	if marks&64 != 0 {
		p.Spec.NodeName = nodeName
	}
	if marks&128 != 0 {
		ownedBy("ReplicaSet")(p)
	}
	return p
}

// FuzzDecideUpdate checks DecideUpdate against the safety rules stated independently: a
// user other than the agent never gets an update through that removes the gate or touches
// the managed labels or term annotations; the agent always does; denials say why.
func FuzzDecideUpdate(f *testing.F) {
	f.Add(uint8(0b0111), uint8(0b0011), "exporter", "exporter", "uid", "uid", "1", "2", "alice", false)
	f.Add(uint8(0b0111), uint8(0b0111), "exporter", "other", "uid", "uid", "1", "1", "alice", false)
	f.Add(uint8(0b0000), uint8(0b0001), "", "exporter", "", "", "", "", "alice", false)
	f.Add(uint8(0b0111), uint8(0b110011), "exporter", "exporter", "uid", "uid", "", "7", testAgent, true)
	f.Fuzz(func(t *testing.T, oldMarks, newMarks uint8, oldLease, newLease, oldUID, newUID, oldToken, newToken, user string, asAgent bool) {
		if asAgent {
			user = testAgent
		}
		old := fuzzPod(oldMarks, oldLease, oldUID, oldToken, "")
		pod := fuzzPod(newMarks, newLease, newUID, newToken, "")
		d := DecideUpdate("payments", old, pod, user, testAgent)
		if d != DecideUpdate("payments", old.DeepCopy(), pod.DeepCopy(), user, testAgent) {
			t.Fatalf("decision not deterministic")
		}
		label := func(p *corev1.Pod, k string) (string, bool) { v, ok := p.Labels[k]; return v, ok }
		annotation := func(p *corev1.Pod, k string) (string, bool) { v, ok := p.Annotations[k]; return v, ok }
		same := func(get func(*corev1.Pod, string) (string, bool), k string) bool {
			o, had := get(old, k)
			n, has := get(pod, k)
			return had == has && o == n
		}
		// Berth guards only Pods that carry its marks (a managed label or the gate), before
		// or after; term annotations on any other Pod mean nothing to it.
		marked := func(p *corev1.Pod) bool {
			_, l := label(p, berthv1alpha1.ManagedLeaseLabel)
			_, u := label(p, berthv1alpha1.ManagedLeaseUIDLabel)
			return l || u || gated(p)
		}
		reserved := (marked(old) || marked(pod)) && ((gated(old) && !gated(pod)) ||
			!same(label, berthv1alpha1.ManagedLeaseLabel) || !same(label, berthv1alpha1.ManagedLeaseUIDLabel) ||
			!same(annotation, berthv1alpha1.FencingTokenAnnotation) || !same(annotation, berthv1alpha1.HolderAnnotation))
		switch {
		case user == testAgent && !d.Allowed:
			t.Fatalf("agent denied: %s", d.Message)
		case user != testAgent && reserved && d.Allowed:
			t.Fatalf("user %q allowed a reserved change (reason %s)", user, d.Reason)
		case user != testAgent && !reserved && !d.Allowed:
			t.Fatalf("user %q denied a harmless change: %s", user, d.Message)
		case !d.Allowed && (d.Message == "" || d.Reason == ""):
			t.Fatalf("denial without a reason or message: %+v", d)
		}
	})
}

// FuzzDecideCreate checks that DecideCreate admits a managed Pod only gated, unbound and
// stamped with the UID of its existing BerthLease, or with no UID while that BerthLease does
// not exist, and that Stamp makes every managed Pod admissible that can be (it names no node,
// and carries no UID label when its BerthLease is missing), idempotently.
func FuzzDecideCreate(f *testing.F) {
	f.Add(uint8(0b0111), "exporter", "uid", "node-1", true, "uid")
	f.Add(uint8(0b0001), "exporter", "", "", true, "uid")
	f.Add(uint8(0b1000011), "exporter", "uid", "node-1", true, "uid")
	f.Add(uint8(0b0010), "", "uid", "", false, "")
	f.Add(uint8(0b10000101), "exporter", "", "", false, "")
	f.Fuzz(func(t *testing.T, marks uint8, lease, uid, nodeName string, leaseFound bool, leaseUID string) {
		pod := fuzzPod(marks, lease, uid, "", nodeName)
		l := BerthLeaseRef{Found: leaseFound, UID: types.UID(leaseUID), JustMade: leaseFound && len(leaseUID)%2 == 1}
		if !leaseFound {
			l.UID = ""
		}
		d := DecideCreate("payments", pod, l, testFence)
		_, managed := pod.Labels[berthv1alpha1.ManagedLeaseLabel]
		_, stamped := pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel]
		switch {
		case !managed && stamped && d.Allowed:
			t.Fatalf("UID label without lease label allowed")
		case !managed && !stamped && !d.Allowed:
			t.Fatalf("unmanaged Pod denied: %s", d.Message)
		case managed && d.Allowed && d.Reason != ReasonAwaitingLease && (!gated(pod) || pod.Spec.NodeName != "" || pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel] != string(l.UID)):
			t.Fatalf("managed Pod allowed that is ungated, bound or misnamed: %+v", pod)
		case managed && d.Reason == ReasonAwaitingLease && (!gated(pod) || pod.Spec.NodeName != "" || stamped || !awaits(pod) || (l.Found && !l.JustMade)):
			t.Fatalf("managed Pod allowed that is ungated, bound or misnamed: %+v", pod)
		case managed && d.Allowed && !l.Found && d.Reason != ReasonAwaitingLease:
			t.Fatalf("managed Pod of a missing BerthLease allowed as %s", d.Reason)
		case !d.Allowed && (d.Message == "" || d.Reason == ""):
			t.Fatalf("denial without a reason or message: %+v", d)
		}

		stampedPod := pod.DeepCopy()
		Stamp(stampedPod, l)
		if Stamp(stampedPod.DeepCopy(), l) {
			t.Fatalf("Stamp not idempotent")
		}
		if managed && pod.Spec.NodeName == "" && (l.Found || (!stamped && awaits(pod) && len(validation.IsDNS1123Subdomain(lease)) == 0)) {
			if d := DecideCreate("payments", stampedPod, l, testFence); !d.Allowed {
				t.Fatalf("stamped Pod denied: %s", d.Message)
			}
		}
		if !managed && !cmpEqual(pod, stampedPod) {
			t.Fatalf("Stamp changed an unmanaged Pod")
		}
	})
}

func cmpEqual(a, b *corev1.Pod) bool { return equality.Semantic.DeepEqual(a, b) }
