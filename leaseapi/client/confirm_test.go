package client_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
)

// TestConfirm: a Pod confirms its cluster's term with its projected service
// account token, read from its file as berth-fence reads it.
func TestConfirm(t *testing.T) {
	key := satokentest.NewRSA(t, "east-1")
	keysDir := t.TempDir()
	satokentest.WriteJWKS(t, keysDir, "east", key)
	ts := leaseapitest.Start(t, leaseapitest.Options{Tokens: map[string]string{"east": "token-of-east"}, ServiceAccountKeysDir: keysDir})
	agent := ts.Client(t, client.Config{TokenFile: ts.TokenFiles["east"]})
	ctx := t.Context()

	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(key.Sign(t, satokentest.PodClaims(exporter, "fence-0", time.Now()))), 0o600); err != nil {
		t.Fatal(err)
	}
	pod := ts.Client(t, client.Config{TokenFile: tokenFile})

	if _, err := pod.Confirm(ctx, "payments", "exporter", "east", 1); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("confirm of a lease never acquired: %v, want ErrNotFound", err)
	}
	res, err := agent.Acquire(ctx, "payments", "exporter", "east", 30*time.Second)
	if err != nil || !res.Acquired {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	got, err := pod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Confirmed || got.RemainingMillis <= 25000 || got.RemainingMillis > 30000 {
		t.Errorf("confirmation of the held term: %+v, want confirmed with up to 30 s left", got)
	}
	got, err = pod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken+1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(leaseapi.Confirmation{Holder: "east", FencingToken: res.FencingToken, TTLSeconds: 30}, got); diff != "" {
		t.Errorf("confirmation of another token (-want +got):\n%s", diff)
	}
	if _, err := pod.Confirm(ctx, "payments", "other", "east", 1); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("confirm of another lease with the Pod's token: %v, want ErrForbidden", err)
	}
	if _, err := pod.Confirm(ctx, "payments", "exporter", "east", 0); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("confirm with token 0: %v, want ErrInvalid", err)
	}
	if _, err := pod.Acquire(ctx, "payments", "exporter", "east", time.Minute); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("acquire with the Pod's token: %v, want ErrUnauthorized", err)
	}
}

// TestConfirmIsRetried: a confirmation only reads, so failures a retry may
// cure are retried.
func TestConfirmIsRetried(t *testing.T) {
	f := &flaky{next: leaseapitest.Handler(t, leaseapitest.Options{}), code: http.StatusServiceUnavailable, n: 2}
	ts := httptest.NewServer(f)
	defer ts.Close()
	c := newClient(t, client.Config{URL: ts.URL, RetryMax: 2})
	if _, err := c.Confirm(t.Context(), "ns", "a", "east", 1); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("confirm after two 503s: %v, want the server's ErrNotFound", err)
	}
	if got := f.calls.Load(); got != 3 {
		t.Errorf("server saw %d calls, want 3", got)
	}
}
