package charts

import (
	stdcmp "cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/berthfleet/berth/admission"
)

// The values every agent install needs.
var agentRequired = Values{"leaseApi.url=https://leases.example.com:8443", "leaseApi.token.existingSecret=lease-api-token", "clusterId=east"}

// The values every lease API install needs.
var leaseAPIRequired = Values{"tls.existingSecret=leaseapi-tls", "auth.tokens.existingSecret=leaseapi-tokens"}

func with(base Values, more ...string) Values { return append(slices.Clone(base), more...) }

// rendered is a chart's output, by kind and name.
type rendered map[string]*unstructured.Unstructured

func (r rendered) get(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o, ok := r[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %s rendered; have %v", kind, name, r.keys())
	}
	return o
}

func (r rendered) has(kind, name string) bool { _, ok := r[kind+"/"+name]; return ok }

func (r rendered) keys() []string {
	var ks []string
	for k := range r {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func (r rendered) kinds() []string {
	var ks []string
	for _, o := range r {
		ks = append(ks, o.GetKind())
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

func into[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("convert %s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return out
}

func render(t *testing.T, release, chart, namespace string, values Values) (rendered, error) {
	t.Helper()
	objs, err := Template(t.Context(), release, chart, namespace, values)
	if err != nil {
		return nil, err
	}
	out := rendered{}
	for _, o := range objs {
		key := o.GetKind() + "/" + o.GetName()
		if _, dup := out[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		out[key] = o
	}
	return out, nil
}

// checkRestricted fails unless the Pod template meets the restricted Pod Security
// profile's rules that a chart controls (the install tests have a real API server
// enforce the whole profile).
func checkRestricted(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("Pod security context %+v: want runAsNonRoot and the RuntimeDefault seccomp profile", sc)
	}
	for _, c := range spec.Containers {
		csc := c.SecurityContext
		if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || csc.Capabilities == nil ||
			!slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
			t.Errorf("container %s security context %+v: want no privilege escalation, every capability dropped, a read-only root", c.Name, csc)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s: want memory requests and limits, have %+v", c.Name, c.Resources)
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("container %s: want readiness and liveness probes", c.Name)
		}
	}
}

func argsOf(spec corev1.PodSpec) []string { return spec.Containers[0].Args }

func hasArg(args []string, arg string) bool { return slices.Contains(args, arg) }

// absent stands for a field the chart does not render.
const absent = "<absent>"

// grants reports whether a rendered role grants anything on resource.
func grants(t *testing.T, role *unstructured.Unstructured, resource string) bool {
	t.Helper()
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	for _, r := range rules {
		res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		if slices.Contains(res, resource) {
			return true
		}
	}
	return false
}

func webhookCABundles(t *testing.T, r rendered) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		o := r.get(t, kind, "berth-workload-admission")
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for _, h := range hooks {
			name, _, _ := unstructured.NestedString(h.(map[string]any), "name")
			ca, found, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "caBundle")
			if !found {
				ca = absent
			}
			out[name] = ca
		}
	}
	return out
}

func TestAgentChart(t *testing.T) {
	caPEM := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	cases := map[string]struct {
		release, namespace string
		values             Values
		wantErr            string
		check              func(t *testing.T, r rendered)
	}{
		"no lease API": {
			values:  Values{"leaseApi.token.existingSecret=x"},
			wantErr: "leaseApi.url is required",
		},
		"no token": {
			values:  Values{"leaseApi.url=https://leases.example.com"},
			wantErr: "leaseApi.token: set existingSecret",
		},
		"a cluster id that is not a DNS label": {
			values:  with(agentRequired, "clusterId=East_1"),
			wantErr: "clusterId",
		},
		"two replicas without leader election": {
			values:  with(agentRequired, "leaderElection=false"),
			wantErr: "leaderElection",
		},
		"an unknown certificate mode": {
			values:  with(agentRequired, "webhook.certificates.mode=vault"),
			wantErr: "mode",
		},
		"an unknown value": {
			values:  with(agentRequired, "replicas=3"),
			wantErr: "replicas",
		},
		"defaults: agent-managed certificates, two replicas": {
			values: agentRequired,
			check: func(t *testing.T, r rendered) {
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-agent"))
				if *d.Spec.Replicas != 2 {
					t.Errorf("replicas %d, want 2", *d.Spec.Replicas)
				}
				checkRestricted(t, d.Spec.Template.Spec)
				args := argsOf(d.Spec.Template.Spec)
				for _, want := range []string{"--cluster-id=east", "--leader-elect=true", "--managed-workloads", "--operator-namespace=berth-system",
					"--webhook-cert-secret=berth-agent-webhook-tls", "--webhook-service=berth-agent-webhook", "--lease-api-url=https://leases.example.com:8443",
					"--lease-api-token-file=/var/run/berth/lease-api-token/token"} {
					if !hasArg(args, want) {
						t.Errorf("agent args %q lack %q", args, want)
					}
				}
				if d.Spec.Template.Spec.ServiceAccountName != "berth-agent" {
					t.Errorf("service account %q, want berth-agent", d.Spec.Template.Spec.ServiceAccountName)
				}
				r.get(t, "PodDisruptionBudget", "berth-agent")
				r.get(t, "Service", "berth-agent-webhook")
				r.get(t, "CustomResourceDefinition", "berthleases.berth.skaphos.io")
				r.get(t, "Role", "berth-agent")
				r.get(t, "ClusterRole", "berth-agent")
				for hook, ca := range webhookCABundles(t, r) {
					if ca != absent {
						t.Errorf("webhook %s caBundle %q: want none rendered (the agent owns the field)", hook, ca)
					}
				}
				if !grants(t, r.get(t, "ClusterRole", "berth-agent"), "validatingwebhookconfigurations") || !grants(t, r.get(t, "Role", "berth-agent"), "secrets") {
					t.Error("the agent may not manage its certificate in agent mode")
				}
				vap := r.get(t, "ValidatingAdmissionPolicy", "berth-managed-pods")
				if y, _ := json.Marshal(vap.Object); !strings.Contains(string(y), `system:serviceaccount:berth-system:berth-agent`) {
					t.Errorf("the policy does not reserve ungating to the chart's account:\n%s", y)
				}
				if r.has("Certificate", "berth-agent-webhook") {
					t.Error("a cert-manager Certificate is rendered in agent mode")
				}
			},
		},
		"another namespace and release": {
			release: "berth", namespace: "ops",
			values: agentRequired,
			check: func(t *testing.T, r rendered) {
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-berth-agent"))
				if d.Spec.Template.Spec.ServiceAccountName != "berth-berth-agent" {
					t.Errorf("service account %q", d.Spec.Template.Spec.ServiceAccountName)
				}
				vap := r.get(t, "ValidatingAdmissionPolicy", "berth-managed-pods")
				if y, _ := json.Marshal(vap.Object); !strings.Contains(string(y), `system:serviceaccount:ops:berth-berth-agent`) {
					t.Errorf("the policy does not name the release's account:\n%s", y)
				}
				cfg := into[admissionregistrationv1.MutatingWebhookConfiguration](t, r.get(t, "MutatingWebhookConfiguration", "berth-workload-admission"))
				want := &admissionregistrationv1.ServiceReference{Namespace: "ops", Name: "berth-berth-agent-webhook", Path: ptr.To("/mutate-pods"), Port: ptr.To[int32](443)}
				if diff := cmp.Diff(want, cfg.Webhooks[0].ClientConfig.Service); diff != "" {
					t.Errorf("webhook service (-want +got):\n%s", diff)
				}
			},
		},
		"cert-manager with its own CA": {
			values: with(agentRequired, "webhook.certificates.mode=certManager"),
			check: func(t *testing.T, r rendered) {
				for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
					if got := r.get(t, kind, "berth-workload-admission").GetAnnotations()["cert-manager.io/inject-ca-from"]; got != "berth-system/berth-agent-webhook" {
						t.Errorf("%s inject-ca-from %q", kind, got)
					}
				}
				r.get(t, "Certificate", "berth-agent-webhook")
				r.get(t, "Issuer", "berth-agent-webhook-ca")
				for hook, ca := range webhookCABundles(t, r) {
					if ca != absent {
						t.Errorf("webhook %s caBundle %q: want none rendered (cert-manager's injector owns the field)", hook, ca)
					}
				}
				if grants(t, r.get(t, "ClusterRole", "berth-agent"), "validatingwebhookconfigurations") || grants(t, r.get(t, "Role", "berth-agent"), "secrets") {
					t.Error("the agent gets rights on Secrets or webhook registrations under cert-manager")
				}
				r.get(t, "Issuer", "berth-agent-selfsigned")
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-agent"))
				if args := argsOf(d.Spec.Template.Spec); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--webhook-cert-secret") }) {
					t.Errorf("the agent manages certificates under cert-manager: %q", args)
				}
				if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
					return v.Secret != nil && v.Secret.SecretName == "berth-agent-webhook-tls"
				}) {
					t.Error("the certificate's Secret is not mounted")
				}
			},
		},
		"cert-manager with an issuer of yours": {
			values: with(agentRequired, "webhook.certificates.mode=certManager", "webhook.certificates.certManager.issuerRef.name=corp", "webhook.certificates.certManager.issuerRef.kind=ClusterIssuer"),
			check: func(t *testing.T, r rendered) {
				if got := r.kinds(); slices.Contains(got, "Issuer") {
					t.Errorf("an Issuer is rendered although one is given: %v", r.keys())
				}
				ref, _, _ := unstructured.NestedStringMap(r.get(t, "Certificate", "berth-agent-webhook").Object, "spec", "issuerRef")
				if diff := cmp.Diff(map[string]string{"name": "corp", "kind": "ClusterIssuer"}, ref); diff != "" {
					t.Errorf("issuerRef (-want +got):\n%s", diff)
				}
			},
		},
		"a certificate Secret of yours": {
			values: with(agentRequired, "webhook.certificates.mode=secret", "webhook.certificates.secret.name=mine", "webhook.certificates.secret.caBundle="+caPEM),
			check: func(t *testing.T, r rendered) {
				want := base64.StdEncoding.EncodeToString([]byte(caPEM))
				for hook, ca := range webhookCABundles(t, r) {
					if ca != want {
						t.Errorf("webhook %s caBundle %q, want %q", hook, ca, want)
					}
				}
			},
		},
		"a certificate Secret without its CA": {
			values:  with(agentRequired, "webhook.certificates.mode=secret", "webhook.certificates.secret.name=mine"),
			wantErr: "webhook.certificates.secret.caBundle",
		},
		"one replica": {
			values: with(agentRequired, "replicaCount=1", "leaderElection=false"),
			check: func(t *testing.T, r rendered) {
				if r.has("PodDisruptionBudget", "berth-agent") {
					t.Error("a PodDisruptionBudget for one replica would block every drain")
				}
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-agent"))
				if !hasArg(argsOf(d.Spec.Template.Spec), "--leader-elect=false") {
					t.Errorf("args %q", argsOf(d.Spec.Template.Spec))
				}
			},
		},
		"leases only, no managed workloads": {
			values: with(agentRequired, "managedWorkloads=false"),
			check: func(t *testing.T, r rendered) {
				for _, key := range []string{"MutatingWebhookConfiguration/berth-workload-admission", "ValidatingWebhookConfiguration/berth-workload-admission", "Service/berth-agent-webhook"} {
					if _, ok := r[key]; ok {
						t.Errorf("%s rendered without managed workloads", key)
					}
				}
				r.get(t, "ValidatingAdmissionPolicy", "berth-berthlease-finalizer")
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-agent"))
				if hasArg(argsOf(d.Spec.Template.Spec), "--managed-workloads") {
					t.Error("--managed-workloads without managed workloads")
				}
			},
		},
		"monitoring and network policy": {
			values: with(agentRequired, "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true", "networkPolicy.enabled=true", "leaseApi.ca.pem="+caPEM),
			check: func(t *testing.T, r rendered) {
				r.get(t, "ServiceMonitor", "berth-agent")
				r.get(t, "NetworkPolicy", "berth-agent")
				r.get(t, "ConfigMap", "berth-agent-lease-api-ca")
				groups, _, _ := unstructured.NestedSlice(r.get(t, "PrometheusRule", "berth-agent").Object, "spec", "groups")
				if len(groups) == 0 {
					t.Error("the PrometheusRule has no rule groups")
				}
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-agent"))
				if !hasArg(argsOf(d.Spec.Template.Spec), "--lease-api-ca-file=/var/run/berth/lease-api-ca/ca.crt") {
					t.Errorf("args %q", argsOf(d.Spec.Template.Spec))
				}
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := render(t, stdcmp.Or(tc.release, Agent), Agent, stdcmp.Or(tc.namespace, "berth-system"), tc.values)
			checkOutcome(t, err, tc.wantErr)
			if err == nil && tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// TestAgentChartAdmission compares the chart's admission with what admission.Manifests
// renders for the same account, Service and certificate mode: the chart's template is
// generated from it (hack/chartgen), and this catches a placeholder gone astray.
func TestAgentChartAdmission(t *testing.T) {
	r, err := render(t, "berth", Agent, "ops", with(agentRequired, "webhook.timeoutSeconds=7", "webhook.service.port=8443"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := admission.Manifests(admission.ManifestOptions{
		OperatorUser:   "system:serviceaccount:ops:berth-berth-agent",
		Service:        &admissionregistrationv1.ServiceReference{Namespace: "ops", Name: "berth-berth-agent-webhook", Port: ptr.To[int32](8443)},
		Annotations:    map[string]string{"berth.skaphos.io/ca-bundle-from": "agent"},
		Mutate:         true,
		TimeoutSeconds: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		kind := map[string]string{
			"*v1.MutatingWebhookConfiguration":     "MutatingWebhookConfiguration",
			"*v1.ValidatingWebhookConfiguration":   "ValidatingWebhookConfiguration",
			"*v1.ValidatingAdmissionPolicy":        "ValidatingAdmissionPolicy",
			"*v1.ValidatingAdmissionPolicyBinding": "ValidatingAdmissionPolicyBinding",
		}[fmt.Sprintf("%T", w)]
		got := r.get(t, kind, w.GetName())
		wantU, err := runtime.DefaultUnstructuredConverter.ToUnstructured(w)
		if err != nil {
			t.Fatal(err)
		}
		normalize(wantU)
		normalize(got.Object)
		if diff := cmp.Diff(wantU, got.Object); diff != "" {
			t.Errorf("%s %s differs from admission.Manifests (-want +got):\n%s", kind, w.GetName(), diff)
		}
	}
}

// normalize drops what differs between a typed object and its rendered YAML without
// meaning anything: type meta, creation timestamps, empty CA bundles, and JSON numbers.
func normalize(u map[string]any) {
	delete(u, "apiVersion")
	delete(u, "kind")
	delete(u, "status")
	if meta, ok := u["metadata"].(map[string]any); ok {
		delete(meta, "creationTimestamp")
	}
	hooks, _ := u["webhooks"].([]any)
	for _, h := range hooks {
		if cc, ok := h.(map[string]any)["clientConfig"].(map[string]any); ok && (cc["caBundle"] == "" || cc["caBundle"] == nil) {
			delete(cc, "caBundle")
		}
	}
	y, _ := json.Marshal(u)
	clear(u)
	_ = json.Unmarshal(y, &u)
}

func TestLeaseAPIChart(t *testing.T) {
	cases := map[string]struct {
		values  Values
		wantErr string
		check   func(t *testing.T, r rendered)
	}{
		"no tokens": {
			values:  Values{"tls.existingSecret=x"},
			wantErr: "tokens",
		},
		"no certificate": {
			values:  Values{"auth.tokens.existingSecret=x"},
			wantErr: "existingSecret",
		},
		"an unknown store": {
			values:  with(leaseAPIRequired, "store.type=etcd"),
			wantErr: "store",
		},
		"defaults: the embedded store, one replica": {
			values: with(leaseAPIRequired, "replicaCount=3"),
			check: func(t *testing.T, r rendered) {
				s := into[appsv1.StatefulSet](t, r.get(t, "StatefulSet", "berth-leaseapi"))
				if *s.Spec.Replicas != 1 || len(s.Spec.VolumeClaimTemplates) != 1 {
					t.Errorf("replicas %d, claims %d: want one replica with its volume", *s.Spec.Replicas, len(s.Spec.VolumeClaimTemplates))
				}
				checkRestricted(t, s.Spec.Template.Spec)
				args := argsOf(s.Spec.Template.Spec)
				for _, want := range []string{"--store=sqlite", "--sqlite-path=/var/lib/berth/leases.db", "--listen=:8443", "--tls-cert-file=/var/run/berth/tls/tls.crt", "--token-file=/var/run/berth/tokens/tokens"} {
					if !hasArg(args, want) {
						t.Errorf("args %q lack %q", args, want)
					}
				}
				if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--service-account-keys-dir") }) {
					t.Errorf("args %q: service account tokens accepted without keys asked for", args)
				}
				if r.has("PodDisruptionBudget", "berth-leaseapi") || r.has("Deployment", "berth-leaseapi") || r.has("Role", "berth-leaseapi") {
					t.Errorf("rendered %v", r.keys())
				}
			},
		},
		"postgres, three replicas": {
			values: with(leaseAPIRequired, "store.type=postgres", "store.postgres.dsnSecret.name=pg", "replicaCount=3", "auth.adminSubjects={ops,alice}"),
			check: func(t *testing.T, r rendered) {
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-leaseapi"))
				if *d.Spec.Replicas != 3 {
					t.Errorf("replicas %d, want 3", *d.Spec.Replicas)
				}
				checkRestricted(t, d.Spec.Template.Spec)
				args := argsOf(d.Spec.Template.Spec)
				for _, want := range []string{"--store=postgres", "--postgres-dsn-file=/var/run/berth/postgres/dsn", "--postgres-migrate=true", "--admin-subjects=ops,alice"} {
					if !hasArg(args, want) {
						t.Errorf("args %q lack %q", args, want)
					}
				}
				r.get(t, "PodDisruptionBudget", "berth-leaseapi")
			},
		},
		"service account keys for in-Pod fencing": {
			values: with(leaseAPIRequired, "auth.serviceAccountKeys.existingConfigMap=cluster-keys"),
			check: func(t *testing.T, r rendered) {
				spec := into[appsv1.StatefulSet](t, r.get(t, "StatefulSet", "berth-leaseapi")).Spec.Template.Spec
				if !hasArg(argsOf(spec), "--service-account-keys-dir=/var/run/berth/service-account-keys") {
					t.Errorf("args %q lack the service account keys", argsOf(spec))
				}
				mounted := slices.ContainsFunc(spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "service-account-keys" && m.MountPath == "/var/run/berth/service-account-keys" && m.ReadOnly
				})
				fromConfigMap := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
					return v.Name == "service-account-keys" && v.ConfigMap != nil && v.ConfigMap.Name == "cluster-keys"
				})
				if !mounted || !fromConfigMap {
					t.Errorf("keys mounted %v, from ConfigMap cluster-keys %v", mounted, fromConfigMap)
				}
			},
		},
		"postgres without a DSN": {
			values:  with(leaseAPIRequired, "store.type=postgres"),
			wantErr: "name",
		},
		"Kubernetes Leases in another namespace": {
			values: with(leaseAPIRequired, "store.type=kubernetes", "store.kubernetes.namespace=berth-leases"),
			check: func(t *testing.T, r rendered) {
				role := r.get(t, "Role", "berth-leaseapi")
				if role.GetNamespace() != "berth-leases" {
					t.Errorf("Role in %q, want berth-leases", role.GetNamespace())
				}
				d := into[appsv1.Deployment](t, r.get(t, "Deployment", "berth-leaseapi"))
				if !hasArg(argsOf(d.Spec.Template.Spec), "--coordination-namespace=berth-leases") || !*d.Spec.Template.Spec.AutomountServiceAccountToken {
					t.Errorf("args %q, automount %v", argsOf(d.Spec.Template.Spec), *d.Spec.Template.Spec.AutomountServiceAccountToken)
				}
			},
		},
		"cert-manager, monitoring, dashboard, network policy": {
			values: Values{"auth.tokens.existingSecret=t", "tls.mode=certManager", "tls.certManager.issuerRef.name=corp", "tls.certManager.dnsNames={leases.example.com}",
				"metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true", "metrics.grafanaDashboard.enabled=true", "networkPolicy.enabled=true"},
			check: func(t *testing.T, r rendered) {
				names, _, _ := unstructured.NestedStringSlice(r.get(t, "Certificate", "berth-leaseapi").Object, "spec", "dnsNames")
				if !slices.Contains(names, "leases.example.com") || !slices.Contains(names, "berth-leaseapi.berth-system.svc") {
					t.Errorf("certificate names %q", names)
				}
				r.get(t, "ServiceMonitor", "berth-leaseapi")
				r.get(t, "NetworkPolicy", "berth-leaseapi")
				r.get(t, "PrometheusRule", "berth-leaseapi")
				dashboard, _, _ := unstructured.NestedString(r.get(t, "ConfigMap", "berth-leaseapi-dashboard").Object, "data", "berth.json")
				var parsed struct{ Panels []any }
				if err := json.Unmarshal([]byte(dashboard), &parsed); err != nil || len(parsed.Panels) == 0 {
					t.Errorf("dashboard: %v, %d panels", err, len(parsed.Panels))
				}
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := render(t, LeaseAPI, LeaseAPI, "berth-system", tc.values)
			checkOutcome(t, err, tc.wantErr)
			if err == nil && tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestLint(t *testing.T) {
	cases := map[string]struct {
		chart  string
		values Values
	}{
		"agent":                   {Agent, agentRequired},
		"agent with cert-manager": {Agent, with(agentRequired, "webhook.certificates.mode=certManager")},
		"lease API, embedded":     {LeaseAPI, leaseAPIRequired},
		"lease API, PostgreSQL":   {LeaseAPI, with(leaseAPIRequired, "store.type=postgres", "store.postgres.dsnSecret.name=pg")},
		"lease API, Kubernetes":   {LeaseAPI, with(leaseAPIRequired, "store.type=kubernetes")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if out, err := Helm(t.Context(), append([]string{"lint", "--strict", Dir(tc.chart)}, tc.values.args()...)...); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
}

func checkOutcome(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("render: %v", err)
	case wantErr != "" && err == nil:
		t.Fatalf("rendered, want an error naming %q", wantErr)
	case wantErr != "" && !strings.Contains(err.Error(), wantErr):
		t.Fatalf("error %v, want one naming %q", err, wantErr)
	}
}
