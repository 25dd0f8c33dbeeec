package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// FuzzServer feeds raw bytes to the lease API as one HTTP/1.1 request: read
// by net/http's request parser, as the server reads it, then served by the
// whole handler chain (body bound, request id, routing, authentication with
// a token file, handlers) on a real SQLite store. Every answer must carry an
// X-Request-Id, every error must be a JSON {"error": ...}, a success's JSON
// must parse, nothing may panic or hang, and there is no 5xx unless the
// store failed. The store outlives each input, so batched renewals meet
// the leases that single acquires, renews, releases and revocations left;
// a batch's answer must have an item per lease, in order, and an item that
// says the lease is renewed must name the batch's holder and token.
func FuzzServer(f *testing.F) {
	for _, seed := range serverSeeds() {
		f.Add([]byte(seed))
	}
	h := newFuzzHarness(f)
	f.Fuzz(func(t *testing.T, raw []byte) { h.check(t, raw) })
}

// The fuzz harness's time bounds.
const (
	// fuzzPollCut ends every request's context, so that a long poll
	// answers then instead of after its waitSeconds, and a watch stream
	// ends.
	fuzzPollCut = 20 * time.Millisecond
	// fuzzHang is how long an answer may take before the input is a hang.
	fuzzHang = 10 * time.Second
)

type fuzzHarness struct {
	handler http.Handler
	store   *errorRecorder
	// body is the body of the input's batched renewal.
	body []byte
}

func newFuzzHarness(tb testing.TB) *fuzzHarness {
	// tmpfs where there is one: the store syncs every commit, and its
	// durability is not what this target is about.
	dir := tb.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "berth-fuzz-"); err == nil {
		dir = shm
		tb.Cleanup(func() { _ = os.RemoveAll(shm) })
	}
	backend, err := sqlite.Open(context.Background(), filepath.Join(dir, "leases.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = backend.Close() })
	st := &errorRecorder{Store: backend}
	tokens := writeTokenFile(tb, filepath.Join(tb.TempDir(), "tokens"), defaultTokens)
	srv := New(Config{
		Service: lease.NewService(st, lease.Options{}),
		Store:   st,
		Auth:    NewAuthenticator(tokens, false, []string{"admin"}),
		Log:     logr.Discard(),
	})
	return &fuzzHarness{handler: srv.Handler(), store: st}
}

func (h *fuzzHarness) check(t *testing.T, raw []byte) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return // refused by net/http before any handler sees it
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cut := time.AfterFunc(fuzzPollCut, cancel)
	defer cut.Stop()
	req = req.WithContext(ctx)
	req.RemoteAddr = "192.0.2.7:40000"
	h.body = nil
	if req.Method == http.MethodPost && req.URL.Path == renewalsPath {
		// Kept for checkBatchAnswer; the handler reads it from memory.
		if h.body, err = io.ReadAll(req.Body); err != nil {
			return // a framing error the server would answer 400
		}
		req.Body = io.NopCloser(bytes.NewReader(h.body))
	}

	h.store.reset()
	rec := httptest.NewRecorder()
	done := make(chan string, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Sprintf("%v\n%s", p, debug.Stack())
				return
			}
			done <- ""
		}()
		h.handler.ServeHTTP(rec, req)
	}()
	select {
	case p := <-done:
		if p != "" {
			t.Fatalf("panic serving %q: %s", raw, p)
		}
	case <-time.After(fuzzHang):
		t.Fatalf("no answer within %s to %q", fuzzHang, raw)
	}

	res := response{code: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	for _, err := range checkAnswer(res) {
		t.Errorf("%q: %v", raw, err)
	}
	storeErrs := h.store.errors()
	for _, err := range storeErrs {
		// The store is local and healthy: it fails only when the request's
		// context ends.
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%q: the store failed: %v", raw, err)
		}
	}
	if res.code >= 500 && len(storeErrs) == 0 {
		t.Errorf("%q: answer %d %s without a store failure", raw, res.code, res.body)
	}
	if res.code < 300 && len(res.body) > 0 && !validBody(res) {
		t.Errorf("%q: answer %d body %q is not JSON", raw, res.code, res.body)
	}
	if req.Method == http.MethodPost && req.URL.Path == renewalsPath && res.code == http.StatusOK {
		for _, err := range checkBatchAnswer(h.body, res.body) {
			t.Errorf("%q: %v", raw, err)
		}
	}
}

// checkBatchAnswer returns how the answer to a batched renewal breaks its
// contract: an item per lease, in order, and an item that says the lease is
// renewed names the batch's holder and the lease's token.
func checkBatchAnswer(reqBody, resBody []byte) []error {
	var (
		req  leaseapi.BatchRenewRequest
		resp leaseapi.BatchRenewResponse
	)
	if err := leaseapi.DecodeBytes(reqBody, &req); err != nil {
		return []error{fmt.Errorf("a batch answered 200 whose body does not decode: %w", err)}
	}
	if err := json.Unmarshal(resBody, &resp); err != nil {
		return []error{fmt.Errorf("batch answer: %w", err)}
	}
	if len(resp.Items) != len(req.Leases) {
		return []error{fmt.Errorf("batch of %d leases answered %d items", len(req.Leases), len(resp.Items))}
	}
	var errs []error
	for i, item := range resp.Items {
		l := req.Leases[i]
		if item.Namespace != l.Namespace || item.Name != l.Name {
			errs = append(errs, fmt.Errorf("item %d is %s/%s, want %s/%s", i, item.Namespace, item.Name, l.Namespace, l.Name))
		}
		if item.Acquired && (item.Holder != req.Holder || item.FencingToken != l.FencingToken || item.Revoked) {
			errs = append(errs, fmt.Errorf("item %d renewed, but shows %+v for holder %q token %d", i, item.AcquireResponse, req.Holder, l.FencingToken))
		}
	}
	return errs
}

// validBody reports whether a success's body is JSON: one value, or for a
// watch stream one value a line.
func validBody(res response) bool {
	if res.header.Get("Content-Type") != "application/x-ndjson" {
		return json.Valid(res.body)
	}
	lines := bytes.Split(bytes.TrimSuffix(res.body, []byte("\n")), []byte("\n"))
	for _, line := range lines {
		if !json.Valid(line) {
			return false
		}
	}
	return true
}

// errorRecorder is the real store; it remembers the errors it returned
// (other than the ordinary ErrNotFound and ErrConflict), so that the fuzz
// target can tell a store failure from the server's own.
type errorRecorder struct {
	store.Store
	mu   sync.Mutex
	errs []error
}

func (s *errorRecorder) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = nil
}

func (s *errorRecorder) errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs
}

func (s *errorRecorder) note(err error) {
	if err == nil || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, err)
}

func (s *errorRecorder) GetLease(ctx context.Context, namespace, name string) (store.Lease, error) {
	l, err := s.Store.GetLease(ctx, namespace, name)
	s.note(err)
	return l, err
}

func (s *errorRecorder) PutLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	l, err := s.Store.PutLease(ctx, l)
	s.note(err)
	return l, err
}

func (s *errorRecorder) GetLeases(ctx context.Context, keys []store.LeaseKey) ([]store.Lease, error) {
	leases, err := s.Store.(store.LeaseBatchStore).GetLeases(ctx, keys)
	s.note(err)
	return leases, err
}

func (s *errorRecorder) PutLeases(ctx context.Context, leases []store.Lease) ([]store.Lease, []error, error) {
	written, errs, err := s.Store.(store.LeaseBatchStore).PutLeases(ctx, leases)
	s.note(err)
	for _, err := range errs {
		s.note(err)
	}
	return written, errs, err
}

func (s *errorRecorder) ListLeases(ctx context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	leases, more, err := s.Store.ListLeases(ctx, opts)
	s.note(err)
	return leases, more, err
}

func (s *errorRecorder) GetCluster(ctx context.Context, id string) (store.Cluster, error) {
	c, err := s.Store.GetCluster(ctx, id)
	s.note(err)
	return c, err
}

func (s *errorRecorder) PutCluster(ctx context.Context, c store.Cluster) (store.Cluster, error) {
	c, err := s.Store.PutCluster(ctx, c)
	s.note(err)
	return c, err
}

func (s *errorRecorder) ListClusters(ctx context.Context) ([]store.Cluster, error) {
	cs, err := s.Store.ListClusters(ctx)
	s.note(err)
	return cs, err
}

func (s *errorRecorder) Ping(ctx context.Context) error {
	err := s.Store.Ping(ctx)
	s.note(err)
	return err
}

// serverSeeds are valid requests for every endpoint, and a few of each kind
// of invalid one, as raw HTTP/1.1.
func serverSeeds() []string {
	leaseURL := leasePath("team", "exporter", "")
	list := "/v1alpha1/leases"
	seeds := []string{
		rawRequest("POST", leaseURL+"/acquire", tokenA, `{"holder":"cluster-a","ttlSeconds":30}`),
		rawRequest("POST", leaseURL+"/renew", tokenA, `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":30}`),
		rawRequest("POST", leaseURL+"/release", tokenA, `{"holder":"cluster-a","fencingToken":1}`),
		rawRequest("POST", leaseURL+"/release", tokenAdmin, `{"holder":"cluster-a","fencingToken":1}`),
		rawRequest("POST", leaseURL+"/revoke", tokenAdmin, `{"holder":"cluster-a","fencingToken":1}`),
		rawRequest("POST", leaseURL+"/revoke", tokenB, `{"holder":"cluster-a","fencingToken":1}`),
		rawRequest("POST", leaseURL+"/acquire", tokenB, `{"holder":"cluster-b/shard-1","ttlSeconds":5}`),
		rawRequest("GET", leaseURL, tokenB, ""),
		// Batched renewals of leases the other seeds acquire, revoke and
		// release: renewed, lost, revoked, never seen.
		rawRequest("POST", renewalsPath, tokenA, `{"holder":"cluster-a","leases":[{"namespace":"team","name":"exporter","fencingToken":1,"ttlSeconds":30},{"namespace":"team","name":"other","fencingToken":1,"ttlSeconds":5}]}`),
		rawRequest("POST", renewalsPath, tokenB, `{"holder":"cluster-b/shard-1","leases":[{"namespace":"team","name":"exporter","fencingToken":2,"ttlSeconds":5},{"namespace":"team","name":"exporter","fencingToken":2,"ttlSeconds":5}]}`),
		rawRequest("POST", renewalsPath, tokenA, `{"holder":"cluster-a","leases":[{"namespace":"team","name":"exporter","fencingToken":0,"ttlSeconds":30}],"x":1}`),
		rawRequest("POST", renewalsPath, tokenB, `{"holder":"cluster-a","leases":[]}`),
		rawRequest("POST", renewalsPath, tokenA, `{"holder":"cluster-a","leases":[{"namespace":"team","name":"exporter","fencingToken":1,"ttlSeconds":30}]}`+strings.Repeat(" ", leaseapi.MaxBodyBytes)),
		rawRequest("GET", leaseURL+"?waitSeconds=1&holder=cluster-a&fencingToken=1", tokenB, ""),
		rawRequest("GET", list+"?namespace=team&limit=2", tokenA, ""),
		rawRequest("GET", list+"?limit=1&continue=dGVhbS9leHBvcnRlcg", tokenA, ""),
		rawRequest("GET", "/v1alpha1/watch/leases", tokenB, ""),
		rawRequest("GET", "/v1alpha1/watch/leases?namespace=team&namespace=other&revision=0011aabb-1", tokenA, ""),
		rawRequest("GET", "/v1alpha1/watch/leases?namespace=Team", tokenA, ""),
		rawRequest("PUT", "/v1alpha1/clusters/cluster-a", tokenA, `{"fingerprint":"5d7c","agentVersion":"v0.1.0","labels":{"region":"eu"}}`),
		rawRequest("GET", "/v1alpha1/clusters", tokenB, ""),
		rawRequest("POST", "/v1alpha1/clusters/cluster-a/cordon", tokenAdmin, ""),
		rawRequest("POST", "/v1alpha1/clusters/cluster-a/uncordon", tokenAdmin, ""),
		rawRequest("GET", "/healthz", "", ""),
		rawRequest("GET", "/readyz", "", ""),
		// Refused ones: no credentials, wrong holder, bad JSON, too large,
		// unknown route, wrong method, an unclean path.
		rawRequest("POST", leaseURL+"/acquire", "", `{"holder":"cluster-a","ttlSeconds":30}`),
		rawRequest("POST", leaseURL+"/acquire", tokenB, `{"holder":"cluster-a","ttlSeconds":30}`),
		rawRequest("POST", leaseURL+"/renew", tokenA, `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":30,"x":1}`),
		rawRequest("POST", leaseURL+"/acquire", tokenA, `{"holder":"cluster-a",`),
		rawRequest("POST", leaseURL+"/acquire", tokenA, strings.Repeat(" ", leaseapi.MaxBodyBytes+1)),
		rawRequest("DELETE", leaseURL, tokenA, ""),
		rawRequest("GET", "/v1alpha1/namespaces/Team/leases/x..y", tokenA, ""),
		rawRequest("GET", "//v1alpha1/../healthz", "", ""),
		// Framing: chunked, Expect: 100-continue, HTTP/1.0, absolute form,
		// a caller's request id.
		"POST " + leaseURL + "/acquire HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer " + tokenA +
			"\r\nTransfer-Encoding: chunked\r\n\r\n15\r\n{\"holder\":\"cluster-a\"\r\n10\r\n,\"ttlSeconds\":9}\r\n0\r\n\r\n",
		"POST " + leaseURL + "/renew HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer " + tokenA +
			"\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
		"GET /healthz HTTP/1.0\r\n\r\n",
		// Targets that are not paths, which the mux would answer in plain text.
		"GET * HTTP/1.1\r\nHost: berth\r\n\r\n",
		"CONNECT berth:8443 HTTP/1.1\r\nHost: berth:8443\r\n\r\n",
		"GET http://berth:8443" + leaseURL + " HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer " + tokenA + "\r\nX-Request-Id: caller-7\r\n\r\n",
	}
	return seeds
}

// rawRequest is an HTTP/1.1 request as it goes on the wire.
func rawRequest(method, path, token, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: berth\r\n", method, path)
	if token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", token)
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.String()
}
