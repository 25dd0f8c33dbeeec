package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// Paths at which SetupWorkloadAdmission serves the webhooks, and to which Manifests points
// the API server.
const (
	MutatePath   = "/mutate-pods"
	ValidatePath = "/validate-pods"
)

// WorkloadAdmission is the admission of managed Pods: a mutating webhook that gates them
// at creation (when Mutate is set) and a validating webhook that keeps them gated until the
// Berth agent ungates them. Its registrations (see Manifests) use failurePolicy Fail and no
// selector a caller controls; a ValidatingAdmissionPolicy repeats the core rules inside the
// API server.
type WorkloadAdmission struct {
	// Client reads BerthLeases (their metadata) to stamp and check a managed Pod's UID
	// label. Give it one that reads from the API server, not an informer cache, which may
	// not yet have a BerthLease that was just created; nil: SetupWorkloadAdmission builds
	// one from the manager's configuration.
	Client ctrlclient.Client
	// OperatorUser is the Berth agent's user name as the API server authenticates it, for
	// example system:serviceaccount:berth-system:berth-agent: the only user that may
	// ungate a managed Pod or change its managed labels. Required.
	OperatorUser string
	// Mutate serves the mutating webhook, which adds the gate and the UID label to managed
	// Pods at creation. When false, admission only validates: Pod templates must carry the
	// gate and the UID label themselves.
	Mutate bool
	// Fence is what the mutating webhook puts into the Pods of BerthLeases with
	// spec.podFencing Exec, and what the validating webhook requires of them: a
	// validate-only installation needs it too. Without an Image such Pods are refused.
	Fence FenceConfig
}

// decoder decodes Pods whatever the manager's scheme holds.
var decoder = ctrladmission.NewDecoder(clientgoscheme.Scheme)

// The webhooks read BerthLeases (metadata) to stamp and check a managed Pod's UID label.
// +kubebuilder:rbac:groups=berth.skaphos.io,resources=berthleases,verbs=get

// SetupWorkloadAdmission registers the validating webhook at ValidatePath and, when
// a.Mutate is set, the mutating webhook at MutatePath on mgr's webhook server. The server
// runs on every replica (it needs no leader election). Install the matching registrations
// and policy with Manifests.
func SetupWorkloadAdmission(mgr ctrl.Manager, a *WorkloadAdmission) error {
	if a.OperatorUser == "" {
		return errors.New("set up workload admission: OperatorUser is empty")
	}
	if a.Client == nil {
		c, err := ctrlclient.New(mgr.GetConfig(), ctrlclient.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
		if err != nil {
			return fmt.Errorf("set up workload admission: build client: %w", err)
		}
		a.Client = c
	}
	server := mgr.GetWebhookServer()
	base := mgr.GetLogger().WithName("admission")
	logs := func(_ logr.Logger, req *ctrladmission.Request) logr.Logger {
		return ctrladmission.DefaultLogConstructor(base, req)
	}
	if a.Mutate {
		server.Register(MutatePath, &webhook.Admission{Handler: ctrladmission.HandlerFunc(a.mutate), LogConstructor: logs})
	}
	server.Register(ValidatePath, &webhook.Admission{Handler: ctrladmission.HandlerFunc(a.validate), LogConstructor: logs})
	return nil
}

// mutate stamps a managed Pod at creation (see Stamp).
func (a *WorkloadAdmission) mutate(ctx context.Context, req ctrladmission.Request) ctrladmission.Response {
	op := string(req.Operation)
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		record(op, decisionAllow, ReasonUnmanaged)
		return ctrladmission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := decoder.Decode(req, pod); err != nil {
		record(op, decisionError, ReasonBadRequest)
		return ctrladmission.Errored(http.StatusBadRequest, fmt.Errorf("decode Pod: %w", err))
	}
	leaseName, managed := pod.Labels[berthv1alpha1.ManagedLeaseLabel]
	if !managed {
		record(op, decisionAllow, ReasonUnmanaged)
		return ctrladmission.Allowed("")
	}
	lease, err := a.lookup(ctx, req.Namespace, leaseName)
	if err != nil {
		return a.failed(ctx, op, err)
	}
	stampedNow := Stamp(pod, lease)
	fenced, err := Fence(req.Namespace, pod, lease, a.Fence)
	if err != nil {
		record(op, decisionDeny, ReasonFenceUnavailable)
		return ctrladmission.Denied(err.Error())
	}
	if !stampedNow && !fenced {
		record(op, decisionAllow, ReasonValid)
		return ctrladmission.Allowed("")
	}
	stamped, err := json.Marshal(pod)
	if err != nil {
		record(op, decisionError, ReasonBadRequest)
		return ctrladmission.Errored(http.StatusInternalServerError, fmt.Errorf("encode Pod: %w", err))
	}
	reason := ReasonStamped
	if fenced {
		reason = ReasonFenced
	}
	record(op, decisionMutate, reason)
	logr.FromContextOrDiscard(ctx).V(1).Info("stamped managed Pod", "lease", leaseName, "leaseFound", lease.Found, "fenced", fenced)
	return ctrladmission.PatchResponseFromRaw(req.Object.Raw, stamped)
}

// validate decides a Pod's creation or change (see DecideCreate and DecideUpdate).
func (a *WorkloadAdmission) validate(ctx context.Context, req ctrladmission.Request) ctrladmission.Response {
	op := string(req.Operation)
	var d Decision
	switch req.Operation {
	case admissionv1.Create:
		pod := &corev1.Pod{}
		if err := decoder.Decode(req, pod); err != nil {
			record(op, decisionError, ReasonBadRequest)
			return ctrladmission.Errored(http.StatusBadRequest, fmt.Errorf("decode Pod: %w", err))
		}
		var lease BerthLeaseRef
		if name, managed := pod.Labels[berthv1alpha1.ManagedLeaseLabel]; managed {
			var err error
			if lease, err = a.lookup(ctx, req.Namespace, name); err != nil {
				return a.failed(ctx, op, err)
			}
		}
		d = DecideCreate(req.Namespace, pod, lease, a.Fence)
	case admissionv1.Update:
		pod, old := &corev1.Pod{}, &corev1.Pod{}
		if err := decoder.Decode(req, pod); err != nil {
			record(op, decisionError, ReasonBadRequest)
			return ctrladmission.Errored(http.StatusBadRequest, fmt.Errorf("decode Pod: %w", err))
		}
		if err := decoder.DecodeRaw(req.OldObject, old); err != nil {
			record(op, decisionError, ReasonBadRequest)
			return ctrladmission.Errored(http.StatusBadRequest, fmt.Errorf("decode old Pod: %w", err))
		}
		d = DecideUpdate(req.Namespace, old, pod, req.UserInfo.Username, a.OperatorUser)
	default:
		record(op, decisionAllow, ReasonUnmanaged)
		return ctrladmission.Allowed("")
	}
	log := logr.FromContextOrDiscard(ctx)
	if !d.Allowed {
		record(op, decisionDeny, d.Reason)
		log.Info("denied Pod request", "reason", d.Reason, "user", req.UserInfo.Username, "message", d.Message)
		return ctrladmission.Denied(d.Message)
	}
	record(op, decisionAllow, d.Reason)
	log.V(1).Info("allowed Pod request", "reason", d.Reason, "user", req.UserInfo.Username)
	if d.Warning != "" {
		return ctrladmission.Allowed("").WithWarnings(d.Warning)
	}
	return ctrladmission.Allowed("")
}

// failed answers a request that admission could not decide: it fails closed.
func (a *WorkloadAdmission) failed(ctx context.Context, op string, err error) ctrladmission.Response {
	record(op, decisionError, ReasonLookupFailed)
	logr.FromContextOrDiscard(ctx).Error(err, "cannot decide Pod request")
	return ctrladmission.Errored(http.StatusInternalServerError, fmt.Errorf("berth: cannot decide on a managed Pod: %w", err))
}

// lookup reads the BerthLease named name in namespace from the API server through
// a.Client. An invalid name finds nothing (validation rejects the Pod's label anyway,
// after mutation).
func (a *WorkloadAdmission) lookup(ctx context.Context, namespace, name string) (BerthLeaseRef, error) {
	if len(validation.IsDNS1123Subdomain(name)) > 0 || len(validation.IsDNS1123Label(namespace)) > 0 {
		return BerthLeaseRef{}, nil
	}
	bl := &berthv1alpha1.BerthLease{}
	err := a.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: namespace, Name: name}, bl)
	switch {
	case apierrors.IsNotFound(err):
		return BerthLeaseRef{}, nil
	case err != nil:
		return BerthLeaseRef{}, fmt.Errorf("get BerthLease %s/%s: %w", namespace, name, err)
	}
	return BerthLeaseRef{
		Found: true, UID: bl.UID, JustMade: time.Since(bl.CreationTimestamp.Time) < JustMadeWithin,
		LeaseName: cmp.Or(bl.Spec.LeaseName, bl.Name), PodFencing: bl.Spec.PodFencing == berthv1alpha1.PodFencingExec,
	}, nil
}
