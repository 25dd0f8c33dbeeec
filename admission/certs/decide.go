package certs

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Keys of the Secret's data.
const (
	// KeyCert is the serving certificate, the file the webhook server serves.
	KeyCert = corev1.TLSCertKey
	// KeyKey is the serving certificate's private key.
	KeyKey = corev1.TLSPrivateKeyKey
	// KeyCABundle is the CA bundle: the current CA first, then the CAs still trusted
	// after a CA rotation (see Bundle).
	KeyCABundle = "ca.crt"
	// KeyCAKey is the current CA's private key. It never leaves the Secret.
	KeyCAKey = "ca.key"
)

// Default validities (see Policy).
const (
	DefaultCAValidity      = 10 * 365 * 24 * time.Hour
	DefaultServingValidity = 365 * 24 * time.Hour
	DefaultOverlap         = 24 * time.Hour
)

// backdate is how far before its making a certificate's NotBefore lies, so that a
// replica, or an API server, whose clock is a little behind accepts it at once.
const backdate = time.Hour

// Policy says how long certificates live and how long an old CA stays trusted.
// A certificate is renewed once less than a third of its lifetime (NotAfter −
// NotBefore) remains: a serving certificate of one year about four months before it
// expires, a CA of ten years about three years before. A serving certificate never
// outlives its CA.
type Policy struct {
	// CAValidity is the lifetime of a new CA; default DefaultCAValidity.
	CAValidity time.Duration
	// ServingValidity is the lifetime of a new serving certificate; default
	// DefaultServingValidity.
	ServingValidity time.Duration
	// Overlap is how long a replaced CA stays in the CA bundle after the new CA was
	// made (never past its own expiry), so that replicas still serving a certificate
	// of the old CA stay trusted until they pick up the new one; default
	// DefaultOverlap.
	Overlap time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.CAValidity <= 0 {
		p.CAValidity = DefaultCAValidity
	}
	if p.ServingValidity <= 0 {
		p.ServingValidity = DefaultServingValidity
	}
	if p.Overlap <= 0 {
		p.Overlap = DefaultOverlap
	}
	return p
}

// Reason says why a certificate is replaced.
type Reason string

// Reasons for replacing a certificate. The empty Reason keeps it.
const (
	ReasonMissing     Reason = "Missing"     // the certificate or its key is absent
	ReasonUnparsable  Reason = "Unparsable"  // not PEM, or not a certificate or key Go can parse
	ReasonKeyMismatch Reason = "KeyMismatch" // the key is not the certificate's
	ReasonNotCA       Reason = "NotCA"       // the CA certificate may not sign certificates
	ReasonNotYetValid Reason = "NotYetValid" // NotBefore is in the future
	ReasonExpired     Reason = "Expired"     // NotAfter has passed
	ReasonExpiring    Reason = "Expiring"    // less than a third of its lifetime remains
	ReasonWrongNames  Reason = "WrongNames"  // the serving certificate is for other DNS names
	ReasonWrongCA     Reason = "WrongCA"     // the serving certificate is not signed by the current CA
	ReasonNotServing  Reason = "NotServing"  // it does not verify as a server certificate for the names
	ReasonNewCA       Reason = "NewCA"       // the CA is replaced, so the serving certificate is too
)

// Decision is what to do with a Secret's data.
type Decision struct {
	// NewCA says why a new CA must be made; empty keeps the CA.
	NewCA Reason
	// NewServing says why a new serving certificate must be issued; empty keeps it.
	NewServing Reason
	// StaleBundle says the CA bundle, with the CA kept, is not what Bundle makes of it
	// now (an old CA's overlap ended, or the bundle is not in its canonical form).
	StaleBundle bool
}

// Changes reports whether the Secret must be written.
func (d Decision) Changes() bool { return d.NewCA != "" || d.NewServing != "" || d.StaleBundle }

// DNSNames are the names the API server may use for the webhook Service svc in
// namespace ns; it calls it <svc>.<ns>.svc.
func DNSNames(svc, ns string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// Decide judges a Secret's data at now against the wanted DNS names and the policy:
// a CA that is missing, unparsable, not a CA, not yet valid, expired or expiring, or
// whose key is not its own, is replaced, and the serving certificate with it; a serving
// certificate that is missing, unparsable, not the key's, not signed by the CA, for
// other names than exactly names, not valid for serving, not yet valid, expired or
// expiring is reissued by the CA kept. The bundle is judged by Bundle.
func Decide(now time.Time, data map[string][]byte, names []string, p Policy) Decision {
	p = p.withDefaults()
	ca, why := judgeCA(now, data)
	if why != "" {
		return Decision{NewCA: why, NewServing: ReasonNewCA}
	}
	d := Decision{NewServing: judgeServing(now, data, ca, names)}
	want := EncodeBundle(Bundle(now, ca, p.Overlap, ParseBundle(data[KeyCABundle])))
	d.StaleBundle = !bytes.Equal(want, data[KeyCABundle])
	return d
}

// judgeCA returns the current CA (the first certificate of the bundle), or why it and
// its key cannot be used.
func judgeCA(now time.Time, data map[string][]byte) (*x509.Certificate, Reason) {
	if len(data[KeyCABundle]) == 0 || len(data[KeyCAKey]) == 0 {
		return nil, ReasonMissing
	}
	ca, err := parseCert(data[KeyCABundle])
	if err != nil {
		return nil, ReasonUnparsable
	}
	key, err := parseKey(data[KeyCAKey])
	if err != nil {
		return nil, ReasonUnparsable
	}
	if !keyMatches(ca, key) {
		return nil, ReasonKeyMismatch
	}
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, ReasonNotCA
	}
	if why := judgeTime(now, ca); why != "" {
		return nil, why
	}
	return ca, ""
}

// judgeServing says why the serving certificate must be reissued by ca, or "".
func judgeServing(now time.Time, data map[string][]byte, ca *x509.Certificate, names []string) Reason {
	if len(data[KeyCert]) == 0 || len(data[KeyKey]) == 0 {
		return ReasonMissing
	}
	cert, err := parseCert(data[KeyCert])
	if err != nil {
		return ReasonUnparsable
	}
	key, err := parseKey(data[KeyKey])
	if err != nil {
		return ReasonUnparsable
	}
	if !keyMatches(cert, key) {
		return ReasonKeyMismatch
	}
	if !bytes.Equal(cert.RawIssuer, ca.RawSubject) || cert.CheckSignatureFrom(ca) != nil {
		return ReasonWrongCA
	}
	if !sameNames(cert.DNSNames, names) || len(cert.IPAddresses)+len(cert.URIs)+len(cert.EmailAddresses) > 0 {
		return ReasonWrongNames
	}
	if why := judgeTime(now, cert); why != "" {
		return why
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, name := range names {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return ReasonNotServing
		}
	}
	return ""
}

// judgeTime applies the validity window and the renewal rule (a third of the lifetime).
func judgeTime(now time.Time, cert *x509.Certificate) Reason {
	switch {
	case now.Before(cert.NotBefore):
		return ReasonNotYetValid
	case !now.Before(cert.NotAfter):
		return ReasonExpired
	case !now.Before(RenewAt(cert)):
		return ReasonExpiring
	}
	return ""
}

// RenewAt is when cert is renewed: once less than a third of its lifetime remains.
func RenewAt(cert *x509.Certificate) time.Time {
	return cert.NotAfter.Add(-cert.NotAfter.Sub(cert.NotBefore) / 3)
}

// sameNames reports whether got and want hold the same names, in any order.
func sameNames(got, want []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
}

// Bundle is the CA bundle to trust at now: current first, then each other CA
// certificate of previous (in order, once each) that is still valid at now and whose
// overlap has not ended. A replaced CA stays trusted for overlap after current was made
// (current's NotBefore plus the backdating), never past its own NotAfter. Certificates
// that are not CAs are dropped.
func Bundle(now time.Time, current *x509.Certificate, overlap time.Duration, previous ...[]*x509.Certificate) []*x509.Certificate {
	out := []*x509.Certificate{current}
	end := current.NotBefore.Add(backdate + overlap)
	for _, certs := range previous {
		for _, c := range certs {
			switch {
			case !c.IsCA || !c.BasicConstraintsValid:
			case !now.Before(c.NotAfter) || !now.Before(end):
			case slices.ContainsFunc(out, c.Equal):
			default:
				out = append(out, c)
			}
		}
	}
	return out
}

// TrustBundle is the caBundle of the webhook configurations at now: the Secret's bundle
// (its current CA first), then the CAs of the configurations' existing caBundles that
// Bundle keeps for the overlap. So a replica still serving a certificate from a CA the
// Secret no longer names (it was deleted or garbled and made anew) stays trusted until
// it has picked up the new one. Without a parsable CA in secretBundle it is nil.
func TrustBundle(now time.Time, secretBundle []byte, existing [][]byte, p Policy) []byte {
	p = p.withDefaults()
	certs := ParseBundle(secretBundle)
	if len(certs) == 0 {
		return nil
	}
	previous := [][]*x509.Certificate{certs[1:]}
	for _, b := range existing {
		previous = append(previous, ParseBundle(b))
	}
	return EncodeBundle(Bundle(now, certs[0], p.Overlap, previous...))
}

// ParseBundle returns the certificates of a PEM bundle that parse, in order, and skips
// everything else.
func ParseBundle(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return out
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// EncodeBundle is certs as PEM, in order.
func EncodeBundle(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// parseCert parses the first PEM block of data, which must be a certificate.
func parseCert(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// parseKey parses a PEM private key (PKCS #8, SEC 1 or PKCS #1).
func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key", block.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key %T cannot sign", key)
	}
	return signer, nil
}

func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}
