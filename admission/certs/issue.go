package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"time"
)

// caCommonName is the common name of every CA this package makes.
const caCommonName = "berth-agent-webhook-ca"

// Next returns the Secret data that carries out d on data at now: a new CA (ECDSA
// P-256, Policy.CAValidity) when d.NewCA, a new serving certificate for names signed by
// the CA (ECDSA P-256, Policy.ServingValidity, never past the CA's expiry) when
// d.NewServing, and the CA bundle Bundle makes of the current CA and data's old bundle.
// What d keeps is copied from data. Keys and serial numbers come from random.
func Next(now time.Time, data map[string][]byte, d Decision, names []string, p Policy, random io.Reader) (map[string][]byte, error) {
	p = p.withDefaults()
	out := map[string][]byte{KeyCert: data[KeyCert], KeyKey: data[KeyKey], KeyCAKey: data[KeyCAKey]}
	var ca *x509.Certificate
	var caKey crypto.Signer
	var err error
	if d.NewCA != "" {
		if ca, caKey, out[KeyCAKey], err = newCA(now, p.CAValidity, random); err != nil {
			return nil, err
		}
	} else {
		if ca, err = parseCert(data[KeyCABundle]); err != nil {
			return nil, fmt.Errorf("parse the CA certificate: %w", err)
		}
		if caKey, err = parseKey(data[KeyCAKey]); err != nil {
			return nil, fmt.Errorf("parse the CA key: %w", err)
		}
	}
	if d.NewCA != "" || d.NewServing != "" {
		if out[KeyCert], out[KeyKey], err = newServing(now, p.ServingValidity, names, ca, caKey, random); err != nil {
			return nil, err
		}
	}
	out[KeyCABundle] = EncodeBundle(Bundle(now, ca, p.Overlap, ParseBundle(data[KeyCABundle])))
	return out, nil
}

// newCA makes a self-signed CA valid from now (backdated) for validity.
func newCA(now time.Time, validity time.Duration, random io.Reader) (*x509.Certificate, crypto.Signer, []byte, error) {
	key, keyPEM, err := newKey(random)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl, err := template(now, now.Add(validity), caCommonName, random)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(random, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("sign the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse the new CA certificate: %w", err)
	}
	return cert, key, keyPEM, nil
}

// newServing issues a server certificate for names, signed by ca, valid from now
// (backdated) for validity or until the CA expires, whichever comes first.
func newServing(now time.Time, validity time.Duration, names []string, ca *x509.Certificate, caKey crypto.Signer, random io.Reader) (certPEM, keyPEM []byte, err error) {
	key, keyPEM, err := newKey(random)
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if ca.NotAfter.Before(notAfter) {
		notAfter = ca.NotAfter
	}
	tmpl, err := template(now, notAfter, names[0], random)
	if err != nil {
		return nil, nil, err
	}
	tmpl.DNSNames = names
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	der, err := x509.CreateCertificate(random, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the serving certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func template(now, notAfter time.Time, cn string, random io.Reader) (*x509.Certificate, error) {
	serial, err := randSerial(random)
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"berth"}},
		NotBefore:    now.Add(-backdate).UTC().Truncate(time.Second),
		NotAfter:     notAfter.UTC().Truncate(time.Second),
	}, nil
}

// randSerial is a random positive 128-bit serial number.
func randSerial(random io.Reader) (*big.Int, error) {
	serial, err := rand.Int(random, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("make a serial number: %w", err)
	}
	return serial.Add(serial, big.NewInt(1)), nil
}

func newKey(random io.Reader) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), random)
	if err != nil {
		return nil, nil, fmt.Errorf("generate a key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode a key: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
