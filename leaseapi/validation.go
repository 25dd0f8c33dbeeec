package leaseapi

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldError is a request that names a field the server cannot accept.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Key identifies a lease: {namespace}/{name}.
type Key struct {
	Namespace string
	Name      string
}

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// ParseKey parses "namespace/name" and validates it.
func ParseKey(s string) (Key, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return Key{}, &FieldError{Field: "key", Reason: fmt.Sprintf("%q is not of the form namespace/name", s)}
	}
	k := Key{Namespace: ns, Name: name}
	return k, k.Validate()
}

// Validate checks that the namespace is an RFC 1123 DNS label, the name an
// RFC 1123 DNS subdomain, and "namespace.name" at most MaxKeyLength characters.
func (k Key) Validate() error {
	if msgs := validation.IsDNS1123Label(k.Namespace); len(msgs) > 0 {
		return &FieldError{Field: "namespace", Reason: strings.Join(msgs, "; ")}
	}
	if msgs := validation.IsDNS1123Subdomain(k.Name); len(msgs) > 0 {
		return &FieldError{Field: "name", Reason: strings.Join(msgs, "; ")}
	}
	if n := len(k.Namespace) + 1 + len(k.Name); n > MaxKeyLength {
		return &FieldError{Field: "name", Reason: fmt.Sprintf("namespace.name must be no more than %d characters, got %d", MaxKeyLength, n)}
	}
	return nil
}

// ValidateClusterID checks a cluster id: an RFC 1123 DNS subdomain, so that
// it can stand as a holder identity and as a path segment.
func ValidateClusterID(id string) error {
	if msgs := validation.IsDNS1123Subdomain(id); len(msgs) > 0 {
		return &FieldError{Field: "id", Reason: strings.Join(msgs, "; ")}
	}
	return nil
}

// Validate checks an acquire request.
func (r *AcquireRequest) Validate() error {
	return errors.Join(validateHolder(r.Holder), validateTTL(r.TTLSeconds))
}

// Validate checks a renew request.
func (r *RenewRequest) Validate() error {
	return errors.Join(validateHolder(r.Holder), validateToken(r.FencingToken), validateTTL(r.TTLSeconds))
}

// Validate checks a release request.
func (r *ReleaseRequest) Validate() error {
	return errors.Join(validateHolder(r.Holder), validateToken(r.FencingToken))
}

// Validate checks a cluster registration.
func (r *ClusterRegistration) Validate() error {
	var errs []error
	switch {
	case r.Fingerprint == "":
		errs = append(errs, &FieldError{Field: "fingerprint", Reason: "must not be empty"})
	case len(r.Fingerprint) > 253:
		errs = append(errs, &FieldError{Field: "fingerprint", Reason: "must be at most 253 bytes"})
	}
	if len(r.AgentVersion) > 128 {
		errs = append(errs, &FieldError{Field: "agentVersion", Reason: "must be at most 128 bytes"})
	}
	for k, v := range r.Labels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, &FieldError{Field: "labels", Reason: fmt.Sprintf("key %q: %s", k, strings.Join(msgs, "; "))})
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			errs = append(errs, &FieldError{Field: "labels", Reason: fmt.Sprintf("value of %q: %s", k, strings.Join(msgs, "; "))})
		}
	}
	return errors.Join(errs...)
}

// ValidateHolder checks a holder identity: not empty, at most MaxHolderBytes.
func ValidateHolder(holder string) error { return validateHolder(holder) }

func validateHolder(holder string) error {
	switch {
	case holder == "":
		return &FieldError{Field: "holder", Reason: "must not be empty"}
	case len(holder) > MaxHolderBytes:
		return &FieldError{Field: "holder", Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxHolderBytes, len(holder))}
	}
	return nil
}

func validateTTL(ttl int32) error {
	if ttl < 1 || ttl > MaxTTLSeconds {
		return &FieldError{Field: "ttlSeconds", Reason: fmt.Sprintf("must be between 1 and %d, got %d", MaxTTLSeconds, ttl)}
	}
	return nil
}

func validateToken(token int32) error {
	if token < 1 {
		return &FieldError{Field: "fencingToken", Reason: fmt.Sprintf("must be at least 1, got %d", token)}
	}
	return nil
}
