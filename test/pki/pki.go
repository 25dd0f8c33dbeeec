// Package pki makes the certificates and keys that tests and test
// environments need: a certificate authority per test or per cluster, serving
// and client certificates it signs, and key pairs for signing tokens. Every key
// is ECDSA P-256, made fresh and kept in memory (or in files the caller names);
// nothing here is fit for production use, and nothing here reads or writes a
// system trust store.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// validity is long enough for any sandbox and short enough not to matter if leaked.
const validity = 365 * 24 * time.Hour

// KeyPair is a PEM-encoded certificate and its private key.
type KeyPair struct {
	Cert, Key []byte
}

// TLS returns the pair as a certificate for a tls.Config.
func (k KeyPair) TLS() (tls.Certificate, error) {
	return tls.X509KeyPair(k.Cert, k.Key)
}

// WriteFiles writes the pair as tls.crt and tls.key into dir (made if
// missing), where controller-runtime's webhook server looks for them.
func (k KeyPair) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), k.Cert, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tls.key"), k.Key, 0o600)
}

// Authority is a certificate authority made up for a test or a test cluster.
// Giving each cluster its own makes a credential for one cluster worthless at
// another, as between real clusters.
type Authority struct {
	// CertPEM is the authority's certificate, the CA bundle of what it signs.
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// NewAuthority makes a certificate authority with common name name-ca.
func NewAuthority(name string) (*Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl, err := template(name + "-ca")
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &Authority{CertPEM: encodeCert(der), cert: cert, key: key}, nil
}

// Pool is a certificate pool holding only the authority.
func (a *Authority) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(a.cert)
	return p
}

// ClientCert issues a client certificate: a Kubernetes API server takes the
// common name as the user name and the organizations as the groups; the lease
// API takes the common name as the subject.
func (a *Authority) ClientCert(user string, groups ...string) (KeyPair, error) {
	tmpl, err := template(user)
	if err != nil {
		return KeyPair{}, err
	}
	tmpl.Subject.Organization = groups
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return a.issue(tmpl)
}

// ServingCert issues a server certificate for the given host names and IP addresses.
func (a *Authority) ServingCert(name string, hosts ...string) (KeyPair, error) {
	tmpl, err := template(name)
	if err != nil {
		return KeyPair{}, err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return a.issue(tmpl)
}

func (a *Authority) issue(tmpl *x509.Certificate) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generate key for %s: %w", tmpl.Subject.CommonName, err)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("sign certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{Cert: encodeCert(der), Key: keyPEM}, nil
}

// WriteServing makes an authority named name, issues it a serving certificate
// for hosts, writes that as tls.crt and tls.key into dir, and returns the
// authority's certificate as the CA bundle that trusts it.
func WriteServing(dir, name string, hosts ...string) (caBundle []byte, err error) {
	ca, err := NewAuthority(name)
	if err != nil {
		return nil, err
	}
	serving, err := ca.ServingCert(name, hosts...)
	if err != nil {
		return nil, err
	}
	if err := serving.WriteFiles(dir); err != nil {
		return nil, fmt.Errorf("write serving certificate: %w", err)
	}
	return ca.CertPEM, nil
}

func template(commonName string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
	}, nil
}

// SigningKeys returns a fresh key pair for signing tokens (a Kubernetes API
// server's service account tokens): the PEM private and public keys.
func SigningKeys() (private, public []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate signing key: %w", err)
	}
	private, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("encode public key: %w", err)
	}
	return private, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
