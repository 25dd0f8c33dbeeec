package satoken_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/satoken"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
)

// TestLoadDirAsASecretMount: a directory laid out as the kubelet mounts a
// Secret (files linked through ..data) yields one key set per
// <cluster-id>.json and ignores everything else.
func TestLoadDirAsASecretMount(t *testing.T) {
	east, west := satokentest.NewRSA(t, "east"), satokentest.NewECDSA(t, "west")
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_01_02_03_04_05.000000001")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	writeKeys(t, data, map[string][]byte{"east.json": satokentest.JWKS(t, east), "west.json": satokentest.JWKS(t, west), "README": []byte("not keys")})
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"east.json", "west.json", "README"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := satoken.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"east", "west"}, keys.Clusters()); diff != "" {
		t.Errorf("clusters (-want +got):\n%s", diff)
	}
}

// TestReloadKeepsKeysOnError: a bad file on reload leaves every cluster's
// previous keys in force; a good one replaces them (a rotated key).
func TestReloadKeepsKeysOnError(t *testing.T) {
	old, rotated := satokentest.NewRSA(t, "old"), satokentest.NewRSA(t, "new")
	dir := t.TempDir()
	writeKeys(t, dir, map[string][]byte{"east.json": satokentest.JWKS(t, old)})
	keys, err := satoken.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := satoken.NewVerifier(keys, testingclock.NewFakePassiveClock(epoch))
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	claims := newClaims("payments", leaseapi.ConfirmAudience(key))
	verifies := func(s satokentest.Key) bool {
		_, err := v.Verify(s.Sign(t, claims), "east", key)
		return err == nil
	}

	writeKeys(t, dir, map[string][]byte{"east.json": []byte(`{"keys":[`), "west.json": satokentest.JWKS(t, rotated)})
	if err := keys.Reload(); err == nil || !strings.Contains(err.Error(), "east.json") {
		t.Fatalf("reload of a broken file: %v, want an error naming it", err)
	}
	if !verifies(old) || len(keys.Clusters()) != 1 {
		t.Fatalf("after a failed reload: old key verifies %t, clusters %v; want the previous set in force", verifies(old), keys.Clusters())
	}

	writeKeys(t, dir, map[string][]byte{"east.json": satokentest.JWKS(t, rotated)})
	if err := keys.Reload(); err != nil {
		t.Fatal(err)
	}
	if verifies(old) || !verifies(rotated) {
		t.Errorf("after reload: old key verifies %t, rotated %t; want only the rotated one", verifies(old), verifies(rotated))
	}
}

func TestParseKeySetRefuses(t *testing.T) {
	private := satokentest.NewRSA(t, "k")
	cases := map[string]struct {
		data    string
		wantMsg string
	}{
		"not JSON":      {data: "-----BEGIN PUBLIC KEY-----", wantMsg: "not a JWKS"},
		"no keys":       {data: `{"keys":[]}`, wantMsg: "no key"},
		"symmetric key": {data: `{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0"}]}`, wantMsg: "want an RSA or ECDSA public key"},
		"private key": {data: func() string {
			b, _ := (&jose.JSONWebKey{Key: private.Private, KeyID: "k"}).MarshalJSON()
			return `{"keys":[` + string(b) + `]}`
		}(), wantMsg: "want an RSA or ECDSA public key"},
		"no kid":         {data: strings.Replace(string(satokentest.JWKS(t, private)), `"kid":"k",`, "", 1), wantMsg: "no key id"},
		"encryption key": {data: strings.Replace(string(satokentest.JWKS(t, private)), `"use":"sig"`, `"use":"enc"`, 1), wantMsg: "not for signatures"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := satoken.ParseKeySet([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("parse: %v, want an error saying %q", err, tc.wantMsg)
			}
		})
	}
}
