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

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/satoken"
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
	// ServiceAccount is set for a Pod's service account token, verified
	// for the one lease it may read the confirmation of; such a principal
	// acts as no holder (Subject is only its name in the access log).
	ServiceAccount *satoken.Identity
}

// mayHold reports whether p may act as holder: "<subject>" or "<subject>/...".
// With authentication off (no subject) every holder is allowed. A service
// account acts as no holder.
func (p Principal) mayHold(holder string) bool {
	if p.ServiceAccount != nil {
		return false
	}
	return p.Subject == "" || holder == p.Subject || strings.HasPrefix(holder, p.Subject+"/")
}

// mayConfirm reports whether p may read the confirmation of key for
// holder: an administrator, the holder's owner, or a Pod of key's namespace
// in holder's cluster whose token was verified for key.
func (p Principal) mayConfirm(key leaseapi.Key, holder string) bool {
	if sa := p.ServiceAccount; sa != nil {
		return sa.Lease == key && sa.Namespace == key.Namespace && sa.Cluster == leaseapi.HolderCluster(holder)
	}
	return p.Admin || p.mayHold(holder)
}

// serviceAccountScope is what a route that accepts service account tokens
// verifies them for: the lease the request is about, and the cluster whose
// keys must have signed the token (its holder's). An error is the
// request's own (a 400).
type serviceAccountScope func(r *http.Request) (cluster string, key leaseapi.Key, err error)

// Authenticator resolves a request's principal.
type Authenticator struct {
	tokens   *TokenFile // nil: no bearer tokens
	mTLS     bool       // verified client certificates name the subject
	admins   map[string]bool
	disabled bool
	// serviceAccounts verifies the Pods' service account tokens on the
	// routes that accept them; nil: none are accepted.
	serviceAccounts *satoken.Verifier
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

// AcceptServiceAccounts lets the routes that accept them (the confirmation
// of a lease) authenticate a Pod by its Kubernetes service account token,
// verified by v. Call it before serving.
func (a *Authenticator) AcceptServiceAccounts(v *satoken.Verifier) *Authenticator {
	a.serviceAccounts = v
	return a
}

// Enabled reports whether requests are authenticated.
func (a *Authenticator) Enabled() bool { return !a.disabled }

// Authenticate resolves the principal of r: a bearer token when one is
// presented, else a verified client certificate's common name.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	return a.authenticate(r, nil)
}

// authenticate is Authenticate on a route that, when scope is not nil, also
// accepts a service account token verified for the scope of the request. A
// bearer token the token file knows is always the principal it names; only
// a bearer in JWT form that it does not know is verified as a service
// account token.
func (a *Authenticator) authenticate(r *http.Request, scope serviceAccountScope) (Principal, error) {
	if a.disabled {
		return Principal{Admin: true}, nil
	}
	if h := r.Header.Get("Authorization"); h != "" {
		token, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			return Principal{}, errUnauthenticated
		}
		if a.tokens != nil {
			if subject, ok := a.tokens.Lookup(token); ok {
				return Principal{Subject: subject, Admin: a.admins[subject]}, nil
			}
		}
		if scope != nil && a.serviceAccounts != nil && satoken.LooksLikeJWT(token) {
			return a.serviceAccount(r, token, scope)
		}
		return Principal{}, errUnauthenticated
	}
	if a.mTLS && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		subject := r.TLS.VerifiedChains[0][0].Subject.CommonName
		if subject != "" {
			return Principal{Subject: subject, Admin: a.admins[subject]}, nil
		}
	}
	return Principal{}, errUnauthenticated
}

// serviceAccount verifies token as a service account token for the scope
// of r.
func (a *Authenticator) serviceAccount(r *http.Request, token string, scope serviceAccountScope) (Principal, error) {
	cluster, key, err := scope(r)
	if err != nil {
		return Principal{}, err
	}
	id, err := a.serviceAccounts.Verify(token, cluster, key)
	switch {
	case errors.Is(err, satoken.ErrNotAllowed):
		return Principal{}, fmt.Errorf("%w: %w", errForbidden, err)
	case err != nil:
		return Principal{}, fmt.Errorf("%w: %w", errUnauthenticated, err)
	}
	return Principal{Subject: id.Subject(), ServiceAccount: &id}, nil
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
