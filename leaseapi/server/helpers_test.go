package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// epoch is where every fake clock starts.
var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// The subjects and bearer tokens of the default token file.
const (
	tokenA     = "token-of-cluster-a-5f1e"
	tokenB     = "token-of-cluster-b-93c2"
	tokenAdmin = "token-of-admin-0d7a"
)

var defaultTokens = map[string]string{
	"cluster-a": tokenA,
	"cluster-b": tokenB,
	"admin":     tokenAdmin,
}

// fixture is a real Server on a real SQLite store in a temporary directory,
// served over HTTP by httptest, with a fake clock and captured logs.
type fixture struct {
	t       *testing.T
	clock   *testingclock.FakeClock
	backend store.Store // the SQLite store itself
	store   *faultyStore
	srv     *Server
	http    *httptest.Server
	client  *http.Client
	logs    *logBuffer
	tokens  *TokenFile
}

type fixtureOptions struct {
	// auth replaces the default authenticator (tokens of defaultTokens,
	// "admin" an administrator).
	auth *Authenticator
	// tls serves over TLS; the test configures srv.http.TLS itself.
	tls func(*httptest.Server)
	// limits replace the default Limits.
	limits Limits
	// watch replaces the default WatchOptions, changeLogSize the
	// service's default.
	watch         WatchOptions
	changeLogSize int
	// listener wraps the server's listener.
	listener func(net.Listener) net.Listener
}

func newFixture(t *testing.T, opts fixtureOptions) *fixture {
	t.Helper()
	backend, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "leases.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := backend.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	f := &fixture{t: t, clock: testingclock.NewFakeClock(epoch), backend: backend, logs: &logBuffer{}}
	f.store = &faultyStore{Store: backend}
	if opts.auth == nil {
		f.tokens = writeTokenFile(t, filepath.Join(t.TempDir(), "tokens"), defaultTokens)
		opts.auth = NewAuthenticator(f.tokens, false, []string{"admin"})
	}
	metrics := NewMetrics()
	st := metrics.InstrumentStore(f.store)
	f.srv = New(Config{
		Service: lease.NewService(st, lease.Options{Clock: f.clock, ChangeLogSize: opts.changeLogSize}),
		Store:   st,
		Auth:    opts.auth,
		Metrics: metrics,
		Log:     funcr.NewJSON(f.logs.write, funcr.Options{Verbosity: 4}),
		Clock:   f.clock,
		Limits:  opts.limits,
		Watch:   opts.watch,
	})
	// The http.Server that berth-leaseapi runs, with its limits.
	f.http = httptest.NewUnstartedServer(nil)
	f.http.Config = f.srv.HTTPServer(nil)
	if opts.listener != nil {
		f.http.Listener = opts.listener(f.http.Listener)
	}
	if opts.tls != nil {
		f.http.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake failures the tests provoke
		opts.tls(f.http)
		f.http.StartTLS()
	} else {
		f.http.Start()
	}
	t.Cleanup(f.http.Close)
	// An API client must see redirects, not follow them.
	f.client = f.http.Client()
	f.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return f
}

// writeTokenFile writes a token file of subject -> token and loads it.
func writeTokenFile(t testing.TB, path string, tokens map[string]string) *TokenFile {
	t.Helper()
	rewriteTokenFile(t, path, tokens)
	tf, err := LoadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return tf
}

func rewriteTokenFile(t testing.TB, path string, tokens map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# subject:sha256-hex-of-token\n\n")
	for subject, token := range tokens {
		sum := sha256.Sum256([]byte(token))
		fmt.Fprintf(&b, "%s:%s\n", subject, hex.EncodeToString(sum[:]))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// request is one HTTP request to the fixture.
type request struct {
	method, path, token, body string
	header                    map[string]string
}

// response is an answer, read whole.
type response struct {
	code   int
	header http.Header
	body   []byte
}

// do sends req and checks what every answer must carry: an X-Request-Id,
// and for an error a JSON body {"error": "..."}.
func (f *fixture) do(req request) response {
	f.t.Helper()
	return doWith(f.t, f.client, f.http.URL, req)
}

func doWith(t *testing.T, client *http.Client, base string, req request) response {
	t.Helper()
	var body io.Reader
	if req.body != "" {
		body = strings.NewReader(req.body)
	}
	r, err := http.NewRequestWithContext(t.Context(), req.method, base+req.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if req.token != "" {
		r.Header.Set("Authorization", "Bearer "+req.token)
	}
	for k, v := range req.header {
		r.Header.Set(k, v)
	}
	res, err := client.Do(r)
	if err != nil {
		t.Fatalf("%s %s: %v", req.method, req.path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.method, req.path, err)
	}
	out := response{code: res.StatusCode, header: res.Header, body: data}
	for _, err := range checkAnswer(out) {
		t.Errorf("%s %s: %v", req.method, req.path, err)
	}
	return out
}

// checkAnswer returns how r breaks what every answer must carry: an
// X-Request-Id, and for an error a JSON body {"error": "..."}.
func checkAnswer(r response) []error {
	var errs []error
	if r.header.Get(leaseapi.RequestIDHeader) == "" {
		errs = append(errs, fmt.Errorf("answer %d has no %s", r.code, leaseapi.RequestIDHeader))
	}
	if r.code >= 400 {
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			errs = append(errs, fmt.Errorf("error %d has Content-Type %q", r.code, ct))
		}
		var e map[string]any
		if err := json.Unmarshal(r.body, &e); err != nil {
			errs = append(errs, fmt.Errorf("error %d body %q is not JSON: %w", r.code, r.body, err))
		} else if msg, ok := e["error"].(string); !ok || msg == "" {
			errs = append(errs, fmt.Errorf("error %d body %s has no error message", r.code, r.body))
		}
	}
	return errs
}

// errorMessage is the "error" of an error body.
func (r response) errorMessage(t *testing.T) string {
	t.Helper()
	var e leaseapi.Error
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	return e.Error
}

// decode decodes a success body into v.
func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
}

func leasePath(ns, name, verb string) string {
	p := "/v1alpha1/namespaces/" + ns + "/leases/" + name
	if verb != "" {
		p += "/" + verb
	}
	return p
}

// acquire acquires ns/name for holder with token and returns the answer.
func (f *fixture) acquire(token, ns, name, holder string, ttlSeconds int) leaseapi.AcquireResponse {
	f.t.Helper()
	res := f.do(request{method: http.MethodPost, path: leasePath(ns, name, "acquire"), token: token,
		body: fmt.Sprintf(`{"holder":%q,"ttlSeconds":%d}`, holder, ttlSeconds)})
	if res.code != http.StatusOK {
		f.t.Fatalf("acquire %s/%s as %s: %d %s", ns, name, holder, res.code, res.body)
	}
	var out leaseapi.AcquireResponse
	res.decode(f.t, &out)
	return out
}

// logBuffer collects JSON log lines; handlers log from server goroutines.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) write(obj string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, obj)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

// entries returns the decoded log lines whose msg is msg.
func (b *logBuffer) entries(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range b.lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// faultyStore is the real store with one injected failure: the next call of
// an operation named by failNext returns the given error. It exists only to
// inject failures; everything else reaches the real store.
type faultyStore struct {
	store.Store
	mu       sync.Mutex
	failures map[string]error
}

func (s *faultyStore) failNext(op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures == nil {
		s.failures = map[string]error{}
	}
	s.failures[op] = err
}

func (s *faultyStore) injected(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.failures[op]
	delete(s.failures, op)
	return err
}

func (s *faultyStore) GetLease(ctx context.Context, namespace, name string) (store.Lease, error) {
	if err := s.injected("GetLease"); err != nil {
		return store.Lease{}, err
	}
	return s.Store.GetLease(ctx, namespace, name)
}

func (s *faultyStore) PutLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	if err := s.injected("PutLease"); err != nil {
		return store.Lease{}, err
	}
	return s.Store.PutLease(ctx, l)
}

func (s *faultyStore) ListLeases(ctx context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	if err := s.injected("ListLeases"); err != nil {
		return nil, false, err
	}
	return s.Store.ListLeases(ctx, opts)
}

func (s *faultyStore) GetCluster(ctx context.Context, id string) (store.Cluster, error) {
	if err := s.injected("GetCluster"); err != nil {
		return store.Cluster{}, err
	}
	return s.Store.GetCluster(ctx, id)
}

func (s *faultyStore) PutCluster(ctx context.Context, c store.Cluster) (store.Cluster, error) {
	if err := s.injected("PutCluster"); err != nil {
		return store.Cluster{}, err
	}
	return s.Store.PutCluster(ctx, c)
}

func (s *faultyStore) ListClusters(ctx context.Context) ([]store.Cluster, error) {
	if err := s.injected("ListClusters"); err != nil {
		return nil, err
	}
	return s.Store.ListClusters(ctx)
}

func (s *faultyStore) ListTerms(ctx context.Context, namespace, name string, limit int) ([]store.Term, error) {
	if err := s.injected("ListTerms"); err != nil {
		return nil, err
	}
	return s.Store.(store.TermStore).ListTerms(ctx, namespace, name, limit)
}

func (s *faultyStore) Ping(ctx context.Context) error {
	if err := s.injected("Ping"); err != nil {
		return err
	}
	return s.Store.Ping(ctx)
}

// GetLeases and PutLeases reach the SQLite store's store.LeaseBatchStore,
// so that a batched renewal takes the batch path as in berth-leaseapi.
func (s *faultyStore) GetLeases(ctx context.Context, keys []store.LeaseKey) ([]store.Lease, error) {
	if err := s.injected("GetLeases"); err != nil {
		return nil, err
	}
	return s.Store.(store.LeaseBatchStore).GetLeases(ctx, keys)
}

func (s *faultyStore) PutLeases(ctx context.Context, leases []store.Lease) ([]store.Lease, []error, error) {
	if err := s.injected("PutLeases"); err != nil {
		return nil, nil, err
	}
	return s.Store.(store.LeaseBatchStore).PutLeases(ctx, leases)
}
