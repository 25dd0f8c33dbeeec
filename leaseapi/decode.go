package leaseapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	sigsjson "sigs.k8s.io/json"
)

// ErrBodyTooLarge is returned by Decode for a body over MaxBodyBytes.
var ErrBodyTooLarge = fmt.Errorf("request body exceeds %d bytes", MaxBodyBytes)

// BodyTooLarge is the error of a body over limit bytes. It matches
// ErrBodyTooLarge and names limit.
func BodyTooLarge(limit int) error {
	if limit == MaxBodyBytes {
		return ErrBodyTooLarge
	}
	return &bodyTooLargeError{limit: limit}
}

type bodyTooLargeError struct{ limit int }

func (e *bodyTooLargeError) Error() string {
	return fmt.Sprintf("request body exceeds %d bytes", e.limit)
}

func (e *bodyTooLargeError) Is(target error) bool { return target == ErrBodyTooLarge }

// Decode reads exactly one JSON value from r into v. It refuses bodies over
// MaxBodyBytes, unknown fields, and anything after the value, and names the
// offending field where it can, so that a 400 tells the caller what to fix.
func Decode(r io.Reader, v any) error {
	return DecodeLimited(r, v, MaxBodyBytes)
}

// DecodeLimited is Decode with a body bound of limit bytes instead of
// MaxBodyBytes (MaxBatchBodyBytes for a batched renewal).
func DecodeLimited(r io.Reader, v any, limit int) error {
	body, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return fmt.Errorf("read request body: %w", err)
	}
	if len(body) > limit {
		return BodyTooLarge(limit)
	}
	return DecodeBytes(body, v)
}

// DecodeBytes is Decode on a body already read.
func DecodeBytes(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &FieldError{Field: "body", Reason: "must hold exactly one JSON value"}
	}
	// encoding/json matches keys case-insensitively and keeps the last of
	// duplicate keys; the wire contract takes neither.
	strictErrs, err := sigsjson.UnmarshalStrict(body, v)
	if err != nil {
		return &FieldError{Field: "body", Reason: err.Error()}
	}
	if len(strictErrs) > 0 {
		return describeStrictError(strictErrs[0])
	}
	return nil
}

// describeStrictError names the field of an "unknown field" or "duplicate
// field" error of sigs.k8s.io/json.
func describeStrictError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "json: ")
	for _, kind := range []string{"unknown field", "duplicate field"} {
		if quoted, ok := strings.CutPrefix(msg, kind+" "); ok {
			name, uerr := strconv.Unquote(quoted)
			if uerr != nil || name == "" {
				return &FieldError{Field: "body", Reason: msg}
			}
			return &FieldError{Field: name, Reason: kind}
		}
	}
	return &FieldError{Field: "body", Reason: msg}
}

func describeJSONError(err error) error {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		return &FieldError{Field: "body", Reason: "must not be empty"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &FieldError{Field: "body", Reason: "malformed JSON: unexpected end of input"}
	case errors.As(err, &syntaxErr):
		return &FieldError{Field: "body", Reason: fmt.Sprintf("malformed JSON at offset %d: %v", syntaxErr.Offset, syntaxErr)}
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "body"
		}
		return &FieldError{Field: field, Reason: fmt.Sprintf("must be a JSON %s, got %s", typeErr.Type, typeErr.Value)}
	}
	if quoted, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, uerr := strconv.Unquote(quoted)
		if uerr != nil {
			name = quoted
		}
		if name == "" {
			// An empty key cannot name itself; say which key it was.
			return &FieldError{Field: "body", Reason: `unknown field ""`}
		}
		return &FieldError{Field: name, Reason: "unknown field"}
	}
	return &FieldError{Field: "body", Reason: err.Error()}
}
