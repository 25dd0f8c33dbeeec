package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi"
)

// TestSlowBodiesAreCut opens connections that send a request's headers and
// then too little of its body, or none, and checks that the server answers
// and closes each within the body bound, before authentication, while a
// legitimate holder renews meanwhile.
func TestSlowBodiesAreCut(t *testing.T) {
	const (
		bound = 2 * time.Second
		conns = 8 // per case
	)
	f := newFixture(t, fixtureOptions{limits: Limits{BodyReadTimeout: bound}})
	renew := leasePath("team", "exporter", "renew")
	cases := map[string]struct {
		// raw is what the connection sends before it stalls.
		raw        string
		wantStatus int
	}{
		"declared body never sent, authenticated": {
			raw:        post(renew, "Authorization: Bearer "+tokenA, "Content-Length: 64") + "\r\n",
			wantStatus: http.StatusRequestTimeout,
		},
		"declared body never sent, no credentials": {
			raw:        post(renew, "Content-Length: 64") + "\r\n",
			wantStatus: http.StatusRequestTimeout,
		},
		"declared body never sent, bad credentials": {
			raw:        post(renew, "Authorization: Bearer nope", "Content-Length: 64") + "\r\n",
			wantStatus: http.StatusRequestTimeout,
		},
		"unclean path the mux would redirect": {
			raw:        post("/"+renew, "Content-Length: 64") + "\r\n",
			wantStatus: http.StatusRequestTimeout,
		},
		"unknown route": {
			raw:        post("/nowhere", "Content-Length: 64") + "\r\n",
			wantStatus: http.StatusRequestTimeout,
		},
		"half a body": {
			raw:        post(renew, "Content-Length: 100") + "\r\n" + `{"holder":"cluster-a"`,
			wantStatus: http.StatusRequestTimeout,
		},
		"chunked body that stops": {
			raw:        post(renew, "Transfer-Encoding: chunked") + "\r\n" + "5\r\n{\"hol\r\n",
			wantStatus: http.StatusRequestTimeout,
		},
		"declared body over 4 KiB, half sent": {
			raw:        post(renew, "Content-Length: 10000") + "\r\n" + strings.Repeat(" ", 5000),
			wantStatus: http.StatusRequestEntityTooLarge,
		},
	}

	type outcome struct {
		name    string
		res     *http.Response
		body    []byte
		closed  bool
		elapsed time.Duration
		err     error
	}
	results := make(chan outcome, len(cases)*conns)
	var ready, done sync.WaitGroup
	for name, tc := range cases {
		for range conns {
			ready.Add(1)
			done.Go(func() {
				c, err := net.Dial("tcp", f.http.Listener.Addr().String())
				if err != nil {
					ready.Done()
					results <- outcome{name: name, err: err}
					return
				}
				defer func() { _ = c.Close() }()
				start := time.Now()
				_, err = io.WriteString(c, tc.raw)
				ready.Done()
				if err != nil {
					results <- outcome{name: name, err: err}
					return
				}
				// Far past the bound: today's server never answers at all.
				_ = c.SetReadDeadline(start.Add(bound + 10*time.Second))
				br := bufio.NewReader(c)
				res, err := http.ReadResponse(br, nil)
				if err != nil {
					results <- outcome{name: name, err: fmt.Errorf("no answer: %w", err)}
					return
				}
				body, _ := io.ReadAll(res.Body)
				_ = res.Body.Close()
				_, err = br.ReadByte()
				results <- outcome{name: name, res: res, body: body, closed: errors.Is(err, io.EOF), elapsed: time.Since(start), err: nil}
			})
		}
	}
	ready.Wait()

	// The stalled connections are open; a holder still acquires and renews.
	a := f.acquire(tokenA, "team", "exporter", "cluster-a", 30)
	res := f.do(request{method: http.MethodPost, path: renew, token: tokenA,
		body: fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d,"ttlSeconds":30}`, a.FencingToken)})
	var renewed leaseapi.AcquireResponse
	res.decode(t, &renewed)
	if res.code != http.StatusOK || !renewed.Acquired {
		t.Errorf("renew beside stalled connections: %d %s, want 200 acquired", res.code, res.body)
	}

	done.Wait()
	close(results)
	var slowest time.Duration
	for o := range results {
		if o.err != nil {
			t.Errorf("%s: %v", o.name, o.err)
			continue
		}
		slowest = max(slowest, o.elapsed)
		if o.res.StatusCode != cases[o.name].wantStatus {
			t.Errorf("%s: status %d %s, want %d", o.name, o.res.StatusCode, o.body, cases[o.name].wantStatus)
		}
		if o.res.Header.Get(leaseapi.RequestIDHeader) == "" {
			t.Errorf("%s: answer has no %s", o.name, leaseapi.RequestIDHeader)
		}
		var e leaseapi.Error
		if err := json.Unmarshal(o.body, &e); err != nil || e.Error == "" {
			t.Errorf("%s: error body %q is not {\"error\":...}", o.name, o.body)
		}
		if !o.closed {
			t.Errorf("%s: the server left the connection open after its answer", o.name)
		}
	}
	t.Logf("%d stalled connections answered and closed, the slowest after %s (bound %s)", len(cases)*conns, slowest, bound)
}

// post is a request line and headers of a POST to path, without the blank
// line that ends them.
func post(path string, headers ...string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: berth\r\n" + strings.Join(headers, "\r\n") + "\r\n"
}

// TestLongPollOutlastsBodyBound checks that the body bound does not cut a
// long poll that waits longer: with or without a (small) body, the poll
// answers the release that ends its wait, on a live connection.
func TestLongPollOutlastsBodyBound(t *testing.T) {
	const bound = 300 * time.Millisecond
	f := newFixture(t, fixtureOptions{limits: Limits{BodyReadTimeout: bound}})
	cases := map[string]struct{ body string }{
		"no body":    {},
		"small body": {body: `{}`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			lease := strings.ReplaceAll(name, " ", "-")
			a := f.acquire(tokenA, "team", lease, "cluster-a", 60)

			released := make(chan error, 1)
			go func() {
				time.Sleep(4 * bound)
				body := fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, a.FencingToken)
				req, _ := http.NewRequest(http.MethodPost, f.http.URL+leasePath("team", lease, "release"), strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+tokenA)
				res, err := f.client.Do(req)
				if err == nil {
					_ = res.Body.Close()
					if res.StatusCode != http.StatusNoContent {
						err = fmt.Errorf("release: status %d", res.StatusCode)
					}
				}
				released <- err
			}()

			start := time.Now()
			res := f.do(request{method: http.MethodGet, token: tokenB, body: tc.body,
				path: fmt.Sprintf("%s?waitSeconds=10&holder=cluster-a&fencingToken=%d", leasePath("team", lease, ""), a.FencingToken)})
			elapsed := time.Since(start)
			if err := <-released; err != nil {
				t.Fatal(err)
			}
			var got leaseapi.Lease
			res.decode(t, &got)
			if res.code != http.StatusOK || got.Holder != "" || got.FencingToken != a.FencingToken {
				t.Errorf("long poll: %d holder %q token %d, want 200 the release (holder empty, token %d)", res.code, got.Holder, got.FencingToken, a.FencingToken)
			}
			// One poll, not a transparent retry after a cut connection.
			var polls int
			for _, e := range f.logs.entries(t, "request") {
				if e["method"] == http.MethodGet && e["path"] == leasePath("team", lease, "") {
					polls++
				}
			}
			if polls != 1 {
				t.Errorf("the server saw %d long polls, want 1", polls)
			}
			t.Logf("long poll answered the release after %s (body bound %s)", elapsed, bound)
		})
	}
}

// TestOversizedHeadersAreRefused checks MaxHeaderBytes on the http.Server
// that HTTPServer builds: headers past it are refused before any handler.
func TestOversizedHeadersAreRefused(t *testing.T) {
	f := newFixture(t, fixtureOptions{limits: Limits{MaxHeaderBytes: 8 << 10}})
	cases := map[string]struct {
		padding    int
		wantStatus int
	}{
		"under the bound": {padding: 4 << 10, wantStatus: http.StatusOK},
		"over the bound":  {padding: 64 << 10, wantStatus: http.StatusRequestHeaderFieldsTooLarge},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, f.http.URL+"/healthz", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Padding", strings.Repeat("p", tc.padding))
			res, err := f.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			if res.StatusCode != tc.wantStatus {
				t.Errorf("status %d, want %d", res.StatusCode, tc.wantStatus)
			}
		})
	}
}
