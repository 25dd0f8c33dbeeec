package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/berthfleet/berth/leaseapi"
)

// Defaults of Config.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultRetryMax     = 4
	DefaultRetryWaitMin = 50 * time.Millisecond
	DefaultRetryWaitMax = 2 * time.Second
)

// AcquireResult answers Acquire and Renew: whether the caller holds the lease
// and, either way, who does and with which token.
type AcquireResult = leaseapi.AcquireResponse

// Config configures a Client.
type Config struct {
	// URL is the API's base URL, e.g. https://berth-leaseapi.berth-system:8443.
	URL string
	// Token is a static bearer token; TokenFile, re-read when it changes,
	// is preferred for anything long-running.
	Token     string
	TokenFile string
	// CAFile verifies the server's certificate instead of the system roots.
	CAFile string
	// ClientCertFile and ClientKeyFile present a client certificate.
	ClientCertFile, ClientKeyFile string
	// Timeout bounds a call whose context has no deadline.
	Timeout time.Duration
	// RetryMax is how many times a call is retried; negative means never.
	RetryMax                   int
	RetryWaitMin, RetryWaitMax time.Duration
	// MaxConnsPerHost bounds the connection pool (default 100).
	MaxConnsPerHost int
	Log             logr.Logger

	// WatchIdleTimeout is how long WatchLeases waits for the next line of
	// a stream before it treats it as broken (default
	// DefaultWatchIdleTimeout: three of the server's bookmark intervals).
	WatchIdleTimeout time.Duration
}

// Client calls the lease API.
type Client struct {
	base    string // URL without a trailing slash
	http    *retryablehttp.Client
	token   string
	file    *tokenFile
	timeout time.Duration
	// watchIdle is Config.WatchIdleTimeout.
	watchIdle time.Duration
	log       logr.Logger
}

// New returns a client for cfg.
func New(cfg Config) (*Client, error) {
	base, err := url.Parse(cfg.URL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("lease API URL %q: want http(s)://host[:port]", cfg.URL)
	}
	transport, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: transport}
	rc.Logger = nil
	rc.RetryMax = orDefault(cfg.RetryMax, DefaultRetryMax)
	if cfg.RetryMax < 0 {
		rc.RetryMax = 0
	}
	rc.RetryWaitMin = orDefault(cfg.RetryWaitMin, DefaultRetryWaitMin)
	rc.RetryWaitMax = orDefault(cfg.RetryWaitMax, DefaultRetryWaitMax)
	rc.Backoff = jitteredBackoff
	rc.CheckRetry = retryablehttp.DefaultRetryPolicy
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	log := cfg.Log
	rc.RequestLogHook = func(_ retryablehttp.Logger, r *http.Request, attempt int) {
		if attempt > 0 {
			log.V(1).Info("retrying lease API call", "method", r.Method, "path", r.URL.Path, "attempt", attempt)
		}
	}
	c := &Client{base: strings.TrimSuffix(base.String(), "/"), http: rc, token: cfg.Token, timeout: orDefault(cfg.Timeout, DefaultTimeout),
		watchIdle: orDefault(cfg.WatchIdleTimeout, DefaultWatchIdleTimeout), log: cfg.Log}
	if cfg.TokenFile != "" {
		c.file = &tokenFile{path: cfg.TokenFile}
		if _, err := c.file.get(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func newTransport(cfg Config) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 0
	t.MaxIdleConnsPerHost = orDefault(cfg.MaxConnsPerHost, 100)
	if cfg.CAFile == "" && cfg.ClientCertFile == "" {
		return t, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", cfg.CAFile)
		}
	}
	if cfg.ClientCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.ClientCertFile, cfg.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	t.TLSClientConfig = tc
	return t, nil
}

// jitteredBackoff is exponential backoff with full jitter, honouring a
// server's Retry-After on 429 and 503.
func jitteredBackoff(minWait, maxWait time.Duration, attempt int, resp *http.Response) time.Duration {
	if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			return min(time.Duration(s)*time.Second, maxWait)
		}
	}
	ceiling := min(minWait<<min(attempt, 30), maxWait)
	return minWait/2 + rand.N(ceiling-minWait/2+1)
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Acquire takes the lease namespace/name for holder for ttl, or renews it if
// holder already has it. Result.Acquired is false when another holder has it.
func (c *Client) Acquire(ctx context.Context, namespace, name, holder string, ttl time.Duration) (AcquireResult, error) {
	var out AcquireResult
	err := c.do(ctx, http.MethodPost, leasePath(namespace, name)+"/acquire",
		leaseapi.AcquireRequest{Holder: holder, TTLSeconds: ttlSeconds(ttl)}, &out)
	if err != nil {
		return AcquireResult{}, fmt.Errorf("acquire lease %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// Renew extends holder's term of the lease it holds with fencingToken.
// Result.Acquired is false when the lease was lost; Holder then names the
// current holder (empty if none). Revoked with Holder still holder and the
// same token means an administrator revoked the term: stop the work it
// guards, then Release it with that token.
func (c *Client) Renew(ctx context.Context, namespace, name, holder string, fencingToken int32, ttl time.Duration) (AcquireResult, error) {
	var out AcquireResult
	err := c.do(ctx, http.MethodPost, leasePath(namespace, name)+"/renew",
		leaseapi.RenewRequest{Holder: holder, FencingToken: fencingToken, TTLSeconds: ttlSeconds(ttl)}, &out)
	if err != nil {
		return AcquireResult{}, fmt.Errorf("renew lease %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// Renewal is one lease of a batched renewal.
type Renewal struct {
	Namespace, Name string
	FencingToken    int32
	TTL             time.Duration
}

// maxBatchAnswerBytes bounds the answer to one batched renewal: an item of
// the longest key and holder is under 800 bytes.
const maxBatchAnswerBytes = 16 << 20

// RenewBatch renews every lease in renewals for holder: one request per leaseapi.MaxBatchLeases. results[i] answers renewals[i] exactly as Renew would.
//
// Each request is bounded by ctx and, when ctx has no deadline, by
// Config.Timeout of its own, so a call of several requests may take
// several timeouts: callers that renew on a heartbeat bound the call with
// their renewal deadline. Requests are retried as Renew's are (a renewal
// repeated only extends the holder's own terms).
//
// On an error no results are returned, and the caller should count every
// lease of the call as not renewed this time, although some renewals may
// have landed. A server that predates batched renewals answers with an
// error matching ErrNotSupported: renew lease by lease with Renew then.
func (c *Client) RenewBatch(ctx context.Context, holder string, renewals []Renewal) ([]AcquireResult, error) {
	results := make([]AcquireResult, 0, len(renewals))
	for chunk := range slices.Chunk(renewals, leaseapi.MaxBatchLeases) {
		req := leaseapi.BatchRenewRequest{Holder: holder, Leases: make([]leaseapi.BatchRenewal, len(chunk))}
		for i, r := range chunk {
			req.Leases[i] = leaseapi.BatchRenewal{Namespace: r.Namespace, Name: r.Name, FencingToken: r.FencingToken, TTLSeconds: ttlSeconds(r.TTL)}
		}
		body, err := json.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("renew %d leases: encode request: %w", len(chunk), err)
		}
		var out leaseapi.BatchRenewResponse
		if err := c.send(ctx, http.MethodPost, "/v1alpha1/renewals", body, &out, maxBatchAnswerBytes); err != nil {
			return nil, fmt.Errorf("renew %d leases: %w", len(chunk), notSupported(err, len(body)))
		}
		if err := matchItems(req.Leases, out.Items); err != nil {
			return nil, fmt.Errorf("renew %d leases: %w", len(chunk), err)
		}
		for _, item := range out.Items {
			results = append(results, item.AcquireResponse)
		}
	}
	return results, nil
}

// notSupported marks the answers of a server without POST
// /v1alpha1/renewals: 404 for the route, or 413 for a body within
// leaseapi.MaxBatchBodyBytes, which such a server bounds at
// leaseapi.MaxBodyBytes before it routes.
func notSupported(err error, bodyBytes int) error {
	if errors.Is(err, ErrNotFound) || (bodyBytes <= leaseapi.MaxBatchBodyBytes && isStatus(err, http.StatusRequestEntityTooLarge)) {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return err
}

func isStatus(err error, code int) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.StatusCode == code
}

// matchItems checks that a batched renewal's answer has an item per lease,
// in the order of the request.
func matchItems(sent []leaseapi.BatchRenewal, items []leaseapi.BatchRenewResult) error {
	if len(items) != len(sent) {
		return fmt.Errorf("%w: %d items for %d leases", ErrUnexpected, len(items), len(sent))
	}
	for i, item := range items {
		if item.Namespace != sent[i].Namespace || item.Name != sent[i].Name {
			return fmt.Errorf("%w: item %d is %s/%s, want %s/%s", ErrUnexpected, i, item.Namespace, item.Name, sent[i].Namespace, sent[i].Name)
		}
	}
	return nil
}

// Release gives the lease up. Releasing a free lease succeeds; releasing a
// lease held by another holder or token is ErrConflict. An administrator's
// release of another subject's live term revokes it instead of freeing it:
// the term ends when its holder has stopped and released it, or at its
// expiry (GetLease then shows Revoked).
func (c *Client) Release(ctx context.Context, namespace, name, holder string, fencingToken int32) error {
	err := c.do(ctx, http.MethodPost, leasePath(namespace, name)+"/release",
		leaseapi.ReleaseRequest{Holder: holder, FencingToken: fencingToken}, nil)
	if err != nil {
		return fmt.Errorf("release lease %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Revoke asks the holder of the lease's live term (holder with fencingToken)
// to hand it over: the term is marked revoked, its holder stops and releases
// it, and it is never granted again before then or its end. A free lease is
// left alone; another term is ErrConflict.
func (c *Client) Revoke(ctx context.Context, namespace, name, holder string, fencingToken int32) error {
	err := c.do(ctx, http.MethodPost, leasePath(namespace, name)+"/revoke",
		leaseapi.ReleaseRequest{Holder: holder, FencingToken: fencingToken}, nil)
	if err != nil {
		return fmt.Errorf("revoke lease %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Move asks the holder of the lease's live term (holder with fencingToken)
// to hand it over to cluster to (empty: any cluster but the holder's): the
// term is revoked, its holder stops and releases it, and the lease is then
// reserved for the destination for one TTL. It returns the lease as the
// move left it (Move set; a free lease is answered as it is). A term of
// another holder or token, one already moving elsewhere, or a destination
// that is not registered or is cordoned is ErrConflict; a destination that
// is not a cluster id, or is the holder's own cluster, is ErrInvalid. It
// is retried as Release is: a repeated move changes nothing.
func (c *Client) Move(ctx context.Context, namespace, name, holder string, fencingToken int32, to string) (leaseapi.Lease, error) {
	var out leaseapi.Lease
	err := c.do(ctx, http.MethodPost, leasePath(namespace, name)+"/move",
		leaseapi.MoveRequest{Holder: holder, FencingToken: fencingToken, To: to}, &out)
	if err != nil {
		return leaseapi.Lease{}, fmt.Errorf("move lease %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// History returns the terms of a lease, newest first, at most limit (zero:
// the server's default): the live term first (no EndedAt), then the ended
// terms the server keeps. A lease never acquired is ErrNotFound.
func (c *Client) History(ctx context.Context, namespace, name string, limit int) ([]leaseapi.Term, error) {
	path := leasePath(namespace, name) + "/history"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	var out leaseapi.TermList
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, fmt.Errorf("history of lease %s/%s: %w", namespace, name, err)
	}
	return out.Items, nil
}

// GetLease returns one lease; ErrNotFound if it was never acquired.
func (c *Client) GetLease(ctx context.Context, namespace, name string) (leaseapi.Lease, error) {
	var out leaseapi.Lease
	if err := c.do(ctx, http.MethodGet, leasePath(namespace, name), nil, &out); err != nil {
		return leaseapi.Lease{}, fmt.Errorf("get lease %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// WatchLease waits until the lease's holder or fencing token differ from
// holder and fencingToken (the caller's last view), or wait passes, and
// returns the lease as it is then: a long poll that lets a waiting cluster
// take over a released lease at once. A lease never acquired is ErrNotFound.
func (c *Client) WatchLease(ctx context.Context, namespace, name, holder string, fencingToken int32, wait time.Duration) (leaseapi.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+c.timeout)
	defer cancel()
	q := url.Values{}
	q.Set("waitSeconds", strconv.Itoa(max(1, int(wait/time.Second))))
	q.Set("holder", holder)
	q.Set("fencingToken", strconv.Itoa(int(fencingToken)))
	var out leaseapi.Lease
	if err := c.do(ctx, http.MethodGet, leasePath(namespace, name)+"?"+q.Encode(), nil, &out); err != nil {
		return leaseapi.Lease{}, fmt.Errorf("watch lease %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// Confirm asks whether holder holds the lease namespace/name now with
// exactly fencingToken: Confirmed, with RemainingMillis the least time its
// term has left as of the answer (count it down on a monotonic clock from
// before the call was sent; a retried call's answer is measured from the
// attempt that got it, which is later still). A lease never acquired is
// ErrNotFound. It only reads, so it is retried as GetLease is.
func (c *Client) Confirm(ctx context.Context, namespace, name, holder string, fencingToken int32) (leaseapi.Confirmation, error) {
	q := url.Values{}
	q.Set("holder", holder)
	q.Set("fencingToken", strconv.Itoa(int(fencingToken)))
	var out leaseapi.Confirmation
	if err := c.do(ctx, http.MethodGet, leasePath(namespace, name)+"/confirmation?"+q.Encode(), nil, &out); err != nil {
		return leaseapi.Confirmation{}, fmt.Errorf("confirm lease %s/%s for %s with token %d: %w", namespace, name, holder, fencingToken, err)
	}
	return out, nil
}

// ListOptions selects a page of leases.
type ListOptions struct {
	Namespace string
	Limit     int
	Continue  string
}

// ListLeases returns one page of leases; pass its Continue to get the next.
func (c *Client) ListLeases(ctx context.Context, opts ListOptions) (leaseapi.LeaseList, error) {
	q := url.Values{}
	if opts.Namespace != "" {
		q.Set("namespace", opts.Namespace)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Continue != "" {
		q.Set("continue", opts.Continue)
	}
	path := "/v1alpha1/leases"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out leaseapi.LeaseList
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return leaseapi.LeaseList{}, fmt.Errorf("list leases: %w", err)
	}
	return out, nil
}

// RegisterCluster registers cluster id, or heartbeats an existing
// registration. ErrConflict means another live cluster holds the id.
func (c *Client) RegisterCluster(ctx context.Context, id string, reg leaseapi.ClusterRegistration) (leaseapi.ClusterRegistrationResponse, error) {
	var out leaseapi.ClusterRegistrationResponse
	if err := c.do(ctx, http.MethodPut, "/v1alpha1/clusters/"+url.PathEscape(id), reg, &out); err != nil {
		return out, fmt.Errorf("register cluster %s: %w", id, err)
	}
	return out, nil
}

// ListClusters returns every registered cluster.
func (c *Client) ListClusters(ctx context.Context) ([]leaseapi.Cluster, error) {
	var out leaseapi.ClusterList
	if err := c.do(ctx, http.MethodGet, "/v1alpha1/clusters", nil, &out); err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	return out.Items, nil
}

// Cordon marks a cluster so that it hands over its leases and takes no more.
func (c *Client) Cordon(ctx context.Context, id string) (leaseapi.ClusterRegistrationResponse, error) {
	return c.setCordon(ctx, id, "cordon")
}

// Uncordon lets a cordoned cluster take leases again.
func (c *Client) Uncordon(ctx context.Context, id string) (leaseapi.ClusterRegistrationResponse, error) {
	return c.setCordon(ctx, id, "uncordon")
}

func (c *Client) setCordon(ctx context.Context, id, verb string) (leaseapi.ClusterRegistrationResponse, error) {
	var out leaseapi.ClusterRegistrationResponse
	if err := c.do(ctx, http.MethodPost, "/v1alpha1/clusters/"+url.PathEscape(id)+"/"+verb, nil, &out); err != nil {
		return out, fmt.Errorf("%s cluster %s: %w", verb, id, err)
	}
	return out, nil
}

// Ready checks the server's readiness (its store answers).
func (c *Client) Ready(ctx context.Context) error {
	var out map[string]string
	if err := c.do(ctx, http.MethodGet, "/readyz", nil, &out); err != nil {
		return fmt.Errorf("lease API readiness: %w", err)
	}
	return nil
}

// maxAnswerBytes bounds an answer to any call but a batched renewal.
const maxAnswerBytes = 1 << 20

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
	}
	return c.send(ctx, method, path, body, out, maxAnswerBytes)
}

// send makes one call with a JSON body (none when body is nil) and decodes
// an answer of at most maxAnswer bytes into out.
func (c *Client) send(ctx context.Context, method, path string, body []byte, out any, maxAnswer int64) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if err := c.authorize(req.Header); err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		return apiError(resp, data)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

func (c *Client) authorize(h http.Header) error {
	token := c.token
	if c.file != nil {
		var err error
		if token, err = c.file.get(); err != nil {
			return err
		}
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return nil
}

func apiError(resp *http.Response, data []byte) error {
	e := &APIError{StatusCode: resp.StatusCode, RequestID: resp.Header.Get(leaseapi.RequestIDHeader)}
	var body leaseapi.Error
	if json.Unmarshal(data, &body) == nil && body.Error != "" {
		e.Message = body.Error
	} else {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

func leasePath(namespace, name string) string {
	return "/v1alpha1/namespaces/" + url.PathEscape(namespace) + "/leases/" + url.PathEscape(name)
}

func ttlSeconds(ttl time.Duration) int32 {
	return int32((ttl + time.Second - 1) / time.Second)
}
