package satoken

import (
	"errors"
	"fmt"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi"
)

// Leeway is how far in the future a token's nbf and iat may lie (the
// clusters' clocks and the lease API's may differ a little). A token's
// expiry gets none.
const Leeway = time.Minute

// Algorithms are the signature algorithms a token may use: the asymmetric
// ones a kube-apiserver signs with. "none" and the HMAC algorithms are not
// among them, so a public key can never serve as a shared secret.
var Algorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512,
}

// The errors of Verify. Their messages never quote the token.
var (
	// ErrUnverified: the token is not a valid token of the cluster:
	// malformed, no keys for the cluster, unknown key, bad signature,
	// expired or not yet valid.
	ErrUnverified = errors.New("service account token not verified")
	// ErrNotAllowed: a valid token of the cluster that does not grant what
	// is asked: another audience (lease), another namespace, or not bound
	// to a Pod.
	ErrNotAllowed = errors.New("service account token not allowed")
)

// Identity is who a verified token speaks for: a Pod of a service account
// in a namespace of a cluster, allowed to confirm one lease.
type Identity struct {
	Cluster        string
	Namespace      string
	ServiceAccount string
	PodName        string
	PodUID         string
	// Lease is the lease the token was verified for (its audience).
	Lease leaseapi.Key
}

// Subject names the identity in logs:
// "system:serviceaccount:<namespace>:<name>@<cluster>".
func (id Identity) Subject() string {
	return "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount + "@" + id.Cluster
}

// Verifier verifies service account tokens against the clusters' keys.
type Verifier struct {
	keys  *KeySets
	clock clock.PassiveClock
}

// NewVerifier returns a verifier of keys, judging expiry on clk (the real
// clock when nil).
func NewVerifier(keys *KeySets, clk clock.PassiveClock) *Verifier {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Verifier{keys: keys, clock: clk}
}

// Keys are the key sets the verifier uses.
func (v *Verifier) Keys() *KeySets { return v.keys }

// claims are the private claims of a Kubernetes service account token.
type claims struct {
	Kubernetes *struct {
		Namespace      string   `json:"namespace"`
		Pod            *nameUID `json:"pod"`
		ServiceAccount *nameUID `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

type nameUID struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// Verify checks that raw is a service account token of cluster, signed with
// one of its keys, unexpired, for audience leaseapi.ConfirmAudience(key),
// of key's namespace and bound to a Pod, and returns whom it speaks for.
// A failure wraps ErrUnverified or ErrNotAllowed.
func (v *Verifier) Verify(raw, cluster string, key leaseapi.Key) (Identity, error) {
	set, ok := v.keys.keys(cluster)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no service account keys for cluster %q", ErrUnverified, cluster)
	}
	tok, err := jwt.ParseSigned(raw, Algorithms)
	if err != nil || len(tok.Headers) != 1 {
		return Identity{}, fmt.Errorf("%w: not a JWT signed with one of %s", ErrUnverified, algorithmNames())
	}
	header := tok.Headers[0]
	if header.KeyID == "" {
		return Identity{}, fmt.Errorf("%w: the token names no signing key (kid)", ErrUnverified)
	}
	var (
		std      jwt.Claims
		private  claims
		verified bool
	)
	for _, k := range set.Key(header.KeyID) {
		if k.Algorithm != "" && k.Algorithm != header.Algorithm {
			continue
		}
		if tok.Claims(k.Key, &std, &private) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return Identity{}, fmt.Errorf("%w: not signed by a service account key of cluster %q", ErrUnverified, cluster)
	}
	now := v.clock.Now()
	switch err := std.ValidateWithLeeway(jwt.Expected{Time: now}, Leeway); {
	case std.Expiry == nil:
		return Identity{}, fmt.Errorf("%w: the token has no expiry (exp)", ErrUnverified)
	case !now.Before(std.Expiry.Time()):
		return Identity{}, fmt.Errorf("%w: the token expired at %s", ErrUnverified, std.Expiry.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrNotValidYet):
		return Identity{}, fmt.Errorf("%w: the token is not valid before %s (nbf)", ErrUnverified, std.NotBefore.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Identity{}, fmt.Errorf("%w: the token is issued in the future (iat)", ErrUnverified)
	case err != nil:
		return Identity{}, fmt.Errorf("%w: %w", ErrUnverified, err)
	}
	k8s := private.Kubernetes
	if k8s == nil || k8s.Namespace == "" {
		return Identity{}, fmt.Errorf("%w: not a Kubernetes service account token (no kubernetes.io namespace claim)", ErrNotAllowed)
	}
	if want := leaseapi.ConfirmAudience(key); !std.Audience.Contains(want) {
		return Identity{}, fmt.Errorf("%w: the token's audience does not include %q", ErrNotAllowed, want)
	}
	if k8s.Namespace != key.Namespace {
		return Identity{}, fmt.Errorf("%w: a service account of namespace %q may not confirm lease %s", ErrNotAllowed, k8s.Namespace, key)
	}
	if k8s.Pod == nil || k8s.Pod.Name == "" {
		return Identity{}, fmt.Errorf("%w: the token is not bound to a Pod (use a projected service account token)", ErrNotAllowed)
	}
	id := Identity{Cluster: cluster, Namespace: k8s.Namespace, PodName: k8s.Pod.Name, PodUID: k8s.Pod.UID, Lease: key}
	if k8s.ServiceAccount != nil {
		id.ServiceAccount = k8s.ServiceAccount.Name
	}
	return id, nil
}

// LooksLikeJWT reports whether s has the compact form of a signed JWT:
// three base64url segments separated by dots. It verifies nothing.
func LooksLikeJWT(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.IndexFunc(p, notBase64URL) >= 0 {
			return false
		}
	}
	return true
}

func notBase64URL(r rune) bool {
	base64URL := r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_'
	return !base64URL
}

func algorithmNames() string {
	names := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}
