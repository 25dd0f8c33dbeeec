// Package certs keeps the serving certificate of Berth's admission webhooks, for an agent
// that manages its own certificates instead of relying on cert-manager.
//
// It owns one Secret of type kubernetes.io/tls (tls.crt, tls.key, ca.crt and the CA's
// key under ca.key) that holds a self-signed CA and a serving certificate it signed for
// the webhook Service's DNS names, the copies of tls.crt, tls.key and ca.crt in the
// webhook server's certificate folder, and the caBundle of every webhook in the
// MutatingWebhookConfiguration and ValidatingWebhookConfiguration named
// admission.WebhookConfigurationName. Every replica of the agent runs a Rotator (it
// needs no leader election): the Secret is the single source of truth, replicas racing to
// create or renew it are settled by the API server (Create's AlreadyExists, Update's
// resourceVersion), and whichever replica loses re-reads the Secret and uses what won.
// Each replica then brings its own files and the configurations up to date, at once
// and every Interval, so that a renewal made by one replica reaches the others.
//
// What to do is decided by pure functions: Decide (are the Secret's CA and serving
// certificate usable, must its CA bundle shrink), Bundle and TrustBundle (which CAs to
// trust); Next carries a decision out (new keys and certificates). Rotator only reads,
// writes and logs. The rules are in Decide and Bundle and in docs/admission.md,
// "Webhook certificates".
//
// Files are written atomically (a temporary file renamed over the old one) whenever they
// differ from the Secret; controller-runtime's webhook server watches them (certwatcher)
// and serves the new pair without a restart. It refuses to start without them, so the
// agent runs a first Sync before it starts its manager.
//
// github.com/open-policy-agent/cert-controller does the same job, but it is pinned to controller-runtime v0.23 and relies on the
// kubelet to project the Secret into the Pod, which delays each rotation by the kubelet's
// sync period and needs the Secret before the Pod can start; this package writes the
// files itself.
//
// It does not render the webhook configurations (package admission does) or serve the
// webhooks (the manager's webhook server does), and it does not touch a certificate
// provided by anyone else: without a Secret name the agent does not run it.
package certs
