// Package builders makes the Kubernetes objects that Berth's tests create, in
// the style of kueue's test wrappers: a constructor with the fields every use
// needs, a method per variation, and Obj to take the object:
//
//	builders.BerthLease("payments", "exporter").TTL(9).Heartbeat(3).Obj()
//	builders.Deployment("payments", "exporter").ManagedBy("exporter").Replicas(2).Obj()
//	builders.Pod("payments", "exporter-0").ManagedBy("exporter").Gated().Obj()
//
// Scheme is the scheme of clients that create them. The package builds objects
// only; creating them, and waiting for what follows, is the test's or the test
// environment's.
package builders

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// Scheme knows the built-in types and BerthLease: every kind this package
// builds, for the clients that create them.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = berthv1alpha1.AddToScheme(s)
	return s
}()

// Image is the container image of built Pods: it does nothing, and kwok's
// nodes never pull it.
const Image = "registry.k8s.io/pause:3.10"

// BerthLeaseWrapper builds a BerthLease.
type BerthLeaseWrapper struct{ berthv1alpha1.BerthLease }

// BerthLease is a BerthLease with the API server's defaults for its spec.
func BerthLease(namespace, name string) *BerthLeaseWrapper {
	return &BerthLeaseWrapper{berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
}

// TTL sets spec.ttlSeconds.
func (w *BerthLeaseWrapper) TTL(seconds int32) *BerthLeaseWrapper {
	w.Spec.TTLSeconds = seconds
	return w
}

// Heartbeat sets spec.heartbeatIntervalSeconds.
func (w *BerthLeaseWrapper) Heartbeat(seconds int32) *BerthLeaseWrapper {
	w.Spec.HeartbeatIntervalSeconds = seconds
	return w
}

// PodFencing sets spec.podFencing.
func (w *BerthLeaseWrapper) PodFencing(mode berthv1alpha1.PodFencing) *BerthLeaseWrapper {
	w.Spec.PodFencing = mode
	return w
}

// LeaseName sets spec.leaseName, the lease at the lease API (the object's name by default).
func (w *BerthLeaseWrapper) LeaseName(name string) *BerthLeaseWrapper {
	w.Spec.LeaseName = name
	return w
}

// Placement sets spec.placement.
func (w *BerthLeaseWrapper) Placement(p *berthv1alpha1.Placement) *BerthLeaseWrapper {
	w.Spec.Placement = p
	return w
}

// Failover sets spec.failover.
func (w *BerthLeaseWrapper) Failover(f *berthv1alpha1.Failover) *BerthLeaseWrapper {
	w.Spec.Failover = f
	return w
}

// Obj returns the BerthLease.
func (w *BerthLeaseWrapper) Obj() *berthv1alpha1.BerthLease { return &w.BerthLease }

// DeploymentWrapper builds a Deployment.
type DeploymentWrapper struct{ appsv1.Deployment }

// Deployment is one replica of a Pod running Image, selected by the label
// app=<name>.
func Deployment(namespace, name string) *DeploymentWrapper {
	return &DeploymentWrapper{appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       podSpec(name),
			},
		},
	}}
}

// Command sets the command of the template's container.
func (w *DeploymentWrapper) Command(command ...string) *DeploymentWrapper {
	w.Spec.Template.Spec.Containers[0].Command = command
	return w
}

// Replicas sets the number of replicas.
func (w *DeploymentWrapper) Replicas(n int32) *DeploymentWrapper {
	w.Spec.Replicas = ptr.To(n)
	return w
}

// ManagedBy labels the Pod template as managed by the named BerthLease, the
// user's opt-in, and the Deployment itself, so that the agent marks it with
// its cluster's part in the lease.
func (w *DeploymentWrapper) ManagedBy(berthLease string) *DeploymentWrapper {
	w.Spec.Template.Labels[berthv1alpha1.ManagedLeaseLabel] = berthLease
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels[berthv1alpha1.ManagedLeaseLabel] = berthLease
	return w
}

// ManagedUID labels the Pod template with a BerthLease's UID, as admission
// stamps each Pod.
func (w *DeploymentWrapper) ManagedUID(uid types.UID) *DeploymentWrapper {
	w.Spec.Template.Labels[berthv1alpha1.ManagedLeaseUIDLabel] = string(uid)
	return w
}

// Gated puts Berth's scheduling gate on the Pod template, as admission puts it
// on each Pod.
func (w *DeploymentWrapper) Gated() *DeploymentWrapper {
	w.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: berthv1alpha1.LeaseHeldSchedulingGate}}
	return w
}

// PodSpec replaces the Pod template's spec.
func (w *DeploymentWrapper) PodSpec(spec corev1.PodSpec) *DeploymentWrapper {
	w.Spec.Template.Spec = spec
	return w
}

// Obj returns the Deployment.
func (w *DeploymentWrapper) Obj() *appsv1.Deployment { return &w.Deployment }

// PodWrapper builds a Pod.
type PodWrapper struct{ corev1.Pod }

// Pod is a Pod running Image.
func Pod(namespace, name string) *PodWrapper {
	return &PodWrapper{corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{}},
		Spec:       podSpec("app"),
	}}
}

// Label sets a label.
func (w *PodWrapper) Label(key, value string) *PodWrapper {
	w.Labels[key] = value
	return w
}

// ManagedBy labels the Pod as managed by the named BerthLease.
func (w *PodWrapper) ManagedBy(berthLease string) *PodWrapper {
	return w.Label(berthv1alpha1.ManagedLeaseLabel, berthLease)
}

// ManagedUID labels the Pod with a BerthLease's UID, as admission stamps it.
func (w *PodWrapper) ManagedUID(uid types.UID) *PodWrapper {
	return w.Label(berthv1alpha1.ManagedLeaseUIDLabel, string(uid))
}

// Gated puts Berth's scheduling gate on the Pod, as admission does.
func (w *PodWrapper) Gated() *PodWrapper {
	w.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: berthv1alpha1.LeaseHeldSchedulingGate}}
	return w
}

// UID sets the Pod's UID, for objects that never reach an API server.
func (w *PodWrapper) UID(uid types.UID) *PodWrapper {
	w.ObjectMeta.UID = uid
	return w
}

// Phase sets status.phase, for objects that never reach an API server.
func (w *PodWrapper) Phase(phase corev1.PodPhase) *PodWrapper {
	w.Status.Phase = phase
	return w
}

// PodSpec replaces the Pod's spec.
func (w *PodWrapper) PodSpec(spec corev1.PodSpec) *PodWrapper {
	w.Spec = spec
	return w
}

// Obj returns the Pod.
func (w *PodWrapper) Obj() *corev1.Pod { return &w.Pod }

func podSpec(container string) corev1.PodSpec {
	return corev1.PodSpec{Containers: []corev1.Container{{Name: container, Image: Image}}}
}
