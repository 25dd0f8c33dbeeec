package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
)

var (
	errUnauthenticated = errors.New("missing or invalid credentials")
	errForbidden       = errors.New("forbidden")
)

// Principal is who a request acts as.
type Principal struct {
	// Subject is the authenticated name; empty when authentication is off.
	Subject string
	// Admin may cordon clusters and release any lease.
	Admin bool
}

// mayHold reports whether p may act as holder: "<subject>" or "<subject>/...".
// With authentication off (no subject) every holder is allowed.
func (p Principal) mayHold(holder string) bool {
	return p.Subject == "" || holder == p.Subject || strings.HasPrefix(holder, p.Subject+"/")
}

// Authenticator resolves a request's principal.
type Authenticator struct {
	tokens   *TokenFile // nil: no bearer tokens
	mTLS     bool       // verified client certificates name the subject
	admins   map[string]bool
	disabled bool
}

// NewAuthenticator returns an authenticator. With neither tokens nor client
// certificates, authentication is off and every caller is an administrator;
// the server then listens on loopback only.
func NewAuthenticator(tokens *TokenFile, clientCerts bool, adminSubjects []string) *Authenticator {
	a := &Authenticator{tokens: tokens, mTLS: clientCerts, admins: map[string]bool{}}
	for _, s := range adminSubjects {
		a.admins[s] = true
	}
	a.disabled = tokens == nil && !clientCerts
	return a
}

// Enabled reports whether requests are authenticated.
func (a *Authenticator) Enabled() bool { return !a.disabled }

// Authenticate resolves the principal of r: a bearer token when one is
// presented, else a verified client certificate's common name.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	if a.disabled {
		return Principal{Admin: true}, nil
	}
	if h := r.Header.Get("Authorization"); h != "" {
		token, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || a.tokens == nil {
			return Principal{}, errUnauthenticated
		}
		subject, ok := a.tokens.Lookup(token)
		if !ok {
			return Principal{}, errUnauthenticated
		}
		return Principal{Subject: subject, Admin: a.admins[subject]}, nil
	}
	if a.mTLS && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		subject := r.TLS.VerifiedChains[0][0].Subject.CommonName
		if subject != "" {
			return Principal{Subject: subject, Admin: a.admins[subject]}, nil
		}
	}
	return Principal{}, errUnauthenticated
}

// TokenFile holds bearer tokens read from a file of "<subject>:<sha256-hex>"
// lines; blank lines and lines starting with # are ignored. Reload swaps the
// whole set atomically, so a bad file never leaves a half-read set in force.
type TokenFile struct {
	path   string
	hashes atomic.Pointer[map[[sha256.Size]byte]string]
}

// LoadTokenFile reads path.
func LoadTokenFile(path string) (*TokenFile, error) {
	t := &TokenFile{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload re-reads the file; on error the previous tokens stay in force.
func (t *TokenFile) Reload() error {
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("read token file: %w", err)
	}
	hashes, err := parseTokenFile(data)
	if err != nil {
		return fmt.Errorf("token file %s: %w", t.path, err)
	}
	t.hashes.Store(&hashes)
	return nil
}

// Len is the number of tokens in force.
func (t *TokenFile) Len() int { return len(*t.hashes.Load()) }

// Lookup returns the subject of token.
func (t *TokenFile) Lookup(token string) (string, bool) {
	subject, ok := (*t.hashes.Load())[sha256.Sum256([]byte(token))]
	return subject, ok
}

func parseTokenFile(data []byte) (map[[sha256.Size]byte]string, error) {
	hashes := map[[sha256.Size]byte]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		subject, hexHash, ok := strings.Cut(line, ":")
		if !ok || subject == "" {
			return nil, fmt.Errorf("line %d: want <subject>:<sha256-hex-of-token>", n)
		}
		raw, err := hex.DecodeString(hexHash)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("line %d: %q is not a hex SHA-256 digest", n, hexHash)
		}
		hashes[[sha256.Size]byte(raw)] = subject
	}
	return hashes, sc.Err()
}
