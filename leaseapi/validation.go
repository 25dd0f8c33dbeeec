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

// Validate checks a batched renewal: the holder as for renew, between 1 and
// MaxBatchLeases leases, each with a valid key, token and TTL, and no key
// twice. Fields of a lease are named by its index ("leases[3].ttlSeconds").
func (r *BatchRenewRequest) Validate() error {
	errs := []error{validateHolder(r.Holder)}
	if n := len(r.Leases); n < 1 || n > MaxBatchLeases {
		return errors.Join(append(errs, &FieldError{Field: "leases", Reason: fmt.Sprintf("must hold between 1 and %d leases, got %d", MaxBatchLeases, n)})...)
	}
	seen := make(map[Key]int, len(r.Leases))
	bad := 0
	for i, l := range r.Leases {
		err := l.validate()
		k := Key{Namespace: l.Namespace, Name: l.Name}
		if first, ok := seen[k]; ok && err == nil {
			err = &FieldError{Field: fmt.Sprintf("leases[%d]", i), Reason: fmt.Sprintf("duplicate of leases[%d]", first)}
		} else if err != nil {
			err = indexed(i, err)
		} else {
			seen[k] = i
		}
		if err == nil {
			continue
		}
		if bad++; bad > maxBatchErrors {
			errs = append(errs, &FieldError{Field: "leases", Reason: fmt.Sprintf("more than %d leases are invalid; the first are named", maxBatchErrors)})
			break
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// maxBatchErrors bounds the field errors one batch reports, so that a batch
// of ten thousand bad leases is not answered with ten thousand reasons.
const maxBatchErrors = 10

func (l *BatchRenewal) validate() error {
	return errors.Join(Key{Namespace: l.Namespace, Name: l.Name}.Validate(), validateToken(l.FencingToken), validateTTL(l.TTLSeconds))
}

// indexed names the fields of err's field errors as fields of leases[i].
func indexed(i int, err error) error {
	var errs []error
	for _, e := range unjoin(err) {
		var fe *FieldError
		if errors.As(e, &fe) {
			e = &FieldError{Field: fmt.Sprintf("leases[%d].%s", i, fe.Field), Reason: fe.Reason}
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// unjoin is the errors that errors.Join joined into err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Validate checks a release request.
func (r *ReleaseRequest) Validate() error {
	return errors.Join(validateHolder(r.Holder), validateToken(r.FencingToken))
}

// Validate checks a move: a release request, and a destination (when
// given) that is a cluster id other than the holder's own cluster (the
// holder up to its first "/").
func (r *MoveRequest) Validate() error {
	errs := []error{validateHolder(r.Holder), validateToken(r.FencingToken)}
	if r.To != "" {
		own := HolderCluster(r.Holder)
		switch err := ValidateClusterID(r.To); {
		case err != nil:
			errs = append(errs, &FieldError{Field: "to", Reason: strings.TrimPrefix(err.Error(), "id: ")})
		case r.To == own:
			errs = append(errs, &FieldError{Field: "to", Reason: fmt.Sprintf("must not be the holder's own cluster %q", own)})
		}
	}
	return errors.Join(errs...)
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

// HolderCluster is the cluster a holder identity belongs to: the holder up
// to its first "/" (a cluster acts as "<id>" or "<id>/...").
func HolderCluster(holder string) string {
	id, _, _ := strings.Cut(holder, "/")
	return id
}
