package certs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/berthfleet/berth/admission"
)

// The agent reads and updates only its own Secret (the name deploy/ and the Helm chart
// use) and creates it when missing; RBAC cannot restrict create by name. It patches only
// Berth's webhook configurations.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;update,resourceNames=berth-agent-webhook-tls,namespace=berth-system
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create,namespace=berth-system
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=get;patch;update,resourceNames=berth-workload-admission

// DefaultInterval is how often a Rotator checks the Secret, its files and the webhook
// configurations (each wait is up to a tenth longer, at random).
const DefaultInterval = time.Minute

// maxRetryInterval bounds the wait after a failed Sync.
const maxRetryInterval = 10 * time.Second

// maxAttempts bounds how often one Sync re-reads an object another replica changed
// under it.
const maxAttempts = 5

// Options configure a Rotator.
type Options struct {
	// Client reads and writes the Secret and the webhook configurations. Give it one
	// that reads from the API server (not the manager's cache, which would need to list
	// and watch every Secret).
	Client ctrlclient.Client
	// Namespace and SecretName name the Secret.
	Namespace, SecretName string
	// ServiceName is the webhook Service in Namespace; the serving certificate is for
	// DNSNames(ServiceName, Namespace).
	ServiceName string
	// CertDir is the webhook server's certificate folder; tls.crt, tls.key and ca.crt
	// are written there.
	CertDir string
	// WebhookConfigurationName names the MutatingWebhookConfiguration and the
	// ValidatingWebhookConfiguration whose caBundles are kept; default
	// admission.WebhookConfigurationName.
	WebhookConfigurationName string
	// Policy sets validities and the CA overlap; zero fields take the defaults.
	Policy Policy
	// Interval is how often Start syncs; default DefaultInterval.
	Interval time.Duration
	// Clock is the time source; default the real clock.
	Clock clock.Clock
	// Random is the entropy for keys and serial numbers; default crypto/rand.Reader.
	Random io.Reader
	// Log receives renewals, files written and failures.
	Log logr.Logger
}

// Rotator keeps the webhook certificates of one replica (see the package
// documentation). Run it with the manager (Start) after a first Sync.
type Rotator struct {
	opts   Options
	names  []string
	synced atomic.Bool

	mu      sync.Mutex      // one Sync at a time
	missing map[string]bool // configurations found missing at the last Sync, by kind
}

var (
	_ manager.Runnable               = (*Rotator)(nil)
	_ manager.LeaderElectionRunnable = (*Rotator)(nil)
	_ healthz.Checker                = (*Rotator)(nil).Checker
)

// New checks opts and returns a Rotator.
func New(opts Options) (*Rotator, error) {
	var errs []error
	if opts.Client == nil {
		errs = append(errs, errors.New("no Client"))
	}
	for what, v := range map[string]string{"Namespace": opts.Namespace, "SecretName": opts.SecretName, "ServiceName": opts.ServiceName, "CertDir": opts.CertDir} {
		if v == "" {
			errs = append(errs, fmt.Errorf("no %s", what))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("webhook certificates: %w", err)
	}
	if opts.WebhookConfigurationName == "" {
		opts.WebhookConfigurationName = admission.WebhookConfigurationName
	}
	opts.Policy = opts.Policy.withDefaults()
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Random == nil {
		opts.Random = rand.Reader
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	return &Rotator{opts: opts, names: DNSNames(opts.ServiceName, opts.Namespace), missing: map[string]bool{}}, nil
}

// NeedLeaderElection is false: every replica serves webhooks, so every replica keeps
// its files.
func (r *Rotator) NeedLeaderElection() bool { return false }

// Checker fails until a Sync has succeeded, for /readyz.
func (r *Rotator) Checker(_ *http.Request) error {
	if !r.synced.Load() {
		return errors.New("webhook certificates not synced yet")
	}
	return nil
}

// Start syncs at once and then every Interval (jittered), sooner after a failure,
// until ctx ends.
func (r *Rotator) Start(ctx context.Context) error {
	for {
		wait := r.opts.Interval
		if err := r.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.opts.Log.Error(err, "syncing webhook certificates failed; retrying")
			wait = min(wait, maxRetryInterval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.opts.Clock.After(wait + time.Duration(mathrand.Int64N(int64(wait)/10+1))):
		}
	}
}

// SyncFirst calls Sync until it succeeds or ctx ends, and returns Sync's last error
// then. The agent calls it before it starts the webhook server, which will not start
// without the files.
func (r *Rotator) SyncFirst(ctx context.Context) error {
	for {
		err := r.Sync(ctx)
		if err == nil {
			return nil
		}
		r.opts.Log.Error(err, "syncing webhook certificates failed; retrying")
		select {
		case <-ctx.Done():
			return fmt.Errorf("first sync of the webhook certificates: %w", err)
		case <-r.opts.Clock.After(min(r.opts.Interval, maxRetryInterval)):
		}
	}
}

// Sync makes the Secret usable (creating or renewing it as Decide says), puts its CA
// bundle into the webhook configurations, and then writes the files that differ from
// it. When the configurations cannot be updated the files are left alone: a
// certificate from a new CA is served only once the API server trusts that CA (or
// there is no configuration yet to trust it).
func (r *Rotator) Sync(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := r.syncSecret(ctx)
	if err != nil {
		return err
	}
	if err := r.syncConfigurations(ctx, data[KeyCABundle]); err != nil {
		return err
	}
	written, err := writeFiles(r.opts.CertDir, data)
	if err != nil {
		return fmt.Errorf("write webhook certificate files: %w", err)
	}
	if len(written) > 0 {
		r.opts.Log.Info("webhook certificate files written", "dir", r.opts.CertDir, "files", written)
	}
	r.synced.Store(true)
	return nil
}

// syncSecret returns the Secret's data once it is usable, creating or replacing it as
// Decide says. A create or update that loses to another replica re-reads the Secret
// and judges what won.
func (r *Rotator) syncSecret(ctx context.Context) (map[string][]byte, error) {
	key := types.NamespacedName{Namespace: r.opts.Namespace, Name: r.opts.SecretName}
	for range maxAttempts {
		secret := &corev1.Secret{}
		err := r.opts.Client.Get(ctx, key, secret)
		exists := err == nil
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("read Secret %s: %w", key, err)
		case secret.Type != corev1.SecretTypeTLS:
			return nil, fmt.Errorf("webhook certificate Secret %s has type %s, want %s: delete it and the agent makes it anew", key, secret.Type, corev1.SecretTypeTLS)
		}
		now := r.opts.Clock.Now()
		d := Decide(now, secret.Data, r.names, r.opts.Policy)
		if !d.Changes() {
			return secret.Data, nil
		}
		next, err := Next(now, secret.Data, d, r.names, r.opts.Policy, r.opts.Random)
		if err != nil {
			return nil, fmt.Errorf("renew Secret %s: %w", key, err)
		}
		if exists {
			secret.Data = next
			err = r.opts.Client.Update(ctx, secret)
		} else {
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{
					"app.kubernetes.io/name": "berth", "app.kubernetes.io/component": "webhook-certificates", "app.kubernetes.io/managed-by": "berth-agent",
				}},
				Type: corev1.SecretTypeTLS,
				Data: next,
			}
			err = r.opts.Client.Create(ctx, secret)
		}
		switch {
		case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err), apierrors.IsNotFound(err):
			r.opts.Log.V(1).Info("another writer changed the webhook certificate Secret first; reading it again", "secret", klog.KObj(secret))
			continue
		case err != nil:
			return nil, fmt.Errorf("write Secret %s: %w", key, err)
		}
		r.opts.Log.Info("webhook certificates renewed", "secret", klog.KObj(secret), "created", !exists,
			"newCA", d.NewCA, "newServing", d.NewServing, "staleBundle", d.StaleBundle)
		return secret.Data, nil
	}
	return nil, fmt.Errorf("renew Secret %s: changed by others %d times in a row", key, maxAttempts)
}

// syncConfigurations sets the caBundle of every webhook of both configurations to
// TrustBundle. A configuration that does not exist is logged and skipped.
func (r *Rotator) syncConfigurations(ctx context.Context, secretBundle []byte) error {
	name := r.opts.WebhookConfigurationName
	for range maxAttempts {
		mutating, validating := &admissionregistrationv1.MutatingWebhookConfiguration{}, &admissionregistrationv1.ValidatingWebhookConfiguration{}
		var existing [][]byte
		var present []ctrlclient.Object
		for _, obj := range []ctrlclient.Object{mutating, validating} {
			kind := kindOf(obj)
			err := r.opts.Client.Get(ctx, types.NamespacedName{Name: name}, obj)
			if apierrors.IsNotFound(err) {
				if !r.missing[kind] {
					r.opts.Log.Info("webhook configuration not found; setting its caBundle once it exists", "kind", kind, "name", name)
				}
				r.missing[kind] = true
				continue
			}
			if err != nil {
				return fmt.Errorf("read %s %s: %w", kind, name, err)
			}
			r.missing[kind] = false
			present = append(present, obj)
		}
		for _, w := range mutating.Webhooks {
			existing = append(existing, w.ClientConfig.CABundle)
		}
		for _, w := range validating.Webhooks {
			existing = append(existing, w.ClientConfig.CABundle)
		}
		want := TrustBundle(r.opts.Clock.Now(), secretBundle, existing, r.opts.Policy)
		conflict := false
		for _, obj := range present {
			orig := obj.DeepCopyObject().(ctrlclient.Object)
			if !setCABundles(obj, want) {
				continue
			}
			err := r.opts.Client.Patch(ctx, obj, ctrlclient.StrategicMergeFrom(orig, ctrlclient.MergeFromWithOptimisticLock{}))
			switch {
			case apierrors.IsConflict(err), apierrors.IsNotFound(err):
				conflict = true
			case err != nil:
				return fmt.Errorf("set the caBundle of %s %s: %w", kindOf(obj), name, err)
			default:
				r.opts.Log.Info("webhook configuration caBundle set", "kind", kindOf(obj), "name", name,
					"cas", len(ParseBundle(want)))
			}
		}
		if !conflict {
			return nil
		}
	}
	return fmt.Errorf("set the caBundle of the webhook configurations %s: changed by others %d times in a row", name, maxAttempts)
}

// setCABundles sets every webhook's caBundle of obj to bundle and reports whether any
// changed.
func setCABundles(obj ctrlclient.Object, bundle []byte) bool {
	changed := false
	set := func(cc *admissionregistrationv1.WebhookClientConfig) {
		if !bytes.Equal(cc.CABundle, bundle) {
			cc.CABundle, changed = bundle, true
		}
	}
	switch c := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range c.Webhooks {
			set(&c.Webhooks[i].ClientConfig)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range c.Webhooks {
			set(&c.Webhooks[i].ClientConfig)
		}
	}
	return changed
}

func kindOf(obj ctrlclient.Object) string {
	switch obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		return "MutatingWebhookConfiguration"
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		return "ValidatingWebhookConfiguration"
	}
	return fmt.Sprintf("%T", obj)
}
