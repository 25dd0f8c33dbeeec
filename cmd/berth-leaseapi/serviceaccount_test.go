package main_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
	"github.com/berthfleet/berth/test/binaries"
)

// TestServiceAccountConfirmation runs berth-leaseapi with a folder of
// clusters' JWKS files laid out as a Secret mount: a Pod of the holder
// cluster confirms the term with its service account token, and after a key
// rotation and SIGHUP only the new key's tokens verify.
func TestServiceAccountConfirmation(t *testing.T) {
	tokenFile, subjectFiles, err := leaseapitest.WriteTokens(t.TempDir(), map[string]string{"east": "token-of-east"})
	if err != nil {
		t.Fatal(err)
	}
	oldKey, newKey, westKey := satokentest.NewRSA(t, "east-1"), satokentest.NewECDSA(t, "east-2"), satokentest.NewRSA(t, "west-1")
	keysDir := t.TempDir()
	satokentest.WriteJWKS(t, keysDir, "east", oldKey)
	satokentest.WriteJWKS(t, keysDir, "west", westKey)
	if err := os.Symlink(".", filepath.Join(keysDir, "..data")); err != nil { // as a Secret mount has
		t.Fatal(err)
	}
	p := start(t, "--sqlite-path", filepath.Join(t.TempDir(), "leases.db"), "--token-file", tokenFile, "--service-account-keys-dir", keysDir)
	if lines := p.Logged("service account keys loaded"); len(lines) != 1 || lines[0]["clusters"] != 2.0 {
		t.Errorf("start logged %v, want the keys of 2 clusters loaded", lines)
	}
	newClient := func(tokenFile string) *client.Client {
		c, err := client.New(client.Config{URL: "http://" + p.addr, TokenFile: tokenFile, RetryMax: -1, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx := t.Context()
	res, err := newClient(subjectFiles["east"]).Acquire(ctx, "payments", "exporter", "east", time.Minute)
	if err != nil || !res.Acquired {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	exporter := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	podToken := func(key satokentest.Key) *client.Client {
		path := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(path, []byte(key.Sign(t, satokentest.PodClaims(exporter, "fence-0", time.Now()))), 0o600); err != nil {
			t.Fatal(err)
		}
		return newClient(path)
	}
	oldPod, newPod := podToken(oldKey), podToken(newKey)
	got, err := oldPod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken)
	if err != nil || !got.Confirmed || got.RemainingMillis <= 0 {
		t.Fatalf("confirmation with the Pod's token: %+v, %v; want confirmed", got, err)
	}
	if _, err := podToken(westKey).Confirm(ctx, "payments", "exporter", "east", res.FencingToken); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("confirmation with a token of another cluster: %v, want ErrUnauthorized", err)
	}
	if _, err := newPod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("confirmation with a key not yet published: %v, want ErrUnauthorized", err)
	}

	// A broken file keeps the keys in force; the rotated set replaces them.
	if err := os.WriteFile(filepath.Join(keysDir, "east.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	hangUp(t, p, "service account keys reloaded", "reload service account keys; keeping the previous keys")
	if _, err := oldPod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken); err != nil {
		t.Errorf("confirmation after a failed reload: %v, want the previous keys in force", err)
	}
	satokentest.WriteJWKS(t, keysDir, "east", newKey)
	hangUp(t, p, "service account keys reloaded", "")
	if _, err := oldPod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("confirmation with the rotated-away key: %v, want ErrUnauthorized", err)
	}
	if got, err := newPod.Confirm(ctx, "payments", "exporter", "east", res.FencingToken); err != nil || !got.Confirmed {
		t.Errorf("confirmation with the new key: %+v, %v; want confirmed", got, err)
	}
}

// hangUp sends SIGHUP and waits until the server logs one more line with
// msg, or with failMsg when that is not empty.
func hangUp(t *testing.T, p *server, msg, failMsg string) {
	t.Helper()
	before, failsBefore := len(p.Logged(msg)), len(p.LogLines(failMsg))
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if len(p.Logged(msg)) > before {
			if failMsg != "" {
				t.Fatalf("SIGHUP logged %q, want %q", msg, failMsg)
			}
			return
		}
		if failMsg != "" && len(p.LogLines(failMsg)) > failsBefore {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("SIGHUP: no %q logged within 10 s", msg)
}

// TestServiceAccountKeysDirMustBeReadable: a missing folder or a bad file
// in it stops the server at start.
func TestServiceAccountKeysDirMustBeReadable(t *testing.T) {
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "east.json"), []byte(`{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		dir, want string
	}{
		"missing":         {dir: filepath.Join(t.TempDir(), "absent"), want: "no such file or directory"},
		"a symmetric key": {dir: bad, want: "want an RSA or ECDSA public key"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(binaries.Path("berth-leaseapi"), "--listen", "127.0.0.1:0", "--metrics-listen", "",
				"--sqlite-path", filepath.Join(t.TempDir(), "x.db"), "--service-account-keys-dir", tc.dir).CombinedOutput()
			if err == nil {
				t.Fatal("berth-leaseapi started")
			}
			if !strings.Contains(string(out), "--service-account-keys-dir") || !strings.Contains(string(out), tc.want) {
				t.Errorf("refusal does not say why (%q):\n%s", tc.want, out)
			}
		})
	}
}
