package admission

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// Names of the objects Manifests renders.
const (
	// WebhookConfigurationName names both the mutating and the validating webhook
	// configuration.
	WebhookConfigurationName = "berth-workload-admission"
	// PolicyName names the ValidatingAdmissionPolicy and its binding.
	PolicyName = "berth-managed-pods"
	// FinalizerPolicyName names the ValidatingAdmissionPolicy, and its
	// binding, that reserves removing a BerthLease's finalizer to the agent.
	FinalizerPolicyName = "berth-berthlease-finalizer"

	mutatingWebhookName    = "pods.mutate.berth.skaphos.io"
	validatingWebhookName  = "pods.validate.berth.skaphos.io"
	subresourceWebhookName = "pod-subresources.validate.berth.skaphos.io"
)

// DefaultOperatorUser is the Berth agent's user when it runs as the service account
// berth-agent in namespace berth-system, as deploy/ installs it.
const DefaultOperatorUser = "system:serviceaccount:berth-system:berth-agent"

// ManifestOptions says how the API server reaches the webhooks and who the agent is.
type ManifestOptions struct {
	// OperatorUser is the agent's user name; default DefaultOperatorUser.
	OperatorUser string
	// Mutate adds the MutatingWebhookConfiguration (see WorkloadAdmission.Mutate).
	Mutate bool
	// Service is the Service in front of the agent's webhook server (its Path is ignored).
	// Exactly one of Service and URL is set.
	Service *admissionregistrationv1.ServiceReference
	// URL is the webhook server's base URL, https://host:port, for a server outside the
	// cluster (tests).
	URL string
	// CABundle is the PEM of the CA that signed the webhook server's certificate. Empty
	// leaves it to a CA injector (see Annotations).
	CABundle []byte
	// Annotations go on both webhook configurations, for example
	// cert-manager.io/inject-ca-from.
	Annotations map[string]string
	// TimeoutSeconds bounds each webhook call; default 10.
	TimeoutSeconds int32
}

const defaultTimeoutSeconds = 10

// Manifests renders Berth's admission registrations: the MutatingWebhookConfiguration
// (when opts.Mutate), the ValidatingWebhookConfiguration, and the ValidatingAdmissionPolicy
// and its binding, and the ValidatingAdmissionPolicy that keeps BerthLeases' finalizer, and
// its binding, in that order. Every registration fails closed (failurePolicy Fail) and
// matches every namespace and object; match conditions on the old and the new object send
// only requests that concern Berth's Pods, so Pods that are not managed never depend on the
// webhook server. docs/admission.md gives the argument.
func Manifests(opts ManifestOptions) ([]ctrlclient.Object, error) {
	if opts.OperatorUser == "" {
		opts.OperatorUser = DefaultOperatorUser
	}
	if opts.TimeoutSeconds == 0 {
		opts.TimeoutSeconds = defaultTimeoutSeconds
	}
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("render admission manifests: %w", err)
	}
	var objs []ctrlclient.Object
	if opts.Mutate {
		objs = append(objs, mutatingConfiguration(opts))
	}
	objs = append(objs, validatingConfiguration(opts), policy(opts.OperatorUser), policyBinding(PolicyName),
		finalizerPolicy(opts.OperatorUser), policyBinding(FinalizerPolicyName))
	return objs, nil
}

func (o ManifestOptions) validate() error {
	var errs []error
	if !utf8.ValidString(o.OperatorUser) {
		errs = append(errs, errors.New("OperatorUser is not valid UTF-8"))
	}
	switch {
	case (o.Service == nil) == (o.URL == ""):
		errs = append(errs, errors.New("set exactly one of Service and URL"))
	case o.URL != "":
		u, err := url.Parse(o.URL)
		if err != nil {
			errs = append(errs, fmt.Errorf("URL: %w", err))
		} else if u.Scheme != "https" || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.User != nil {
			errs = append(errs, fmt.Errorf("URL %q: want https://host[:port] with no path, query or user", o.URL))
		}
	case o.Service.Namespace == "" || o.Service.Name == "":
		errs = append(errs, errors.New("the Service needs a namespace and a name"))
	}
	if o.TimeoutSeconds < 1 || o.TimeoutSeconds > 30 {
		errs = append(errs, fmt.Errorf("TimeoutSeconds %d: want 1 to 30", o.TimeoutSeconds))
	}
	return errors.Join(errs...)
}

func clientConfig(o ManifestOptions, path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: o.CABundle}
	if o.URL != "" {
		cc.URL = ptr.To(strings.TrimSuffix(o.URL, "/") + path)
		return cc
	}
	svc := *o.Service
	svc.Path = ptr.To(path)
	cc.Service = &svc
	return cc
}

func podRule(ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: ops,
		Rule: admissionregistrationv1.Rule{
			APIGroups:   []string{""},
			APIVersions: []string{"v1"},
			Resources:   []string{"pods"},
			Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}
}

func mutatingConfiguration(o ManifestOptions) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: WebhookConfigurationName, Labels: labels(), Annotations: maps.Clone(o.Annotations)},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    mutatingWebhookName,
			ClientConfig:            clientConfig(o, MutatePath),
			Rules:                   []admissionregistrationv1.RuleWithOperations{podRule(admissionregistrationv1.Create)},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       &metav1.LabelSelector{},
			ObjectSelector:          &metav1.LabelSelector{},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(o.TimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "managed-pod",
				Expression: celHasLabel("object", berthv1alpha1.ManagedLeaseLabel),
			}},
		}},
	}
}

func validatingConfiguration(o ManifestOptions) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: WebhookConfigurationName, Labels: labels(), Annotations: maps.Clone(o.Annotations)},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    validatingWebhookName,
			ClientConfig:            clientConfig(o, ValidatePath),
			Rules:                   []admissionregistrationv1.RuleWithOperations{podRule(admissionregistrationv1.Create, admissionregistrationv1.Update)},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       &metav1.LabelSelector{},
			ObjectSelector:          &metav1.LabelSelector{},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(o.TimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "berth-pod",
				Expression: celBerth("object") + " || " + celBerth("oldObject"),
			}},
		}, {
			// A Pod's subresources that take a whole Pod can write its labels and
			// annotations too (pods/status does; the others drop such changes today).
			// Only the requests that change Berth's labels or annotations are sent, so
			// that status updates, which kubelets make all the time, never wait on Berth;
			// and every pods/ephemeralcontainers request on a Pod berth-fence guards,
			// because an ephemeral container would run outside it (DecideUpdate).
			Name:                    subresourceWebhookName,
			ClientConfig:            clientConfig(o, ValidatePath),
			Rules:                   []admissionregistrationv1.RuleWithOperations{podSubresourceRule()},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       &metav1.LabelSelector{},
			ObjectSelector:          &metav1.LabelSelector{},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(o.TimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "changes-berth-metadata-or-debugs-fenced",
				Expression: "!(" + celLabelsKept + " && " + celTermKept + ") || " + celDebugsFenced,
			}},
		}},
	}
}

// podSubresources are the subresources of a Pod whose requests carry a whole Pod.
var podSubresources = []string{"pods/status", "pods/ephemeralcontainers", "pods/resize"}

func podSubresourceRule() admissionregistrationv1.RuleWithOperations {
	r := podRule(admissionregistrationv1.Update)
	r.Resources = podSubresources
	return r
}

// policy repeats the core rules in the API server, where no webhook outage reaches them.
// Besides Pods it matches the subresources that carry a whole Pod: pods/status can write
// a Pod's labels and annotations too.
func policy(operatorUser string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	reserved := func(what string) string {
		return celString("berth: "+what+" is reserved to the Berth agent ("+operatorUser+"); user ") +
			" + request.userInfo.username + " + celString(" may not")
	}
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Labels: labels()},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: matchEverywhere(admissionregistrationv1.Rule{
				APIGroups:   []string{""},
				APIVersions: []string{"v1"},
				Resources:   append([]string{"pods"}, podSubresources...),
				Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
			}, admissionregistrationv1.Create, admissionregistrationv1.Update),
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "berth-pod",
				Expression: celBerth("object") + " || " + celBerth("oldObject"),
			}},
			Variables: []admissionregistrationv1.Variable{
				{Name: "agent", Expression: "request.userInfo.username == " + celString(operatorUser)},
				{Name: "managed", Expression: celHasLabel("object", berthv1alpha1.ManagedLeaseLabel)},
				{Name: "gated", Expression: celGated("object")},
				{Name: "wasGated", Expression: celGated("oldObject")},
				{Name: "labelsKept", Expression: celLabelsKept},
				{Name: "termKept", Expression: celTermKept},
			},
			Validations: []admissionregistrationv1.Validation{
				{
					Expression: `request.operation != "CREATE" || !variables.managed || variables.gated`,
					Message: fmt.Sprintf("berth: a managed Pod (label %s) must be created with scheduling gate %s, so that it runs only while this cluster holds the lease",
						berthv1alpha1.ManagedLeaseLabel, berthv1alpha1.LeaseHeldSchedulingGate),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: `request.operation != "CREATE" || !variables.managed || !has(object.spec.nodeName) || object.spec.nodeName == ""`,
					Message:    "berth: a managed Pod must not set spec.nodeName: a Pod bound at creation would skip the scheduling gate",
					Reason:     ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        `request.operation != "UPDATE" || variables.agent || !variables.wasGated || variables.gated`,
					MessageExpression: reserved("removing scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate),
					Message:           "berth: removing scheduling gate " + berthv1alpha1.LeaseHeldSchedulingGate + " is reserved to the Berth agent",
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        `request.operation != "UPDATE" || variables.agent || variables.labelsKept`,
					MessageExpression: reserved("adding, changing or removing labels " + berthv1alpha1.ManagedLeaseLabel + " and " + berthv1alpha1.ManagedLeaseUIDLabel),
					Message:           "berth: adding, changing or removing the managed labels is reserved to the Berth agent",
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        `request.operation != "UPDATE" || variables.agent || variables.termKept`,
					MessageExpression: reserved("changing annotations " + berthv1alpha1.FencingTokenAnnotation + " and " + berthv1alpha1.HolderAnnotation),
					Message:           "berth: changing the term annotations is reserved to the Berth agent",
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
			},
		},
	}
}

// finalizerPolicy reserves removing the finalizer of a BerthLease to the agent. The
// finalizer is what makes the agent stop a BerthLease's Pods and give its lease up before
// the object goes; a BerthLease deleted without it would leave its Pods running with no one
// renewing the lease, and another cluster would start the workload once it expired. (The
// agent also stops the Pods of a BerthLease it finds gone, but only while it runs.) An
// administrator who must remove the finalizer without the agent deletes this policy's
// binding first, knowingly.
func finalizerPolicy(operatorUser string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: FinalizerPolicyName, Labels: labels()},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: matchEverywhere(admissionregistrationv1.Rule{
				APIGroups:   []string{berthv1alpha1.GroupVersion.Group},
				APIVersions: []string{"*"},
				Resources:   []string{"berthleases"},
				Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
			}, admissionregistrationv1.Update),
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "removes-finalizer",
				Expression: celHasFinalizer("oldObject") + " && !" + celHasFinalizer("object"),
			}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "request.userInfo.username == " + celString(operatorUser),
				MessageExpression: celString("berth: removing finalizer "+berthv1alpha1.LeaseReleaseFinalizer+" is reserved to the Berth agent ("+operatorUser+
					"), which removes it once the BerthLease's Pods are stopped and its lease is given up; user ") +
					" + request.userInfo.username + " + celString(" may not. Delete the BerthLease and let the agent finish"),
				Message: "berth: removing finalizer " + berthv1alpha1.LeaseReleaseFinalizer + " is reserved to the Berth agent",
				Reason:  ptr.To(metav1.StatusReasonForbidden),
			}},
		},
	}
}

// matchEverywhere matches rule's operations in every namespace and on every object: a
// policy that selected less would leave a way past it.
func matchEverywhere(rule admissionregistrationv1.Rule, ops ...admissionregistrationv1.OperationType) *admissionregistrationv1.MatchResources {
	return &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{},
		ObjectSelector:    &metav1.LabelSelector{},
		MatchPolicy:       ptr.To(admissionregistrationv1.Equivalent),
		ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
			RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: rule},
		}},
	}
}

// celHasFinalizer is true when obj carries the agent's finalizer.
func celHasFinalizer(obj string) string {
	return fmt.Sprintf("(has(%[1]s.metadata.finalizers) && %[2]s in %[1]s.metadata.finalizers)", obj, celString(berthv1alpha1.LeaseReleaseFinalizer))
}

func policyBinding(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels()},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}

func labels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": "berth", "app.kubernetes.io/component": "admission"}
}

// celString is s as a CEL string literal. CEL's escapes are a superset of those
// strconv.Quote writes for valid UTF-8.
func celString(s string) string { return strconv.Quote(s) }

// celHasLabel is true when obj (object or oldObject, null on CREATE) has label key.
func celHasLabel(obj, key string) string {
	return celHas(obj, "labels", key)
}

func celHas(obj, field, key string) string {
	return fmt.Sprintf("(%[1]s != null && has(%[1]s.metadata.%[2]s) && %[3]s in %[1]s.metadata.%[2]s)", obj, field, celString(key))
}

// celGated is true when obj carries Berth's scheduling gate.
func celGated(obj string) string {
	return fmt.Sprintf("(%[1]s != null && has(%[1]s.spec.schedulingGates) && %[1]s.spec.schedulingGates.exists(g, g.name == %[2]s))",
		obj, celString(berthv1alpha1.LeaseHeldSchedulingGate))
}

// celBerth is true when obj carries any of Berth's marks: a managed label or the gate.
func celBerth(obj string) string {
	return "(" + celHasLabel(obj, berthv1alpha1.ManagedLeaseLabel) + " || " + celHasLabel(obj, berthv1alpha1.ManagedLeaseUIDLabel) + " || " + celGated(obj) + ")"
}

// celSame is true when object and oldObject agree on metadata.<field>[key]: both lack it
// or both have it with the same value. Only for UPDATE, where both are set.
func celSame(field, key string) string {
	return fmt.Sprintf("(%[1]s == %[2]s && (!%[2]s || oldObject.metadata.%[3]s[%[4]s] == object.metadata.%[3]s[%[4]s]))",
		celHas("oldObject", field, key), celHas("object", field, key), field, celString(key))
}

// celLabelsKept and celTermKept are true when an update leaves the managed labels, and the
// term annotations, as they were.
var (
	celLabelsKept = celSame("labels", berthv1alpha1.ManagedLeaseLabel) + " && " + celSame("labels", berthv1alpha1.ManagedLeaseUIDLabel)
	celTermKept   = celSame("annotations", berthv1alpha1.FencingTokenAnnotation) + " && " + celSame("annotations", berthv1alpha1.HolderAnnotation)
)

// celFenced is true when obj was made with berth-fence in it (fencedPod): it has the
// fence's volume or its installer.
func celFenced(obj string) string {
	return fmt.Sprintf("(%[1]s != null && ((has(%[1]s.spec.volumes) && %[1]s.spec.volumes.exists(v, v.name == %[2]s)) || "+
		"(has(%[1]s.spec.initContainers) && %[1]s.spec.initContainers.exists(c, c.name == %[3]s))))",
		obj, celString(FenceVolume), celString(FenceInitContainer))
}

// celDebugsFenced is true for a pods/ephemeralcontainers request on a Pod berth-fence
// guards. Kubelets never make such requests, so only kubectl debug and its like wait on
// Berth, and only for fenced Pods.
var celDebugsFenced = `(request.subResource == "ephemeralcontainers" && ` + celFenced("oldObject") + ")"

// YAML renders objects as one stream of YAML documents, each opened by "---", as
// kubectl apply and Helm templates take them: without status or creation timestamps.
func YAML(objs []ctrlclient.Object) ([]byte, error) {
	var b bytes.Buffer
	for _, o := range objs {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, fmt.Errorf("convert %s: %w", o.GetName(), err)
		}
		delete(u, "status")
		if meta, ok := u["metadata"].(map[string]any); ok {
			delete(meta, "creationTimestamp")
		}
		y, err := yaml.Marshal(u)
		if err != nil {
			return nil, fmt.Errorf("marshal %s: %w", o.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes(), nil
}
