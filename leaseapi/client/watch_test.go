package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
)

// watcher runs WatchLeases until the test ends and records what it hands on.
type watcher struct {
	t         *testing.T
	events    chan string // "RESET" or "ns/name holder#token"
	connected chan bool
	done      chan error
}

func startWatch(t *testing.T, c *client.Client, namespaces ...string) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &watcher{t: t, events: make(chan string, 1024), connected: make(chan bool, 64), done: make(chan error, 1)}
	go func() {
		w.done <- c.WatchLeases(ctx, namespaces, func(e client.LeaseEvent) {
			if e.Reset {
				w.events <- "RESET"
				return
			}
			w.events <- fmt.Sprintf("%s/%s %s#%d", e.Lease.Namespace, e.Lease.Name, e.Lease.Holder, e.Lease.FencingToken)
		}, func(up bool) { w.connected <- up })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchLeases returned %v once its context ended, want context.Canceled", err)
		}
	})
	return w
}

// expect waits for the next events and compares them with want.
func (w *watcher) expect(what string, want ...string) {
	w.t.Helper()
	var got []string
	timeout := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case e := <-w.events:
			got = append(got, e)
		case <-timeout:
			w.t.Fatalf("%s: after 10 s got %q, want %q", what, got, want)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		w.t.Fatalf("%s (-want +got):\n%s", what, diff)
	}
}

// expectConnected waits for the next call of connected.
func (w *watcher) expectConnected(want bool) {
	w.t.Helper()
	select {
	case up := <-w.connected:
		if up != want {
			w.t.Fatalf("connected(%t), want connected(%t)", up, want)
		}
	case <-time.After(10 * time.Second):
		w.t.Fatalf("no connected(%t) within 10 s", want)
	}
}

// quiet checks that nothing more is handed on for a moment.
func (w *watcher) quiet() {
	w.t.Helper()
	select {
	case e := <-w.events:
		w.t.Fatalf("an event more: %s", e)
	case up := <-w.connected:
		w.t.Fatalf("connected(%t) more", up)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestWatchLeasesResumesACutStream: a stream cut mid-way is resumed from
// the last revision: no Reset, and the changes made while it was down are
// handed on in order. The client's per-call timeout (here 300 ms) does not
// end a stream that is quiet for longer.
func TestWatchLeasesResumesACutStream(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{})
	c := newClient(t, client.Config{URL: ts.URL, Timeout: 300 * time.Millisecond})
	ctx := t.Context()
	w := startWatch(t, c)
	w.expectConnected(true)
	w.expect("first", "RESET")

	time.Sleep(time.Second) // longer than the call timeout
	east, err := c.Acquire(ctx, "payments", "exporter", "east", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w.expect("acquire", "payments/exporter east#1")

	ts.CloseClientConnections()
	w.expectConnected(false)
	if err := c.Release(ctx, "payments", "exporter", "east", east.FencingToken); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "payments", "exporter", "west", time.Minute); err != nil {
		t.Fatal(err)
	}
	w.expectConnected(true)
	w.expect("missed while cut", "payments/exporter #1", "payments/exporter west#2")
	w.quiet()
}

// TestWatchLeasesAfterRestart: the server stops and a new one (new process
// state: another change log, here also another store) serves the same
// address. The client reconnects on its own, the stream cannot resume, and
// it begins with a Reset.
func TestWatchLeasesAfterRestart(t *testing.T) {
	first := httptest.NewServer(leaseapitest.Handler(t, leaseapitest.Options{}))
	addr := first.Listener.Addr().String()
	c := newClient(t, client.Config{URL: first.URL})
	ctx := t.Context()
	w := startWatch(t, c, "payments")
	w.expectConnected(true)
	w.expect("first", "RESET")
	if _, err := c.Acquire(ctx, "payments", "exporter", "east", time.Minute); err != nil {
		t.Fatal(err)
	}
	w.expect("acquire", "payments/exporter east#1")

	first.CloseClientConnections()
	first.Close()
	w.expectConnected(false)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	second := httptest.NewUnstartedServer(leaseapitest.Handler(t, leaseapitest.Options{}))
	second.Listener.Close()
	second.Listener = ln
	second.Start()
	t.Cleanup(second.Close)

	w.expectConnected(true)
	w.expect("after the restart", "RESET")
	if _, err := c.Acquire(ctx, "payments", "exporter", "west", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "billing", "ledger", "west", time.Minute); err != nil {
		t.Fatal(err)
	}
	w.expect("a new term at the new server", "payments/exporter west#1")
	w.quiet()
}

// TestWatchLeasesRefused: a server of an earlier release (no such route:
// 404) is ErrNotSupported, and bad credentials ErrUnauthorized, at once.
func TestWatchLeasesRefused(t *testing.T) {
	api := leaseapitest.Handler(t, leaseapitest.Options{Tokens: map[string]string{"east": "token-of-east"}})
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1alpha1/watch/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"not found"}`))
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(old.Close)
	current := httptest.NewServer(api)
	t.Cleanup(current.Close)
	cases := map[string]struct {
		url, token string
		wantErr    error
	}{
		"a server of an earlier release": {url: old.URL, token: "token-of-east", wantErr: client.ErrNotSupported},
		"bad credentials":                {url: current.URL, token: "nope", wantErr: client.ErrUnauthorized},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, client.Config{URL: tc.url, Token: tc.token})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			var events atomic.Int32
			err := c.WatchLeases(ctx, nil, func(client.LeaseEvent) { events.Add(1) }, nil)
			if !errors.Is(err, tc.wantErr) || ctx.Err() != nil {
				t.Fatalf("WatchLeases: %v, want %v at once", err, tc.wantErr)
			}
			if events.Load() != 0 {
				t.Errorf("%d events handed on", events.Load())
			}
		})
	}
}

// TestWatchLeasesQuietStreamIsBroken: a stream that sends no line for the
// idle timeout is dropped and opened again.
func TestWatchLeasesQuietStreamIsBroken(t *testing.T) {
	var (
		mu      sync.Mutex
		streams int
	)
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		streams++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"type":"RESET","revision":"a-1"}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // and then nothing
	}))
	t.Cleanup(silent.Close)
	c := newClient(t, client.Config{URL: silent.URL, WatchIdleTimeout: 200 * time.Millisecond})
	w := startWatch(t, c)
	for range 2 {
		w.expectConnected(true)
		w.expect("a stream's first line", "RESET")
		w.expectConnected(false)
	}
	mu.Lock()
	defer mu.Unlock()
	if streams < 2 {
		t.Errorf("%d streams opened, want a new one after the quiet one", streams)
	}
}
