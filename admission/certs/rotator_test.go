package certs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/berthfleet/berth/admission"
)

// TestSyncFilesWaitForTheCABundle injects one failure the real API server cannot be made
// to produce on demand: a caBundle patch that fails. The files must then stay as they
// are (a new certificate is served only once its CA is trusted) and readiness must not
// pass; without any configuration, Sync writes the files and succeeds.
func TestSyncFilesWaitForTheCABundle(t *testing.T) {
	patchErr := errors.New("injected patch failure")
	cases := map[string]struct {
		objs        []ctrlclient.Object
		wantErr     bool
		wantWritten bool
	}{
		"no configurations yet": {wantWritten: true},
		"the caBundle cannot be set": {
			objs:    []ctrlclient.Object{&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: admission.WebhookConfigurationName}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "w"}}}},
			wantErr: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(tc.objs...).WithInterceptorFuncs(interceptor.Funcs{
				Patch: func(context.Context, ctrlclient.WithWatch, ctrlclient.Object, ctrlclient.Patch, ...ctrlclient.PatchOption) error {
					return patchErr
				},
			}).Build()
			dir := filepath.Join(t.TempDir(), "certs")
			r, err := New(Options{Client: c, Namespace: "berth-system", SecretName: "tls", ServiceName: "svc", CertDir: dir, Clock: clocktesting.NewFakeClock(t0)})
			if err != nil {
				t.Fatal(err)
			}
			err = r.Sync(t.Context())
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, patchErr)) {
				t.Errorf("Sync() = %v, want error %v", err, tc.wantErr)
			}
			_, statErr := os.Stat(filepath.Join(dir, KeyCert))
			if written := statErr == nil; written != tc.wantWritten {
				t.Errorf("tls.crt written: %v, want %v", written, tc.wantWritten)
			}
			if ready := r.Checker(nil) == nil; ready != !tc.wantErr {
				t.Errorf("ready: %v, want %v", ready, !tc.wantErr)
			}
		})
	}
}

func TestNewNeedsOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without options: no error")
	}
	r, err := New(Options{Client: fake.NewClientBuilder().Build(), Namespace: "ns", SecretName: "s", ServiceName: "svc", CertDir: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if r.NeedLeaderElection() {
		t.Error("NeedLeaderElection() = true; every replica must keep its files")
	}
}
