package admission

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
)

// Reason says why admission allowed, denied or changed a request. Reasons are the values of
// the reason label of berth_admission_decisions_total, so there are few of them.
type Reason string

// Reasons for allowing.
const (
	// ReasonUnmanaged: neither the old nor the new Pod is Berth's.
	ReasonUnmanaged Reason = "Unmanaged"
	// ReasonValid: a Berth Pod that breaks no rule.
	ReasonValid Reason = "Valid"
	// ReasonOperator: a change only the operator (the Berth agent) may make, made by it.
	ReasonOperator Reason = "OperatorUser"
	// ReasonAwaitingLease: a managed Pod of a ReplicaSet or StatefulSet created, gated,
	// before the BerthLease it names (a GitOps tool applies in any order). It carries no UID
	// label, so the agent never ungates it: once the BerthLease exists, the agent deletes it
	// and its controller makes it anew, stamped.
	ReasonAwaitingLease Reason = "AwaitingLease"
)

// Reasons for denying, in the order Decide checks them.
const (
	ReasonUIDWithoutLease  Reason = "UIDWithoutLease"
	ReasonGateMissing      Reason = "GateMissing"
	ReasonNodeNameSet      Reason = "NodeNameSet"
	ReasonLeaseNotFound    Reason = "LeaseNotFound"
	ReasonLeaseUIDMismatch Reason = "LeaseUIDMismatch"
	ReasonGateRemoved      Reason = "GateRemoved"
	ReasonMadeManaged      Reason = "MadeManaged"
	ReasonLeaseLabelChange Reason = "LeaseLabelChanged"
	ReasonUIDLabelChange   Reason = "UIDLabelChanged"
	ReasonTermChange       Reason = "TermAnnotationChanged"
	// ReasonNotFenced: the BerthLease asks spec.podFencing Exec and the Pod does not run
	// its workload under berth-fence exactly as admission wraps it (at creation), or a
	// change would let code of a fenced Pod run outside berth-fence (at update).
	ReasonNotFenced Reason = "NotFenced"
)

// Reasons for mutating.
const (
	// ReasonStamped: the mutating webhook added the gate, the UID label, or both.
	ReasonStamped Reason = "Stamped"
	// ReasonLookupFailed: the BerthLease could not be read; the request fails closed.
	ReasonLookupFailed Reason = "LeaseLookupFailed"
	// ReasonBadRequest: the request could not be decoded.
	ReasonBadRequest Reason = "BadRequest"
	// ReasonFenced: the mutating webhook wrapped containers in berth-fence.
	ReasonFenced Reason = "Fenced"
	// ReasonFenceUnavailable: the BerthLease asks spec.podFencing Exec and this agent
	// was started without --fence-image; the creation is refused, by the mutating
	// webhook and by the validating one.
	ReasonFenceUnavailable Reason = "FenceUnavailable"
)

// BerthLeaseRef is what admission knows of the BerthLease a Pod names, read before deciding.
type BerthLeaseRef struct {
	// Found is false when no BerthLease of that name exists in the Pod's namespace.
	Found bool
	UID   types.UID
	// JustMade: the BerthLease was made moments ago (JustMadeWithin), so the mutating
	// webhook may have looked for it a moment before it existed and left the Pod unstamped.
	JustMade bool
	// LeaseName is the lease's name at the lease API (spec.leaseName, or the BerthLease's
	// name).
	LeaseName string
	// PodFencing: the BerthLease asks spec.podFencing Exec.
	PodFencing bool
}

// JustMadeWithin is how recent a BerthLease is JustMade: far longer than the moment between
// the mutating and the validating webhook's look at it, far shorter than a Pod's life.
const JustMadeWithin = 30 * time.Second

// Decision is the outcome of a validation. A denial carries every rule the request breaks;
// Reason is the first of them.
type Decision struct {
	Allowed bool
	Reason  Reason
	Message string
	// Warning, when set, is returned to the client with an allowed request.
	Warning string
}

// violation is one broken rule.
type violation struct {
	reason Reason
	what   string
}

func decide(pod string, allow Reason, vs []violation) Decision {
	if len(vs) == 0 {
		return Decision{Allowed: true, Reason: allow}
	}
	msgs := make([]string, len(vs))
	for i, v := range vs {
		msgs[i] = v.what
	}
	return Decision{
		Reason:  vs[0].reason,
		Message: fmt.Sprintf("berth: Pod %s denied: %s", pod, strings.Join(msgs, "; ")),
	}
}

// berths reports whether the Pod carries any of Berth's marks: a managed label or the gate.
// Those are the Pods the webhooks' match conditions send (see Manifests).
func berths(pod *corev1.Pod) bool {
	if pod == nil {
		return false
	}
	_, lease := pod.Labels[berthv1alpha1.ManagedLeaseLabel]
	_, uid := pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel]
	return lease || uid || gated(pod)
}

func gated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == berthv1alpha1.LeaseHeldSchedulingGate
	})
}

// podName names a Pod in messages: namespace/name, or namespace/generateName* before the
// API server has named it.
func podName(namespace string, pod *corev1.Pod) string {
	if pod.Namespace != "" {
		namespace = pod.Namespace
	}
	name := pod.Name
	if name == "" && pod.GenerateName != "" {
		name = pod.GenerateName + "*"
	}
	return namespace + "/" + name
}

// DecideCreate decides a Pod's creation, by anyone. A Pod is managed when it carries the
// label berthv1alpha1.ManagedLeaseLabel; lease is the BerthLease that label names. A managed Pod
// must be created gated, not bound to a node, and stamped with the UID of the BerthLease it
// names, or, while that BerthLease does not exist yet, with no UID label at all when a
// ReplicaSet or StatefulSet controls it (the workload was applied before its BerthLease;
// the Decision carries a warning). Pods that are not managed are allowed. When the
// BerthLease asks spec.podFencing Exec, the Pod must carry exactly the fence that Fence
// injects with cfg, this agent's configuration.
func DecideCreate(namespace string, pod *corev1.Pod, lease BerthLeaseRef, cfg FenceConfig) Decision {
	name := podName(namespace, pod)
	leaseName, managed := pod.Labels[berthv1alpha1.ManagedLeaseLabel]
	uid, stamped := pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel]
	if !managed {
		if stamped {
			return decide(name, "", []violation{{ReasonUIDWithoutLease, fmt.Sprintf(
				"label %s is set but label %s is not: the UID label is admission's, for managed Pods only",
				berthv1alpha1.ManagedLeaseUIDLabel, berthv1alpha1.ManagedLeaseLabel)}})
		}
		return Decision{Allowed: true, Reason: ReasonUnmanaged}
	}
	var vs []violation
	if !gated(pod) {
		vs = append(vs, violation{ReasonGateMissing, fmt.Sprintf(
			"a managed Pod (label %s=%s) must be created with scheduling gate %s, so that it runs only while this cluster holds the lease",
			berthv1alpha1.ManagedLeaseLabel, leaseName, berthv1alpha1.LeaseHeldSchedulingGate)})
	}
	if pod.Spec.NodeName != "" {
		vs = append(vs, violation{ReasonNodeNameSet, fmt.Sprintf(
			"a managed Pod must not set spec.nodeName (%q): a Pod bound at creation would skip the scheduling gate",
			pod.Spec.NodeName)})
	}
	allow, warning := ReasonValid, ""
	switch {
	case !lease.Found && len(validation.IsDNS1123Subdomain(leaseName)) > 0:
		vs = append(vs, violation{ReasonLeaseNotFound, fmt.Sprintf(
			"label %s is %q, which cannot name a BerthLease: %s",
			berthv1alpha1.ManagedLeaseLabel, leaseName, strings.Join(validation.IsDNS1123Subdomain(leaseName), "; "))})
	case !lease.Found && stamped:
		vs = append(vs, violation{ReasonLeaseNotFound, fmt.Sprintf(
			"label %s is %q but BerthLease %q does not exist in namespace %s: only admission stamps that label, with the UID of an existing BerthLease",
			berthv1alpha1.ManagedLeaseUIDLabel, uid, leaseName, namespaceOf(namespace, pod))})
	case !lease.Found && !awaits(pod):
		// A Job would count the Pod recycled later as a failure, and a bare Pod would be
		// gone for good: its creation fails now, clearly, and is retried by its controller.
		vs = append(vs, violation{ReasonLeaseNotFound, fmt.Sprintf(
			"label %s names BerthLease %q, which does not exist in namespace %s: create the BerthLease first (only the Pods of ReplicaSets and StatefulSets wait for theirs)",
			berthv1alpha1.ManagedLeaseLabel, leaseName, namespaceOf(namespace, pod))})
	case !lease.Found:
		allow = ReasonAwaitingLease
		warning = fmt.Sprintf("berth: BerthLease %q does not exist in namespace %s yet: this Pod waits gated, and is made anew once it does", leaseName, namespaceOf(namespace, pod))
	case !stamped && lease.JustMade && awaits(pod):
		// Mutated an instant before its BerthLease was made: waits like one made before.
		allow = ReasonAwaitingLease
	case uid != string(lease.UID):
		have := fmt.Sprintf("%q", uid)
		if !stamped {
			have = "missing"
		}
		vs = append(vs, violation{ReasonLeaseUIDMismatch, fmt.Sprintf(
			"label %s is %s but BerthLease %q has UID %s: a managed Pod must name the BerthLease it runs under as it exists now",
			berthv1alpha1.ManagedLeaseUIDLabel, have, leaseName, lease.UID)})
	}
	if lease.Found && lease.PodFencing && allow == ReasonValid {
		vs = append(vs, fenceViolations(namespaceOf(namespace, pod), leaseName, lease, cfg, pod)...)
	}
	d := decide(name, allow, vs)
	if d.Allowed {
		d.Warning = warning
	}
	return d
}

// fenceViolations are the ways pod, of a BerthLease with spec.podFencing Exec, falls short
// of the fence this agent injects. An agent without a fence image cannot tell the genuine
// berth-fence from another, so it refuses the Pod.
func fenceViolations(namespace, berthLease string, lease BerthLeaseRef, cfg FenceConfig, pod *corev1.Pod) []violation {
	if cfg.Image == "" {
		return []violation{{ReasonFenceUnavailable, fmt.Sprintf(
			"BerthLease %q asks spec.podFencing Exec, but this cluster's Berth agent runs without --fence-image, so it cannot check that the Pod runs the genuine berth-fence",
			berthLease)}}
	}
	var vs []violation
	for _, p := range (fence{cfg: cfg, key: leaseapi.Key{Namespace: namespace, Name: lease.LeaseName}}).problems(pod) {
		vs = append(vs, violation{ReasonNotFenced, fmt.Sprintf("BerthLease %q asks spec.podFencing Exec: %s", berthLease, p)})
	}
	return vs
}

// awaits reports whether a Pod may be created before its BerthLease: one that a ReplicaSet
// or a StatefulSet controls, which makes it anew when the agent recycles it.
func awaits(pod *corev1.Pod) bool {
	owner := metav1.GetControllerOf(pod)
	return owner != nil && owner.APIVersion == "apps/v1" && (owner.Kind == "ReplicaSet" || owner.Kind == "StatefulSet")
}

func namespaceOf(namespace string, pod *corev1.Pod) string {
	if pod.Namespace != "" {
		return pod.Namespace
	}
	return namespace
}

// DecideUpdate decides a change of a Pod (an update or patch of the Pod or its status) by
// user. Only operatorUser (the Berth agent) may remove the scheduling gate, add, change or
// remove the managed labels, or change the term annotations the agent writes when it
// ungates a Pod. Nobody, the agent included, may make a change that lets code of a fenced
// Pod run outside berth-fence (see fenceChanges); anyone may make any other change.
func DecideUpdate(namespace string, old, pod *corev1.Pod, user, operatorUser string) Decision {
	if !berths(old) && !berths(pod) && !fencedPod(old) {
		return Decision{Allowed: true, Reason: ReasonUnmanaged}
	}
	vs := reservedChanges(old, pod, user, operatorUser)
	byOperator := len(vs) > 0 && user == operatorUser && operatorUser != ""
	if byOperator {
		vs = nil
	}
	vs = append(vs, fenceChanges(old, pod)...)
	if byOperator && len(vs) == 0 {
		return Decision{Allowed: true, Reason: ReasonOperator}
	}
	return decide(podName(namespace, old), ReasonValid, vs)
}

// reservedChanges are the changes from old to pod that only operatorUser may make.
func reservedChanges(old, pod *corev1.Pod, user, operatorUser string) []violation {
	var vs []violation
	agent := fmt.Sprintf("the Berth agent (%s)", operatorUser)
	if gated(old) && !gated(pod) {
		vs = append(vs, violation{ReasonGateRemoved, fmt.Sprintf(
			"removing scheduling gate %s is reserved to %s, which removes it only while this cluster holds the lease; user %q may not",
			berthv1alpha1.LeaseHeldSchedulingGate, agent, user)})
	}
	oldLease, wasManaged := old.Labels[berthv1alpha1.ManagedLeaseLabel]
	newLease, isManaged := pod.Labels[berthv1alpha1.ManagedLeaseLabel]
	switch {
	case !wasManaged && isManaged:
		vs = append(vs, violation{ReasonMadeManaged, fmt.Sprintf(
			"adding label %s to an existing Pod is reserved to %s: a Pod becomes managed only at creation, when it is gated; user %q may not",
			berthv1alpha1.ManagedLeaseLabel, agent, user)})
	case wasManaged && (!isManaged || oldLease != newLease):
		vs = append(vs, violation{ReasonLeaseLabelChange, fmt.Sprintf(
			"changing or removing label %s (%s) is reserved to %s; user %q may not",
			berthv1alpha1.ManagedLeaseLabel, change(oldLease, wasManaged, newLease, isManaged), agent, user)})
	}
	oldUID, hadUID := old.Labels[berthv1alpha1.ManagedLeaseUIDLabel]
	newUID, hasUID := pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel]
	if hadUID != hasUID || oldUID != newUID {
		vs = append(vs, violation{ReasonUIDLabelChange, fmt.Sprintf(
			"changing, adding or removing label %s (%s) is reserved to %s; user %q may not",
			berthv1alpha1.ManagedLeaseUIDLabel, change(oldUID, hadUID, newUID, hasUID), agent, user)})
	}
	for _, key := range []string{berthv1alpha1.FencingTokenAnnotation, berthv1alpha1.HolderAnnotation} {
		o, had := old.Annotations[key]
		n, has := pod.Annotations[key]
		if had != has || o != n {
			vs = append(vs, violation{ReasonTermChange, fmt.Sprintf(
				"changing annotation %s (%s) is reserved to %s, which writes the lease term the workload fences with; user %q may not",
				key, change(o, had, n, has), agent, user)})
		}
	}
	return vs
}

func change(old string, had bool, new string, has bool) string {
	q := func(v string, ok bool) string {
		if !ok {
			return "unset"
		}
		return fmt.Sprintf("%q", v)
	}
	return q(old, had) + " to " + q(new, has)
}

// Stamp is the mutating webhook's change to a Pod being created: a managed Pod gets the
// scheduling gate and, when its BerthLease exists, the label berthv1alpha1.ManagedLeaseUIDLabel with the
// BerthLease's UID. It changes pod in place and reports whether it changed anything; a
// stamped Pod is left as it is, so the API server may call it again (reinvocation) safely.
// A Pod whose BerthLease does not exist yet is gated and left without the UID label.
func Stamp(pod *corev1.Pod, lease BerthLeaseRef) bool {
	if _, managed := pod.Labels[berthv1alpha1.ManagedLeaseLabel]; !managed {
		return false
	}
	changed := false
	if !gated(pod) {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: berthv1alpha1.LeaseHeldSchedulingGate})
		changed = true
	}
	if lease.Found && pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel] != string(lease.UID) {
		pod.Labels[berthv1alpha1.ManagedLeaseUIDLabel] = string(lease.UID)
		changed = true
	}
	return changed
}

// Fence is the mutating webhook's second change to a Pod being created: when the
// BerthLease it runs under asks spec.podFencing Exec, each of its containers is wrapped in
// berth-fence (see fence.inject). It reports whether it changed pod, and fails when this
// agent has no image to take berth-fence from.
func Fence(namespace string, pod *corev1.Pod, lease BerthLeaseRef, cfg FenceConfig) (bool, error) {
	if !lease.Found || !lease.PodFencing {
		return false, nil
	}
	if cfg.Image == "" {
		return false, fmt.Errorf("berth: BerthLease %q asks spec.podFencing Exec, but this cluster's Berth agent runs without --fence-image, so it cannot put berth-fence into the Pod",
			pod.Labels[berthv1alpha1.ManagedLeaseLabel])
	}
	f := fence{cfg: cfg, key: leaseapi.Key{Namespace: namespaceOf(namespace, pod), Name: lease.LeaseName}}
	return f.inject(pod), nil
}
