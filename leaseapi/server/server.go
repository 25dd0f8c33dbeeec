package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// DefaultSweepInterval is how often expired leases are freed.
const DefaultSweepInterval = time.Second

// Config is what a Server is built from.
type Config struct {
	Service *lease.Service
	// Store is probed by /readyz.
	Store   store.Store
	Auth    *Authenticator
	Metrics *Metrics
	Log     logr.Logger
	// Clock drives the sweep; defaults to the real clock.
	Clock         clock.WithTicker
	SweepInterval time.Duration
	// Limits bound slow and large requests; zero fields take the defaults.
	Limits Limits
	// Watch paces and bounds watch streams; zero fields take the defaults.
	Watch WatchOptions
}

// Server serves the lease API.
type Server struct {
	Config
	handler http.Handler
	watches *watches
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	cfg.Watch = cfg.Watch.withDefaults()
	s := &Server{Config: cfg, watches: newWatches()}
	s.handler = s.routes()
	return s
}

// Handler is the API's HTTP handler (without /metrics, which has its own listener).
func (s *Server) Handler() http.Handler { return s.handler }

// handlerFunc answers a request or returns the error to answer with.
type handlerFunc func(w http.ResponseWriter, r *http.Request, p Principal) error

type route struct {
	method, pattern string
	handle          handlerFunc
	// public routes answer without authentication (health probes).
	public bool
	// maxBody bounds the route's request bodies instead of
	// leaseapi.MaxBodyBytes.
	maxBody int
	// serviceAccounts, when set, makes the route accept a Pod's service
	// account token besides the usual credentials, verified for the scope
	// it returns.
	serviceAccounts serviceAccountScope
}

func (s *Server) routes() http.Handler {
	const leaseRoute = "/v1alpha1/namespaces/{namespace}/leases/{name}"
	table := []route{
		{method: http.MethodPost, pattern: leaseRoute + "/acquire", handle: s.acquire},
		{method: http.MethodPost, pattern: leaseRoute + "/renew", handle: s.renew},
		{method: http.MethodPost, pattern: leaseRoute + "/release", handle: s.release},
		{method: http.MethodPost, pattern: leaseRoute + "/revoke", handle: s.revoke},
		{method: http.MethodPost, pattern: leaseRoute + "/move", handle: s.move},
		{method: http.MethodGet, pattern: leaseRoute + "/history", handle: s.history},
		{method: http.MethodGet, pattern: leaseRoute, handle: s.getLease},
		{method: http.MethodGet, pattern: leaseRoute + "/confirmation", handle: s.confirm, serviceAccounts: confirmationScope},
		{method: http.MethodPost, pattern: "/v1alpha1/renewals", handle: s.renewBatch, maxBody: leaseapi.MaxBatchBodyBytes},
		{method: http.MethodGet, pattern: "/v1alpha1/leases", handle: s.listLeases},
		{method: http.MethodGet, pattern: "/v1alpha1/watch/leases", handle: s.watchLeases},
		{method: http.MethodPut, pattern: "/v1alpha1/clusters/{id}", handle: s.registerCluster},
		{method: http.MethodGet, pattern: "/v1alpha1/clusters", handle: s.listClusters},
		{method: http.MethodPost, pattern: "/v1alpha1/clusters/{id}/cordon", handle: s.cordon(true)},
		{method: http.MethodPost, pattern: "/v1alpha1/clusters/{id}/uncordon", handle: s.cordon(false)},
		{method: http.MethodGet, pattern: "/healthz", handle: s.healthz, public: true},
		{method: http.MethodGet, pattern: "/readyz", handle: s.readyz, public: true},
	}
	byPattern := map[string][]route{}
	var patterns []string
	for _, rt := range table {
		if _, ok := byPattern[rt.pattern]; !ok {
			patterns = append(patterns, rt.pattern)
		}
		byPattern[rt.pattern] = append(byPattern[rt.pattern], rt)
	}
	mux := http.NewServeMux()
	for _, pattern := range patterns {
		mux.Handle(pattern, s.serve(pattern, byPattern[pattern]))
	}
	unmatched := s.serve("unmatched", nil)
	mux.Handle("/", unmatched)
	return withRequestID(s.readBody(bodyLimits(mux, table), routable(mux, unmatched)))
}

// bodyLimits returns the body bound of a request: the maxBody of the route
// the mux picks for it, or leaseapi.MaxBodyBytes. It is decided before the
// body is read, so a larger bound applies to its own route and method only.
func bodyLimits(mux *http.ServeMux, table []route) func(*http.Request) int {
	larger := map[[2]string]int{}
	for _, rt := range table {
		if rt.maxBody > 0 {
			larger[[2]string{rt.method, rt.pattern}] = rt.maxBody
		}
	}
	return func(r *http.Request) int {
		if _, pattern := mux.Handler(r); pattern != "" {
			if n, ok := larger[[2]string{r.Method, pattern}]; ok {
				return n
			}
		}
		return leaseapi.MaxBodyBytes
	}
}

// routable hands unmatched the requests whose target is not a path, which
// the mux would answer itself in plain text: the asterisk form ("*", which
// Go's server passes on for every method but OPTIONS) and CONNECT's
// authority form.
func routable(mux, unmatched http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/") {
			unmatched.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

type requestIDKey struct{}

// withRequestID sets the request id before routing, so that the answers the
// mux writes itself (redirects of unclean paths such as "//" or "..") carry
// it too; serve reuses the same id.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestID(r)
		w.Header().Set(leaseapi.RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// serve answers the requests of one path pattern: it sets the request id,
// authenticates, picks the route by method, writes errors, and records the
// access-log line and the metrics.
func (s *Server) serve(pattern string, routes []route) http.Handler {
	var allow []string
	for _, rt := range routes {
		allow = append(allow, rt.method)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := requestID(r)
		w.Header().Set(leaseapi.RequestIDHeader, id)
		rec := &recorder{ResponseWriter: w, code: http.StatusOK}

		var p Principal
		err := func() error {
			i := slices.IndexFunc(routes, func(rt route) bool { return rt.method == r.Method })
			switch {
			case len(routes) == 0:
				return errNoRoute
			case i < 0:
				w.Header().Set("Allow", strings.Join(allow, ", "))
				return errMethod
			}
			rt := routes[i]
			if !rt.public {
				var err error
				if p, err = s.Auth.authenticate(r, rt.serviceAccounts); err != nil {
					return err
				}
			}
			return rt.handle(rec, r, p)
		}()
		if err != nil {
			s.writeError(rec, r, id, err)
		}
		s.record(rec, r, pattern, p, start)
	})
}

// record counts an answer in the metrics and writes its access-log line.
func (s *Server) record(rec *recorder, r *http.Request, pattern string, p Principal, start time.Time) {
	elapsed := time.Since(start)
	s.Metrics.requests.WithLabelValues(pattern, strconv.Itoa(rec.code)).Inc()
	s.Metrics.requestDuration.WithLabelValues(pattern).Observe(elapsed.Seconds())
	kv := []any{"requestId", requestID(r), "method", r.Method, "path", r.URL.Path, "route", pattern,
		"status", rec.code, "bytes", rec.bytes, "durationMs", float64(elapsed.Microseconds()) / 1000,
		"subject", p.Subject, "remote", r.RemoteAddr}
	if rec.leases > 0 {
		kv = append(kv, "leases", rec.leases)
	}
	if sa := p.ServiceAccount; sa != nil {
		kv = append(kv, "pod", sa.Namespace+"/"+sa.PodName, "podUID", sa.PodUID)
	}
	s.Log.Info("request", kv...)
}

var (
	errNoRoute = errors.New("no such route")
	errMethod  = errors.New("method not allowed")
)

// writeError answers err with its status and a JSON body. Internal errors are
// logged with the request id and answered without detail.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, id string, err error) {
	code, msg, outcome := classify(err)
	if outcome != "" && strings.HasPrefix(r.URL.Path, "/v1alpha1/") {
		s.Metrics.observeOutcome(outcome)
	}
	body := leaseapi.Error{Error: msg}
	if code == http.StatusInternalServerError {
		body.RequestID = id
		s.Log.Error(err, "internal error", "requestId", id, "method", r.Method, "path", r.URL.Path)
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
	}
	writeJSON(w, code, body)
}

// classify maps an error to its status, public message and outcome label.
func classify(err error) (code int, msg, outcome string) {
	var fieldErr *leaseapi.FieldError
	switch {
	case errors.Is(err, leaseapi.ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge, err.Error(), "invalid"
	case errors.Is(err, errBodyTimeout):
		return http.StatusRequestTimeout, err.Error(), "invalid"
	case errors.As(err, &fieldErr):
		return http.StatusBadRequest, strings.ReplaceAll(err.Error(), "\n", "; "), "invalid"
	case errors.Is(err, errUnauthenticated):
		return http.StatusUnauthorized, "unauthorized: " + err.Error(), "unauthorized"
	case errors.Is(err, errForbidden):
		return http.StatusForbidden, err.Error(), "unauthorized"
	case errors.Is(err, errNoRoute), errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, "not found", ""
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed, "method not allowed", ""
	case errors.Is(err, errTooManyWatches):
		return http.StatusTooManyRequests, err.Error(), ""
	case errors.Is(err, lease.ErrNotHolder), errors.Is(err, lease.ErrTokensExhausted),
		errors.Is(err, lease.ErrCordoned), errors.Is(err, lease.ErrFingerprintConflict),
		errors.Is(err, lease.ErrMoving), errors.Is(err, lease.ErrMoveTarget):
		return http.StatusConflict, err.Error(), "conflict"
	case errors.Is(err, context.Canceled):
		// The caller went away; 499 as nginx names it, never seen by them.
		return 499, "request canceled", "error"
	}
	return http.StatusInternalServerError, "internal error", "error"
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

var validRequestID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// requestID keeps a caller's well-formed X-Request-Id, or makes one.
func requestID(r *http.Request) string {
	if id, ok := r.Context().Value(requestIDKey{}).(string); ok {
		return id
	}
	if id := r.Header.Get(leaseapi.RequestIDHeader); validRequestID.MatchString(id) {
		return id
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recorder remembers the status and size of an answer, and how many leases
// a batched request named, for the access log.
type recorder struct {
	http.ResponseWriter
	code   int
	bytes  int
	leases int
}

func (r *recorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	n, err := r.ResponseWriter.Write(b)
	r.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection (a watch
// flushes each line under a write deadline).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
