package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/test/poll"
)

// watchPath is the watch route with the namespaces and revision given.
func watchPath(revision string, namespaces ...string) string {
	q := url.Values{}
	for _, ns := range namespaces {
		q.Add("namespace", ns)
	}
	if revision != "" {
		q.Set("revision", revision)
	}
	if len(q) == 0 {
		return "/v1alpha1/watch/leases"
	}
	return "/v1alpha1/watch/leases?" + q.Encode()
}

// watchStream is an open watch: its lines as they arrive, decoded.
type watchStream struct {
	t      *testing.T
	header http.Header
	lines  chan leaseapi.WatchEvent
	ended  chan error // the read error that ended the stream
	cancel context.CancelFunc
}

// watch opens a watch on f as the subject of token and reads its lines in
// the background until the test ends or close is called.
func (f *fixture) watch(token, path string) *watchStream {
	f.t.Helper()
	ctx, cancel := context.WithCancel(f.t.Context())
	f.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.http.URL+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(res.Body)
		f.t.Fatalf("watch %s: %d %s", path, res.StatusCode, body)
	}
	w := &watchStream{t: f.t, header: res.Header, lines: make(chan leaseapi.WatchEvent, 1<<16), ended: make(chan error, 1), cancel: cancel}
	go func() {
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			var e leaseapi.WatchEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				w.ended <- fmt.Errorf("line %q: %w", sc.Bytes(), err)
				return
			}
			w.lines <- e
		}
		w.ended <- sc.Err()
	}()
	return w
}

// next returns the next line, failing the test after 10 s without one.
func (w *watchStream) next() leaseapi.WatchEvent {
	w.t.Helper()
	select {
	case e := <-w.lines:
		return e
	case err := <-w.ended:
		w.t.Fatalf("the stream ended (%v) before the next line", err)
	case <-time.After(10 * time.Second):
		w.t.Fatal("no line within 10 s")
	}
	return leaseapi.WatchEvent{}
}

// nextChange returns the next line, which must be a CHANGED.
func (w *watchStream) nextChange() leaseapi.Lease {
	w.t.Helper()
	e := w.next()
	if e.Type != leaseapi.WatchChanged || e.Lease == nil {
		w.t.Fatalf("line %+v, want a CHANGED with a lease", e)
	}
	return *e.Lease
}

// getLease is GET of one lease, as a waiting agent reads it.
func (f *fixture) getLease(ns, name string) leaseapi.Lease {
	f.t.Helper()
	res := f.do(request{method: http.MethodGet, path: leasePath(ns, name, ""), token: tokenB})
	if res.code != http.StatusOK {
		f.t.Fatalf("get %s/%s: %d %s", ns, name, res.code, res.body)
	}
	var l leaseapi.Lease
	res.decode(f.t, &l)
	return l
}

// post sends a release or revoke body to ns/name/verb and wants 204.
func (f *fixture) post(token, ns, name, verb, holder string, fencingToken int32) {
	f.t.Helper()
	res := f.do(request{method: http.MethodPost, path: leasePath(ns, name, verb), token: token,
		body: fmt.Sprintf(`{"holder":%q,"fencingToken":%d}`, holder, fencingToken)})
	if res.code != http.StatusNoContent {
		f.t.Fatalf("%s %s/%s: %d %s", verb, ns, name, res.code, res.body)
	}
}

// TestWatchStreamsChanges: a watch starts with a RESET; an acquire, a
// revocation, a release and an expiry by the sweep each send one CHANGED
// with the record GET answers; renewals (renew, and the holder's acquire)
// send nothing, so the next line after them is the bookmark of a quiet
// stream.
func TestWatchStreamsChanges(t *testing.T) {
	f := newFixture(t, fixtureOptions{watch: WatchOptions{BookmarkInterval: 300 * time.Millisecond}})
	w := f.watch(tokenB, watchPath(""))
	if ct := w.header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type %q", ct)
	}
	if w.header.Get(leaseapi.RequestIDHeader) == "" {
		t.Error("no request id")
	}
	if e := w.next(); e.Type != leaseapi.WatchReset || e.Revision == "" || e.Lease != nil {
		t.Fatalf("first line %+v, want a RESET with a revision", e)
	}
	check := func(what string, got leaseapi.Lease, wantHolder string, wantToken int32, wantRevoked bool) {
		t.Helper()
		if diff := cmp.Diff(f.getLease(got.Namespace, got.Name), got); diff != "" {
			t.Errorf("%s: the CHANGED record is not what GET answers (-get +changed):\n%s", what, diff)
		}
		if got.Holder != wantHolder || got.FencingToken != wantToken || got.Revoked != wantRevoked {
			t.Errorf("%s: %q#%d revoked %t, want %q#%d revoked %t", what, got.Holder, got.FencingToken, got.Revoked, wantHolder, wantToken, wantRevoked)
		}
	}

	a := f.acquire(tokenA, "payments", "exporter", "cluster-a", 10)
	check("acquire", w.nextChange(), "cluster-a", 1, false)
	f.acquire(tokenA, "payments", "exporter", "cluster-a", 10)
	res := f.do(request{method: http.MethodPost, path: leasePath("payments", "exporter", "renew"), token: tokenA,
		body: `{"holder":"cluster-a","fencingToken":1,"ttlSeconds":10}`})
	if res.code != http.StatusOK {
		t.Fatalf("renew: %d %s", res.code, res.body)
	}
	if e := w.next(); e.Type != leaseapi.WatchBookmark || e.Revision == "" {
		t.Fatalf("after two renewals: %+v, want only the bookmark of a quiet stream", e)
	}
	f.post(tokenAdmin, "payments", "exporter", "revoke", "cluster-a", a.FencingToken)
	check("revoke", w.nextChange(), "cluster-a", 1, true)
	f.post(tokenA, "payments", "exporter", "release", "cluster-a", a.FencingToken)
	check("release", w.nextChange(), "", 1, false)

	f.acquire(tokenB, "payments", "exporter", "cluster-b", 5)
	check("a new term", w.nextChange(), "cluster-b", 2, false)
	f.clock.Step(6 * time.Second)
	f.srv.sweep(t.Context())
	check("expiry by the sweep", w.nextChange(), "", 2, false)

	m := f.srv.Metrics
	if got := testutil.ToFloat64(m.watchesOpen); got != 1 {
		t.Errorf("watches open: %v, want 1", got)
	}
	// A line is counted once flushed, which may be after the client read it.
	poll.For(t, 5*time.Second, "5 CHANGED lines counted", func() bool {
		return testutil.ToFloat64(m.watchEvents.WithLabelValues(leaseapi.WatchChanged)) == 5
	})
	if got := testutil.ToFloat64(m.watchResets.WithLabelValues(string(lease.ResetStart))); got != 1 {
		t.Errorf("resets at start counted: %v, want 1", got)
	}
	w.cancel()
	poll.For(t, 5*time.Second, "the watch gauge back to 0", func() bool {
		return testutil.ToFloat64(m.watchesOpen) == 0
	})
}

// TestWatchResumes: a watch resumed from the revision of a line is sent
// exactly the changes after it, in order, without a RESET; resumed from a
// bookmark with nothing to replay it begins with a bookmark; a revision of
// another server (another process's change log) or no revision at all
// begins with a RESET.
func TestWatchResumes(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	w := f.watch(tokenA, watchPath(""))
	w.next() // RESET
	first := f.acquire(tokenA, "payments", "exporter", "cluster-a", 10)
	seen := w.next()
	w.cancel()

	// Missed while no watch was open: a release and two new terms.
	f.post(tokenA, "payments", "exporter", "release", "cluster-a", first.FencingToken)
	f.acquire(tokenB, "payments", "exporter", "cluster-b", 10)
	f.acquire(tokenB, "billing", "ledger", "cluster-b", 10)

	resumed := f.watch(tokenA, watchPath(seen.Revision))
	var got []string
	for range 3 {
		l := resumed.nextChange()
		got = append(got, fmt.Sprintf("%s/%s %s#%d", l.Namespace, l.Name, l.Holder, l.FencingToken))
	}
	want := []string{"payments/exporter #1", "payments/exporter cluster-b#2", "billing/ledger cluster-b#1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("replayed (-want +got):\n%s", diff)
	}
	bookmark := f.watch(tokenA, watchPath(f.srv.Service.Watch(nil, "").Revision()))
	if e := bookmark.next(); e.Type != leaseapi.WatchBookmark {
		t.Errorf("resumed at the newest revision: first line %+v, want a BOOKMARK", e)
	}

	other := newFixture(t, fixtureOptions{})
	for name, revision := range map[string]string{
		"another server's revision": other.srv.Service.Watch(nil, "").Revision(),
		"not a revision":            "12",
	} {
		w := f.watch(tokenA, watchPath(revision))
		if e := w.next(); e.Type != leaseapi.WatchReset {
			t.Errorf("%s: first line %+v, want a RESET", name, e)
		}
	}
	if got := testutil.ToFloat64(f.srv.Metrics.watchResets.WithLabelValues(string(lease.ResetUnknownRevision))); got != 2 {
		t.Errorf("resets for unknown revisions counted: %v, want 2", got)
	}
}

// TestWatchNamespaces: a watch of some namespaces is sent their changes
// only.
func TestWatchNamespaces(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	w := f.watch(tokenA, watchPath("", "payments", "billing"))
	w.next() // RESET
	for _, ns := range []string{"shipping", "payments", "other", "billing"} {
		f.acquire(tokenA, ns, "lease", "cluster-a", 10)
	}
	for _, want := range []string{"payments", "billing"} {
		if l := w.nextChange(); l.Namespace != want {
			t.Errorf("change in %s, want %s", l.Namespace, want)
		}
	}
	select {
	case e := <-w.lines:
		t.Errorf("a line of another namespace: %+v", e)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestWatchRefusals: bad namespaces are 400 naming the field, no
// credentials 401, and watches over the bounds 429 with Retry-After.
func TestWatchRefusals(t *testing.T) {
	f := newFixture(t, fixtureOptions{watch: WatchOptions{MaxWatches: 3, MaxWatchesPerSubject: 2}})
	cases := map[string]struct {
		path, token string
		wantCode    int
		wantMessage string
	}{
		"namespace not a DNS label": {path: watchPath("", "payments", "Pay_ments"), token: tokenA, wantCode: http.StatusBadRequest, wantMessage: "namespace: "},
		"empty namespace":           {path: "/v1alpha1/watch/leases?namespace=", token: tokenA, wantCode: http.StatusBadRequest, wantMessage: "namespace: "},
		"no credentials":            {path: watchPath(""), wantCode: http.StatusUnauthorized, wantMessage: "unauthorized"},
		"bad credentials":           {path: watchPath(""), token: "nope", wantCode: http.StatusUnauthorized, wantMessage: "unauthorized"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res := doWith(t, f.client, f.http.URL, request{method: http.MethodGet, path: tc.path, token: tc.token})
			if res.code != tc.wantCode || !strings.Contains(res.errorMessage(t), tc.wantMessage) {
				t.Errorf("%d %s, want %d naming %q", res.code, res.body, tc.wantCode, tc.wantMessage)
			}
		})
	}
	if res := f.do(request{method: http.MethodPost, path: watchPath(""), token: tokenA}); res.code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", res.code)
	}

	f.watch(tokenA, watchPath("")).next()
	f.watch(tokenA, watchPath("")).next()
	res := f.do(request{method: http.MethodGet, path: watchPath(""), token: tokenA})
	if res.code != http.StatusTooManyRequests || res.header.Get("Retry-After") == "" {
		t.Errorf("a third watch of one subject: %d %s (Retry-After %q), want 429", res.code, res.body, res.header.Get("Retry-After"))
	}
	f.watch(tokenB, watchPath("")).next()
	if res := f.do(request{method: http.MethodGet, path: watchPath(""), token: tokenAdmin}); res.code != http.StatusTooManyRequests {
		t.Errorf("a fourth watch of the server: %d %s, want 429", res.code, res.body)
	}
}

// TestWatchEndsAtMaxDuration: a stream ends cleanly (the body ends, no
// error) at its maximum duration.
func TestWatchEndsAtMaxDuration(t *testing.T) {
	f := newFixture(t, fixtureOptions{watch: WatchOptions{MaxDuration: 300 * time.Millisecond}})
	w := f.watch(tokenA, watchPath(""))
	w.next()
	select {
	case err := <-w.ended:
		if err != nil {
			t.Errorf("the stream ended with %v, want a clean end", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end at its maximum duration")
	}
}

// TestWatchShutdown: EndWatches ends open streams cleanly, so that
// http.Server.Shutdown does not wait for them.
func TestWatchShutdown(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	w := f.watch(tokenA, watchPath(""))
	w.next()
	f.http.Config.RegisterOnShutdown(f.srv.EndWatches)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := f.http.Config.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a watch open: %v", err)
	}
	if err := <-w.ended; err != nil {
		t.Errorf("the stream ended with %v, want a clean end", err)
	}
}

// smallBuffers makes every accepted connection's send buffer small, so
// that a client that does not read blocks the server's writes after a few
// kilobytes rather than a few megabytes.
func smallBuffers(ln net.Listener) net.Listener { return smallBufferListener{ln} }

type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// rawWatch opens a watch on a connection of its own with a small receive
// buffer, reads the answer's header, and leaves the body unread.
func rawWatch(t *testing.T, f *fixture) (net.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
		return errors.Join(err, serr)
	}}
	conn, err := d.DialContext(t.Context(), "tcp", f.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer %s\r\n\r\n", watchPath(""), tokenA)
	br := bufio.NewReaderSize(conn, 512)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("watch: %v, %v", res, err)
	}
	return conn, bufio.NewReaderSize(res.Body, 512)
}

// changeMany writes n changes (new terms of n leases) through the service.
func changeMany(t *testing.T, f *fixture, n int) {
	t.Helper()
	for i := range n {
		key := leaseapi.Key{Namespace: "payments", Name: fmt.Sprintf("lease-with-a-longish-name-%04d", i)}
		if _, err := f.srv.Service.Acquire(t.Context(), key, "cluster-a", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSlowWatcher: a client that stops reading costs the server no more
// than the change log it keeps anyway. While the server's writes are
// blocked its watcher falls out of the ring; when the client reads again it
// is sent what was already under way, then a RESET instead of the changes
// it missed, then the changes after it, in order.
func TestSlowWatcher(t *testing.T) {
	const ring, changes = 32, 600
	f := newFixture(t, fixtureOptions{changeLogSize: ring, listener: smallBuffers,
		watch: WatchOptions{WriteTimeout: 20 * time.Second, BookmarkInterval: 500 * time.Millisecond}})
	_, body := rawWatch(t, f)
	readLine := func() leaseapi.WatchEvent {
		t.Helper()
		line, err := body.ReadBytes('\n')
		if err != nil {
			t.Fatalf("read line: %v", err)
		}
		var e leaseapi.WatchEvent
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		return e
	}
	if e := readLine(); e.Type != leaseapi.WatchReset {
		t.Fatalf("first line %+v", e)
	}
	start := time.Now()
	changeMany(t, f, changes)
	t.Logf("%d changes written in %s while the client did not read", changes, time.Since(start).Round(time.Millisecond))

	var (
		changed, resets int
		last            = -1
	)
	for {
		e := readLine()
		if e.Type == leaseapi.WatchReset {
			resets++
			continue
		}
		if e.Type == leaseapi.WatchBookmark {
			break // caught up
		}
		if e.Type != leaseapi.WatchChanged {
			t.Fatalf("line %+v, want CHANGED, RESET and BOOKMARK lines only", e)
		}
		var i int
		if _, err := fmt.Sscanf(e.Lease.Name, "lease-with-a-longish-name-%d", &i); err != nil || i <= last {
			t.Fatalf("change of %s after that of lease %d: out of order", e.Lease.Name, last)
		}
		last = i
		changed++
	}
	t.Logf("the client was sent %d of %d changes and %d RESETs in their stead", changed, changes, resets)
	if resets == 0 || changed >= changes {
		t.Errorf("%d changes and %d RESETs were sent: the server held every change for a client that did not read", changed, resets)
	}
	if got := testutil.ToFloat64(f.srv.Metrics.watchResets.WithLabelValues(string(lease.ResetBehind))); got != float64(resets) {
		t.Errorf("resets for falling behind counted: %v, want %d", got, resets)
	}
	f.acquire(tokenB, "payments", "after", "cluster-b", 10)
	if e := readLine(); e.Type != leaseapi.WatchChanged || e.Lease.Name != "after" {
		t.Errorf("once caught up: %+v, want the next change", e)
	}
}

// TestStuckWatcherIsCutOff: a client that never reads is cut off once a
// line could not be written within the write timeout; its stream ends and
// no longer counts as open.
func TestStuckWatcherIsCutOff(t *testing.T) {
	const timeout = 500 * time.Millisecond
	f := newFixture(t, fixtureOptions{changeLogSize: 32, listener: smallBuffers, watch: WatchOptions{WriteTimeout: timeout}})
	conn, _ := rawWatch(t, f)
	poll.For(t, 5*time.Second, "the watch open", func() bool {
		return testutil.ToFloat64(f.srv.Metrics.watchesOpen) == 1
	})
	changeMany(t, f, 600)
	took := poll.For(t, 10*time.Second, "the stuck watch cut off", func() bool {
		return testutil.ToFloat64(f.srv.Metrics.watchesOpen) == 0
	})
	t.Logf("cut off %s after the last change (write timeout %s)", took.Round(time.Millisecond), timeout)
	// What the kernel had buffered can still be read; then the connection ends.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Errorf("the connection was not closed after the cut (%d bytes read)", n)
	}
	t.Logf("%d bytes were buffered on the way when the stream was cut", n)
}

// TestWatchOutlastsConnectionBounds: the http.Server's bounds on a
// connection (headers, body, idle) are far shorter than a healthy stream,
// and none of them cuts it: its bookmarks keep arriving.
func TestWatchOutlastsConnectionBounds(t *testing.T) {
	const bound = 200 * time.Millisecond
	f := newFixture(t, fixtureOptions{
		limits: Limits{ReadHeaderTimeout: bound, BodyReadTimeout: bound, IdleTimeout: bound},
		watch:  WatchOptions{BookmarkInterval: 100 * time.Millisecond},
	})
	w := f.watch(tokenA, watchPath(""))
	w.next() // RESET
	start := time.Now()
	bookmarks := 0
	for time.Since(start) < 10*bound {
		if e := w.next(); e.Type == leaseapi.WatchBookmark {
			bookmarks++
		}
	}
	t.Logf("%d bookmarks in %s on a server whose connection bounds are %s", bookmarks, time.Since(start).Round(time.Millisecond), bound)
	f.acquire(tokenA, "payments", "exporter", "cluster-a", 10)
	for {
		if e := w.next(); e.Type == leaseapi.WatchChanged {
			break
		}
	}
}
