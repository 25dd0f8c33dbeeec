package admission_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/berthfleet/berth/admission"
	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/pki"
	"github.com/berthfleet/berth/test/poll"
)

const (
	namespace = "payments"
	leaseName = "exporter"
	// fencedLeaseName is a BerthLease with spec.podFencing Exec.
	fencedLeaseName = "fenced-exporter"
	agentUser       = admission.DefaultOperatorUser
	mallory         = "mallory" // may create, update and patch Pods, but is not the agent
)

var scheme = builders.Scheme

// suite is one cluster with Berth's admission installed step by step.
type suite struct {
	t                     *testing.T
	admin, agent, mallory ctrlclient.Client
	leaseUID, fencedUID   types.UID
	objs                  []ctrlclient.Object // Manifests: mutating, validating, policy, binding
	seq                   int
}

// TestWorkloadAdmission installs the admission layers one at a time on a real cluster and
// tries to slip a managed Pod past each: the validating webhook alone, then with mutation,
// then with the policy; with the webhook server stopped; and with the policy alone.
func TestWorkloadAdmission(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 1})
	c := env.Clusters[0]
	ctx := t.Context()
	s := &suite{t: t, admin: newClient(t, c.RESTConfig()), mallory: newClient(t, c.ConfigAs(mallory)),
		agent: newClient(t, c.ConfigAs(agentUser, "system:serviceaccounts", "system:serviceaccounts:berth-system"))}
	s.setUpCluster(ctx, c.RESTConfig())

	url, ca, stop := serveAdmission(t, c.RESTConfig())
	objs, err := admission.Manifests(admission.ManifestOptions{OperatorUser: agentUser, Mutate: true, URL: url, CABundle: ca, TimeoutSeconds: 5})
	if err != nil {
		t.Fatal(err)
	}
	s.objs = objs
	mutating, validating, policy, binding := objs[0], objs[1], objs[2], objs[3]

	// The webhook alone, validating only: every bypass is denied with its message.
	s.create(ctx, validating)
	s.eventually("validating webhook in force", func() error {
		return wantDenied(s.admin.Create(ctx, s.pod("probe", unstamped), ctrlclient.DryRunAll), "berth: Pod")
	})
	t.Run("webhook", func(t *testing.T) { s.bypasses(ctx, t, false) })
	if n := decisionCount(t, "UPDATE", "deny", admission.ReasonGateRemoved); n < 4 {
		t.Errorf("berth_admission_decisions_total{UPDATE,deny,GateRemoved} = %v, want at least 4", n)
	}

	// With mutation: Pods of a managed Deployment come out gated and stamped; the agent
	// ungates one, and the scheduler binds it.
	s.create(ctx, mutating)
	s.eventually("mutating webhook in force", func() error {
		p := s.pod("probe", unstamped, ungated)
		if err := s.admin.Create(ctx, p, ctrlclient.DryRunAll); err != nil {
			return err
		}
		return checkStamped(p, s.leaseUID)
	})
	pods := s.managedDeployment(ctx, t)
	s.ungate(ctx, t, &pods[0])
	t.Run("fenced", func(t *testing.T) { s.fenced(ctx, t) })

	// With the policy too: the agent still ungates.
	s.create(ctx, policy, binding)
	s.eventually("policy in force", func() error {
		err := s.mallory.Patch(ctx, &pods[1], ctrlclient.RawPatch(types.MergePatchType, []byte(`{"spec":{"schedulingGates":null}}`)), ctrlclient.DryRunAll)
		return wantDenied(err, "is reserved to the Berth agent ("+agentUser+"); user mallory may not")
	})
	s.checkPolicyTypes(ctx, t)
	s.ungate(ctx, t, &pods[1])

	// Webhook server down: managed Pods cannot be ungated, unmanaged Pods are created.
	stop()
	t.Run("webhook server down", func(t *testing.T) { s.webhookDown(ctx, t) })

	// Webhook configurations deleted: the policy alone holds.
	for _, o := range []ctrlclient.Object{mutating, validating} {
		if err := s.admin.Delete(ctx, o); err != nil {
			t.Fatalf("delete %T: %v", o, err)
		}
	}
	// The policy runs before the webhooks, so its denial alone does not show that the API
	// server has dropped them: a Pod it admits must be created without calling the
	// stopped server.
	s.eventually("webhook configurations gone", func() error {
		if err := s.admin.Create(ctx, s.pod("probe"), ctrlclient.DryRunAll); err != nil {
			return fmt.Errorf("a gated Pod not admitted without the webhooks: %w", err)
		}
		return wantDenied(s.admin.Create(ctx, s.pod("probe", ungated), ctrlclient.DryRunAll), "must be created with scheduling gate")
	})
	t.Run("policy", func(t *testing.T) { s.bypasses(ctx, t, true) })
	late := s.pod("policy-only-agent")
	s.mustCreate(ctx, late)
	s.ungate(ctx, t, late)
}

// bypass is one attempt by mallory to run a managed Pod without the lease.
type bypass struct {
	// from is the Pod the attempt starts from, created by the administrator; nil: none.
	from func(s *suite, name string) *corev1.Pod
	// try makes the attempt; pod is from's Pod or, for creations, a name to use.
	try func(ctx context.Context, c ctrlclient.Client, s *suite, pod *corev1.Pod, name string) error
	// wantWebhook and wantPolicy are in the denial of the webhook and of the policy;
	// wantPolicy empty: the policy does not check this (the webhook alone does).
	wantWebhook, wantPolicy string
}

func mergePatch(patch string) func(context.Context, ctrlclient.Client, *suite, *corev1.Pod, string) error {
	return patchOf(types.MergePatchType, patch)
}

func patchOf(pt types.PatchType, patch string) func(context.Context, ctrlclient.Client, *suite, *corev1.Pod, string) error {
	return func(ctx context.Context, c ctrlclient.Client, _ *suite, pod *corev1.Pod, _ string) error {
		return c.Patch(ctx, pod, ctrlclient.RawPatch(pt, []byte(patch)))
	}
}

func createPod(opts ...podOpt) func(context.Context, ctrlclient.Client, *suite, *corev1.Pod, string) error {
	return func(ctx context.Context, c ctrlclient.Client, s *suite, _ *corev1.Pod, name string) error {
		return c.Create(ctx, s.pod(name, opts...))
	}
}

func managed(s *suite, name string) *corev1.Pod { return s.pod(name) }

var (
	gateRemoved   = "removing scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate
	policyGate    = "removing scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate + " is reserved to the Berth agent (" + agentUser + "); user mallory may not"
	policyLabels  = "labels " + berthv1alpha1.ManagedLeaseLabel + " and " + berthv1alpha1.ManagedLeaseUIDLabel + " is reserved to the Berth agent (" + agentUser + "); user mallory may not"
	policyTerm    = "annotations " + berthv1alpha1.FencingTokenAnnotation + " and " + berthv1alpha1.HolderAnnotation + " is reserved"
	policyCreated = "must be created with scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate
	esc           = strings.NewReplacer("/", "~1").Replace
)

var bypasses = map[string]bypass{
	"update that drops the gate": {
		from: managed,
		try: func(ctx context.Context, c ctrlclient.Client, _ *suite, pod *corev1.Pod, _ string) error {
			pod.Spec.SchedulingGates = nil
			return c.Update(ctx, pod)
		},
		wantWebhook: gateRemoved, wantPolicy: policyGate,
	},
	"JSON patch that drops the gate": {
		from:        managed,
		try:         patchOf(types.JSONPatchType, `[{"op":"remove","path":"/spec/schedulingGates/0"}]`),
		wantWebhook: gateRemoved, wantPolicy: policyGate,
	},
	"merge patch that drops the gate": {
		from:        managed,
		try:         mergePatch(`{"spec":{"schedulingGates":null}}`),
		wantWebhook: gateRemoved, wantPolicy: policyGate,
	},
	"strategic merge patch that drops the gate": {
		from:        managed,
		try:         patchOf(types.StrategicMergePatchType, `{"spec":{"schedulingGates":[{"$patch":"delete","name":"`+berthv1alpha1.LeaseHeldSchedulingGate+`"}]}}`),
		wantWebhook: gateRemoved, wantPolicy: policyGate,
	},
	"gate and labels dropped at once, so that the old Pod is the only managed one": {
		from: managed,
		try: mergePatch(`{"metadata":{"labels":{"` + berthv1alpha1.ManagedLeaseLabel + `":null,"` + berthv1alpha1.ManagedLeaseUIDLabel + `":null}},` +
			`"spec":{"schedulingGates":null}}`),
		wantWebhook: gateRemoved, wantPolicy: "is reserved to the Berth agent",
	},
	"relabelled to another BerthLease": {
		from:        managed,
		try:         mergePatch(`{"metadata":{"labels":{"` + berthv1alpha1.ManagedLeaseLabel + `":"other"}}}`),
		wantWebhook: "changing or removing label " + berthv1alpha1.ManagedLeaseLabel, wantPolicy: policyLabels,
	},
	"lease label removed": {
		from:        managed,
		try:         patchOf(types.JSONPatchType, `[{"op":"remove","path":"/metadata/labels/`+esc(berthv1alpha1.ManagedLeaseLabel)+`"}]`),
		wantWebhook: "changing or removing label " + berthv1alpha1.ManagedLeaseLabel, wantPolicy: policyLabels,
	},
	"UID label removed": {
		from:        managed,
		try:         mergePatch(`{"metadata":{"labels":{"` + berthv1alpha1.ManagedLeaseUIDLabel + `":null}}}`),
		wantWebhook: "changing, adding or removing label " + berthv1alpha1.ManagedLeaseUIDLabel, wantPolicy: policyLabels,
	},
	"labels changed through pods/status": {
		from: managed,
		try: func(ctx context.Context, c ctrlclient.Client, _ *suite, pod *corev1.Pod, _ string) error {
			patch := `{"metadata":{"labels":{"` + berthv1alpha1.ManagedLeaseLabel + `":"other"}}}`
			return c.Status().Patch(ctx, pod, ctrlclient.RawPatch(types.MergePatchType, []byte(patch)))
		},
		wantWebhook: "changing or removing label " + berthv1alpha1.ManagedLeaseLabel, wantPolicy: policyLabels,
	},
	"fencing token forged": {
		from:        managed,
		try:         mergePatch(`{"metadata":{"annotations":{"` + berthv1alpha1.FencingTokenAnnotation + `":"999"}}}`),
		wantWebhook: "changing annotation " + berthv1alpha1.FencingTokenAnnotation, wantPolicy: policyTerm,
	},
	"Pod made managed after creation": {
		from:        func(s *suite, name string) *corev1.Pod { return s.pod(name, unmanaged) },
		try:         mergePatch(`{"metadata":{"labels":{"` + berthv1alpha1.ManagedLeaseLabel + `":"` + leaseName + `"}}}`),
		wantWebhook: "adding label " + berthv1alpha1.ManagedLeaseLabel + " to an existing Pod", wantPolicy: policyLabels,
	},
	"managed Pod created without the gate (no mutation)": {
		try:         createPod(ungated),
		wantWebhook: "must be created with scheduling gate", wantPolicy: policyCreated,
	},
	"managed Pod created bound to a node": {
		try:         createPod(ungated, onNode),
		wantWebhook: "must not set spec.nodeName", wantPolicy: "berth: a managed Pod",
	},
	"managed Pod created gated and bound to a node": {
		// The API server itself refuses a gated Pod with a node, before admission.
		try:         createPod(onNode),
		wantWebhook: "spec.nodeName: Forbidden", wantPolicy: "spec.nodeName: Forbidden",
	},
	"managed Pod naming another BerthLease's UID": {
		try:         createPod(withUID("9f2d6f5e-0000-4000-8000-000000000000")),
		wantWebhook: "label " + berthv1alpha1.ManagedLeaseUIDLabel + ` is "9f2d6f5e-0000-4000-8000-000000000000" but BerthLease "exporter" has UID`,
	},
	"managed Pod stamped with a UID, naming a BerthLease that does not exist": {
		// Admitted without the UID label (it waits for its BerthLease, TestOrderIndependence
		// in test/e2e), but never with a UID admission did not stamp.
		try:         createPod(func(p *corev1.Pod) { p.Labels[berthv1alpha1.ManagedLeaseLabel] = "absent" }),
		wantWebhook: `but BerthLease "absent" does not exist in namespace payments`,
	},
	"gated managed Pod bound through pods/binding": {
		// The API server refuses to bind a Pod that has scheduling gates, whoever asks.
		from: managed,
		try: func(ctx context.Context, c ctrlclient.Client, _ *suite, pod *corev1.Pod, _ string) error {
			binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
				Target: corev1.ObjectReference{Kind: "Node", Name: "cluster-1-node-1"}}
			return c.SubResource("binding").Create(ctx, pod, binding)
		},
		wantWebhook: "non-empty .spec.schedulingGates", wantPolicy: "non-empty .spec.schedulingGates",
	},
}

// bypasses runs every bypass as mallory and checks that it is denied with its message, and
// that a Pod it started from is still gated and labelled.
func (s *suite) bypasses(ctx context.Context, t *testing.T, policyOnly bool) {
	for name, tc := range bypasses {
		t.Run(name, func(t *testing.T) {
			want := tc.wantWebhook
			if policyOnly {
				want = tc.wantPolicy
			}
			if want == "" {
				t.Skip("the policy does not check this; the webhook does")
			}
			podName := s.name("bypass")
			var pod *corev1.Pod
			if tc.from != nil {
				pod = tc.from(s, podName)
				s.mustCreate(ctx, pod)
				pod = pod.DeepCopy()
			}
			err := tc.try(ctx, s.mallory, s, pod, podName)
			if err == nil || (!apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) && !apierrors.IsConflict(err)) {
				t.Fatalf("attempt not denied: err = %v", err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("denial %q does not say %q", err, want)
			}
			t.Logf("denied: %v", err)
			if tc.from == nil {
				if err := s.admin.Get(ctx, ctrlclient.ObjectKey{Namespace: namespace, Name: podName}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
					t.Errorf("Pod %s exists after a denied creation (get: %v)", podName, err)
				}
				return
			}
			got := &corev1.Pod{}
			if err := s.admin.Get(ctx, ctrlclient.ObjectKeyFromObject(pod), got); err != nil {
				t.Fatal(err)
			}
			if diff := diffBerth(tc.from(s, podName), got); diff != "" {
				t.Errorf("Pod changed by a denied attempt: %s", diff)
			}
		})
	}
}

// fenceConfig is the agent's configuration for fenced Pods in this suite.
var fenceConfig = admission.FenceConfig{Image: "registry.example/berth-agent:test", LeaseAPIURL: "https://leases.example:8443"}

// fenced tries, as mallory, to get the workload of a fenced BerthLease's Pod to run outside
// the genuine berth-fence: the mutating webhook replaces a look-alike installer, and the
// validating webhook refuses a ConfigMap mounted over the binary and an ephemeral
// container added through pods/ephemeralcontainers, to mallory and the agent alike.
func (s *suite) fenced(ctx context.Context, t *testing.T) {
	// A look-alike installer placed first, as a sidecar of another image: replaced.
	fake := s.fencedPod(s.name("fenced"), func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: admission.FenceInitContainer, Image: "registry.example/fake-fence",
			Command: []string{"/bin/sh", "-c", "cp /fake /berth/bin/berth-fence"}, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
			VolumeMounts: []corev1.VolumeMount{{Name: admission.FenceBinVolume, MountPath: admission.FenceBinDir}}}}
	})
	s.mustCreateAs(ctx, s.mallory, fake)
	got := &corev1.Pod{}
	if err := s.admin.Get(ctx, ctrlclient.ObjectKeyFromObject(fake), got); err != nil {
		t.Fatal(err)
	}
	inst := got.Spec.InitContainers[0]
	if inst.Name != admission.FenceInitContainer || inst.Image != fenceConfig.Image || inst.RestartPolicy != nil ||
		!slices.Equal(inst.Command, []string{admission.FenceImageBinary, "install", admission.FenceBinDir}) || len(got.Spec.InitContainers) != 1 {
		t.Errorf("init containers %+v, want only the installer from %s", got.Spec.InitContainers, fenceConfig.Image)
	}
	if cmd := got.Spec.Containers[0].Command; len(cmd) == 0 || cmd[0] != admission.FenceBinary {
		t.Errorf("main container's command %v, want it under %s", cmd, admission.FenceBinary)
	}

	// A ConfigMap's key mounted over the binary: refused.
	err := s.mallory.Create(ctx, s.fencedPod(s.name("fenced"), func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "fake", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "fake-fence"}}}})
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "fake", MountPath: admission.FenceBinary, SubPath: "berth-fence"}}
	}))
	if err := wantDenied(err, "container main mounts volume fake at "+admission.FenceBinary); err != nil {
		t.Errorf("ConfigMap over berth-fence: %v", err)
	}
	if n := decisionCount(t, "CREATE", "deny", admission.ReasonNotFenced); n < 1 {
		t.Errorf("berth_admission_decisions_total{CREATE,deny,NotFenced} = %v, want at least 1", n)
	}

	// An ephemeral container (kubectl debug) runs outside berth-fence: refused to everyone.
	for name, c := range map[string]ctrlclient.Client{"mallory": s.mallory, "the agent": s.agent} {
		debugged := got.DeepCopy()
		debugged.Spec.EphemeralContainers = append(debugged.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example/exporter:1", Command: []string{"/exporter"}}})
		err := c.SubResource("ephemeralcontainers").Update(ctx, debugged)
		if err := wantDenied(err, "adding ephemeral containers is refused"); err != nil {
			t.Errorf("ephemeral container added by %s: %v", name, err)
		}
	}
}

// fencedPod is a managed Pod of the fenced BerthLease, changed by opts, before mutation.
func (s *suite) fencedPod(name string, opts ...podOpt) *corev1.Pod {
	spec := podSpec()
	spec.Containers[0].Command = []string{"/exporter"}
	p := builders.Pod(namespace, name).Label("app", "fenced").ManagedBy(fencedLeaseName).ManagedUID(s.fencedUID).
		PodSpec(spec).Gated().Obj()
	for _, o := range opts {
		o(p)
	}
	return p
}

// webhookDown checks fail-closed with the webhook server stopped and its configurations
// in place.
func (s *suite) webhookDown(ctx context.Context, t *testing.T) {
	// Creating a managed Pod needs the webhook.
	err := s.admin.Create(ctx, s.pod(s.name("down")))
	if err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("managed Pod created with the webhook server down: err = %v", err)
	}

	// An unmanaged Pod does not need Berth's webhook.
	if err := s.mallory.Create(ctx, s.pod(s.name("unmanaged"), unmanaged)); err != nil {
		t.Errorf("unmanaged Pod not created with the webhook server down: %v", err)
	}
	// Nor does an update to one.
	plain := s.pod(s.name("unmanaged"), unmanaged)
	s.mustCreateAs(ctx, s.mallory, plain)
	if err := s.mallory.Patch(ctx, plain, ctrlclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"tier":"web"}}}`))); err != nil {
		t.Errorf("unmanaged Pod not updated with the webhook server down: %v", err)
	}

	// A managed Pod made before the outage cannot be ungated by others: the policy
	// answers before the webhook would be called.
	var gated corev1.PodList
	if err := s.admin.List(ctx, &gated, ctrlclient.InNamespace(namespace), ctrlclient.MatchingLabels{berthv1alpha1.ManagedLeaseLabel: leaseName}); err != nil {
		t.Fatal(err)
	}
	var target *corev1.Pod
	for i := range gated.Items {
		if len(gated.Items[i].Spec.SchedulingGates) > 0 && gated.Items[i].DeletionTimestamp == nil {
			target = &gated.Items[i]
			break
		}
	}
	if target == nil {
		t.Fatal("no gated managed Pod left to try")
	}
	err = s.mallory.Patch(ctx, target, ctrlclient.RawPatch(types.MergePatchType, []byte(`{"spec":{"schedulingGates":null}}`)))
	if err == nil || !strings.Contains(err.Error(), policyGate) {
		t.Errorf("ungating by mallory with the webhook server down: err = %v, want the policy's denial", err)
	}
	// The agent cannot either: the webhook fails closed (the agent serves it, so they are
	// down together).
	err = s.agent.Patch(ctx, target, ctrlclient.RawPatch(types.MergePatchType, []byte(`{"spec":{"schedulingGates":null}}`)))
	if err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("ungating by the agent with the webhook server down: err = %v, want the webhook call to fail", err)
	}
}

// managedDeployment creates, as mallory, a Deployment whose template is managed (label
// only) and returns its Pods once the ReplicaSet made them: gated and stamped.
func (s *suite) managedDeployment(ctx context.Context, t *testing.T) []corev1.Pod {
	t.Helper()
	d := builders.Deployment(namespace, "exporter").ManagedBy(leaseName).Replicas(2).PodSpec(podSpec()).Obj()
	if err := s.mallory.Create(ctx, d); err != nil {
		t.Fatalf("create Deployment: %v", err)
	}
	var pods corev1.PodList
	s.eventually("Deployment's Pods created", func() error {
		if err := s.admin.List(ctx, &pods, ctrlclient.InNamespace(namespace), ctrlclient.MatchingLabels{"app": "exporter"}); err != nil {
			return err
		}
		if len(pods.Items) != 2 {
			return fmt.Errorf("%d Pods, want 2", len(pods.Items))
		}
		return nil
	})
	for _, p := range pods.Items {
		if err := checkStamped(&p, s.leaseUID); err != nil {
			t.Errorf("Deployment's Pod %s: %v", p.Name, err)
		}
		if p.Spec.NodeName != "" {
			t.Errorf("gated Pod %s scheduled to %s", p.Name, p.Spec.NodeName)
		}
	}
	return pods.Items
}

// ungate removes the gate as the agent does and checks that the scheduler then binds the
// Pod.
func (s *suite) ungate(ctx context.Context, t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := s.agent.Get(ctx, ctrlclient.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	pod.Spec.SchedulingGates = nil
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[berthv1alpha1.FencingTokenAnnotation] = "1"
	pod.Annotations[berthv1alpha1.HolderAnnotation] = "cluster-1"
	if err := s.agent.Update(ctx, pod); err != nil {
		t.Fatalf("agent ungates %s: %v", pod.Name, err)
	}
	s.eventually("ungated Pod "+pod.Name+" scheduled", func() error {
		got := &corev1.Pod{}
		if err := s.admin.Get(ctx, ctrlclient.ObjectKeyFromObject(pod), got); err != nil {
			return err
		}
		if got.Spec.NodeName == "" {
			return errors.New("not scheduled")
		}
		return nil
	})
}

// checkPolicyTypes fails when the API server's type check of the policy warns.
func (s *suite) checkPolicyTypes(ctx context.Context, t *testing.T) {
	t.Helper()
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	s.eventually("policy type-checked", func() error {
		if err := s.admin.Get(ctx, ctrlclient.ObjectKey{Name: admission.PolicyName}, vap); err != nil {
			return err
		}
		if vap.Status.ObservedGeneration != vap.Generation {
			return errors.New("not yet type-checked")
		}
		return nil
	})
	if vap.Status.TypeChecking == nil {
		return
	}
	for _, w := range vap.Status.TypeChecking.ExpressionWarnings {
		t.Errorf("policy %s: %s", w.FieldRef, w.Warning)
	}
}

// setUpCluster installs the CRD, a BerthLease, and RBAC that lets mallory and the agent
// create, update and patch Pods (and mallory Deployments and bindings).
func (s *suite) setUpCluster(ctx context.Context, cfg *rest.Config) {
	t := s.t
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("..", "deploy", "crd")}, Scheme: scheme}); err != nil {
		t.Fatalf("install CRDs: %v", err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-editor"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/status", "pods/ephemeralcontainers"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "create", "delete"}},
		},
	}
	bind := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-editor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{
			{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: mallory},
			{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: agentUser},
		},
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	lease := builders.BerthLease(namespace, leaseName).TTL(30).Heartbeat(10).Obj()
	fencedLease := builders.BerthLease(namespace, fencedLeaseName).TTL(30).Heartbeat(10).PodFencing(berthv1alpha1.PodFencingExec).Obj()
	s.create(ctx, role, bind, ns)
	s.eventually("BerthLease created", func() error { return s.admin.Create(ctx, lease) })
	s.create(ctx, fencedLease)
	s.leaseUID, s.fencedUID = lease.UID, fencedLease.UID
}

// serveAdmission runs WorkloadAdmission (with mutation) in a manager's webhook server on
// 127.0.0.1 with a certificate from a test CA; it returns the server's URL, the CA's
// certificate as CA bundle, and a function that stops the server.
func serveAdmission(t *testing.T, cfg *rest.Config) (string, []byte, func()) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.WriteServing(dir, "berth-admission-test", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := admission.SetupWorkloadAdmission(mgr, &admission.WorkloadAdmission{OperatorUser: agentUser, Mutate: true, Fence: fenceConfig}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
	t.Cleanup(stop)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	poll.ForNoError(t, 30*time.Second, "webhook server serving", func() error {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		if err != nil {
			return err
		}
		return conn.Close()
	})
	return "https://" + addr, ca, stop
}

func newClient(t *testing.T, cfg *rest.Config) ctrlclient.Client {
	t.Helper()
	c, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// decisionCount reads berth_admission_decisions_total{operation,decision,reason} from
// controller-runtime's registry.
func decisionCount(t *testing.T, op, decision string, reason admission.Reason) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"operation": op, "decision": decision, "reason": string(reason)}
	for _, f := range families {
		if f.GetName() != "berth_admission_decisions_total" {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

type podOpt func(*corev1.Pod)

func unstamped(p *corev1.Pod) { delete(p.Labels, berthv1alpha1.ManagedLeaseUIDLabel) }
func ungated(p *corev1.Pod)   { p.Spec.SchedulingGates = nil }
func unmanaged(p *corev1.Pod) {
	unstamped(p)
	ungated(p)
	delete(p.Labels, berthv1alpha1.ManagedLeaseLabel)
}
func onNode(p *corev1.Pod) { p.Spec.NodeName = "cluster-1-node-1" }
func withUID(uid string) podOpt {
	return func(p *corev1.Pod) { p.Labels[berthv1alpha1.ManagedLeaseUIDLabel] = uid }
}
func (s *suite) name(prefix string) string { s.seq++; return fmt.Sprintf("%s-%d", prefix, s.seq) }

func podSpec() corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Containers:                    []corev1.Container{{Name: "main", Image: "registry.example/exporter:1"}},
	}
}

// pod is a managed Pod as admission leaves it at creation, changed by opts.
func (s *suite) pod(name string, opts ...podOpt) *corev1.Pod {
	p := builders.Pod(namespace, name).Label("app", "bypass").ManagedBy(leaseName).ManagedUID(s.leaseUID).
		PodSpec(podSpec()).Gated().Obj()
	for _, o := range opts {
		o(p)
	}
	return p
}

func checkStamped(p *corev1.Pod, uid types.UID) error {
	if len(p.Spec.SchedulingGates) != 1 || p.Spec.SchedulingGates[0].Name != berthv1alpha1.LeaseHeldSchedulingGate {
		return fmt.Errorf("scheduling gates %v, want [%s]", p.Spec.SchedulingGates, berthv1alpha1.LeaseHeldSchedulingGate)
	}
	if got := p.Labels[berthv1alpha1.ManagedLeaseUIDLabel]; got != string(uid) {
		return fmt.Errorf("label %s = %q, want %q", berthv1alpha1.ManagedLeaseUIDLabel, got, uid)
	}
	return nil
}

// diffBerth says how got differs from want in what Berth guards.
func diffBerth(want, got *corev1.Pod) string {
	var diffs []string
	g := func(p *corev1.Pod) bool { return len(p.Spec.SchedulingGates) > 0 }
	if g(want) != g(got) {
		diffs = append(diffs, fmt.Sprintf("gated %v, want %v", g(got), g(want)))
	}
	for _, k := range []string{berthv1alpha1.ManagedLeaseLabel, berthv1alpha1.ManagedLeaseUIDLabel} {
		if want.Labels[k] != got.Labels[k] {
			diffs = append(diffs, fmt.Sprintf("label %s = %q, want %q", k, got.Labels[k], want.Labels[k]))
		}
	}
	for _, k := range []string{berthv1alpha1.FencingTokenAnnotation, berthv1alpha1.HolderAnnotation} {
		if want.Annotations[k] != got.Annotations[k] {
			diffs = append(diffs, fmt.Sprintf("annotation %s = %q, want %q", k, got.Annotations[k], want.Annotations[k]))
		}
	}
	if g(want) && got.Spec.NodeName != "" {
		diffs = append(diffs, "bound to "+got.Spec.NodeName)
	}
	return strings.Join(diffs, "; ")
}

func wantDenied(err error, want string) error {
	switch {
	case err == nil:
		return errors.New("allowed")
	case !strings.Contains(err.Error(), want):
		return fmt.Errorf("denied without %q: %w", want, err)
	}
	return nil
}

func (s *suite) create(ctx context.Context, objs ...ctrlclient.Object) {
	s.t.Helper()
	for _, o := range objs {
		if err := s.admin.Create(ctx, o); err != nil {
			s.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func (s *suite) mustCreate(ctx context.Context, p *corev1.Pod) { s.mustCreateAs(ctx, s.admin, p) }

func (s *suite) mustCreateAs(ctx context.Context, c ctrlclient.Client, p *corev1.Pod) {
	s.t.Helper()
	if err := c.Create(ctx, p); err != nil {
		s.t.Fatalf("create Pod %s: %v", p.Name, err)
	}
}

// eventually retries f until it returns nil, for at most 30 seconds.
func (s *suite) eventually(what string, f func() error) {
	s.t.Helper()
	poll.ForNoError(s.t, 30*time.Second, what, f)
}
