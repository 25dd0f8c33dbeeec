package pki_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthfleet/berth/test/pki"
)

func TestIssuedCertificatesVerify(t *testing.T) {
	ca, err := pki.NewAuthority("test")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewAuthority("other")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.ServingCert("server", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.ClientCert("alice", "devs")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		pair    pki.KeyPair
		roots   *x509.CertPool
		opts    x509.VerifyOptions
		wantErr bool
	}{
		"serving for its IP":        {pair: serving, roots: ca.Pool(), opts: x509.VerifyOptions{DNSName: "127.0.0.1"}},
		"serving for its name":      {pair: serving, roots: ca.Pool(), opts: x509.VerifyOptions{DNSName: "localhost"}},
		"serving for another name":  {pair: serving, roots: ca.Pool(), opts: x509.VerifyOptions{DNSName: "example.com"}, wantErr: true},
		"serving from another CA":   {pair: serving, roots: other.Pool(), opts: x509.VerifyOptions{DNSName: "localhost"}, wantErr: true},
		"client for client auth":    {pair: client, roots: ca.Pool(), opts: x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
		"client is no serving cert": {pair: client, roots: ca.Pool(), opts: x509.VerifyOptions{}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cert, err := tc.pair.TLS()
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(cert.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			tc.opts.Roots = tc.roots
			if _, err := leaf.Verify(tc.opts); (err != nil) != tc.wantErr {
				t.Errorf("verify: %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

func TestWriteServing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	bundle, err := pki.WriteServing(dir, "webhook", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("the CA bundle holds no certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("the written certificate does not verify against the bundle: %v", err)
	}
	if info, err := os.Stat(filepath.Join(dir, "tls.key")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("tls.key: %v, %v; want mode 0600", info, err)
	}
}
