package server

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/berthfleet/berth/leaseapi"
)

// Limits bound what one connection may cost the server, above all before
// its request is authenticated: a caller that opens connections and then
// sends its headers or body slowly, or never, must not hold them (and the
// process's file descriptors) for longer than these bounds.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request line and its headers.
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout bounds reading a request body, counted from the end of
	// its headers. It covers only the body: a long poll, which has none,
	// waits as long as it asked to.
	BodyReadTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that sends no next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request line and its headers; more is 431.
	MaxHeaderBytes int
}

// The default Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyReadTimeout   = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 32 << 10
)

// withDefaults fills the zero fields of l.
func (l Limits) withDefaults() Limits {
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.BodyReadTimeout <= 0 {
		l.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l
}

// HTTPServer returns the http.Server that serves the API under s.Limits,
// over TLS when tlsConfig is set.
//
// It sets no ReadTimeout: bodies are bounded by readBody, which counts from
// the end of the headers, answers in the API's error model, and leaves no
// deadline on the connection while a handler (a long poll) runs.
func (s *Server) HTTPServer(tlsConfig *tls.Config) *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: s.Limits.ReadHeaderTimeout,
		IdleTimeout:       s.Limits.IdleTimeout,
		MaxHeaderBytes:    s.Limits.MaxHeaderBytes,
	}
}

// errBodyTimeout answers a body that did not arrive within BodyReadTimeout.
var errBodyTimeout = errors.New("request body not received in time")

// readBody reads every request body whole, before routing and
// authentication, under a read deadline of Limits.BodyReadTimeout, and hands
// it on from memory; a body over limit(r) bytes (leaseapi.MaxBodyBytes but
// for the routes that declare a larger bound) is 413.
//
// It runs first so that no answer is written with a body still unread: Go's
// server would then drain up to 256 KiB of it before answering, with no
// deadline at all (a 401 to a caller that declared a body and sent none
// would hold the connection forever). When the body cannot be read whole,
// the answer closes the connection, so nothing drains what is left.
//
// The deadline is cleared once the body is read, before the handler runs,
// so that it can never end a long poll's connection or context. (Go's
// HTTP/1 server also clears it when its background read starts at the
// body's end; this does not depend on that.)
func (s *Server) readBody(limit func(*http.Request) int, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		rc := http.NewResponseController(w)
		// A writer that cannot take deadlines (a test's recorder) reads
		// bounded in size only.
		deadline := rc.SetReadDeadline(start.Add(s.Limits.BodyReadTimeout)) == nil
		bound := limit(r)
		body, err := io.ReadAll(io.LimitReader(r.Body, int64(bound)+1))
		switch {
		case err != nil:
			err = bodyReadError(err, s.Limits.BodyReadTimeout)
		case len(body) > bound:
			err = leaseapi.BodyTooLarge(bound)
		}
		if err != nil {
			w.Header().Set("Connection", "close")
			rec := &recorder{ResponseWriter: w, code: http.StatusOK}
			s.writeError(rec, r, requestID(r), err)
			s.record(rec, r, "unrouted", Principal{}, start)
			return
		}
		if deadline {
			_ = rc.SetReadDeadline(time.Time{})
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// bodyReadError is what a failed body read answers: 408 past the deadline,
// else 400 (a connection cut mid-body, malformed chunked encoding).
func bodyReadError(err error, timeout time.Duration) error {
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return fmt.Errorf("%w: the body did not arrive within %s", errBodyTimeout, timeout)
	}
	return &leaseapi.FieldError{Field: "body", Reason: "could not be read: " + err.Error()}
}
