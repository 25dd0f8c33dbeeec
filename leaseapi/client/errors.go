package client

import (
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors an *APIError matches with errors.Is.
var (
	ErrInvalid      = errors.New("invalid request")            // 400, 413
	ErrUnauthorized = errors.New("unauthorized")               // 401
	ErrForbidden    = errors.New("forbidden")                  // 403
	ErrNotFound     = errors.New("not found")                  // 404
	ErrConflict     = errors.New("conflict")                   // 409
	ErrUnavailable  = errors.New("lease API unavailable")      // 5xx after retries
	ErrUnexpected   = errors.New("unexpected answer from API") // anything else
)

// ErrNotSupported: the lease API does not offer the endpoint (a server of
// an earlier release: RenewBatch without batched renewals, WatchLeases
// without the change stream). Do the call's work another way, such as
// lease by lease.
var ErrNotSupported = errors.New("not supported by this lease API")

// APIError is an error answer of the lease API.
type APIError struct {
	StatusCode int
	// Message is the server's "error" field.
	Message string
	// RequestID finds the request in the server's log.
	RequestID string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("lease API answered %d: %s", e.StatusCode, e.Message)
	if e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	return msg
}

// Is matches the sentinel error of the status code.
func (e *APIError) Is(target error) bool {
	return target == sentinel(e.StatusCode)
}

func sentinel(code int) error {
	switch {
	case code == http.StatusBadRequest, code == http.StatusRequestEntityTooLarge:
		return ErrInvalid
	case code == http.StatusUnauthorized:
		return ErrUnauthorized
	case code == http.StatusForbidden:
		return ErrForbidden
	case code == http.StatusNotFound:
		return ErrNotFound
	case code == http.StatusConflict:
		return ErrConflict
	case code >= 500:
		return ErrUnavailable
	}
	return ErrUnexpected
}
