package client_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
)

func newClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	if cfg.RetryWaitMin == 0 {
		cfg.RetryWaitMin, cfg.RetryWaitMax = time.Millisecond, 5*time.Millisecond
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLeaseLifecycle(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{})
	c := newClient(t, client.Config{URL: ts.URL + "/"})
	ctx := t.Context()

	east, err := c.Acquire(ctx, "payments", "exporter", "east", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !east.Acquired || east.FencingToken != 1 || east.Holder != "east" {
		t.Fatalf("first acquire: %+v, want east with token 1", east)
	}
	west, err := c.Acquire(ctx, "payments", "exporter", "west", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if west.Acquired || west.Holder != "east" {
		t.Fatalf("contending acquire: %+v, want not acquired, held by east", west)
	}
	renewed, err := c.Renew(ctx, "payments", "exporter", "east", 1, 10*time.Second)
	if err != nil || !renewed.Acquired || renewed.FencingToken != 1 {
		t.Fatalf("renew: %+v, %v", renewed, err)
	}
	if lost, err := c.Renew(ctx, "payments", "exporter", "west", 1, 10*time.Second); err != nil || lost.Acquired {
		t.Fatalf("renew by non-holder: %+v, %v; want not acquired", lost, err)
	}
	if err := c.Release(ctx, "payments", "exporter", "west", 1); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("release by non-holder: %v, want ErrConflict", err)
	}
	if err := c.Release(ctx, "payments", "exporter", "east", 1); err != nil {
		t.Fatalf("release: %v", err)
	}
	if west, err = c.Acquire(ctx, "payments", "exporter", "west", 10*time.Second); err != nil || !west.Acquired || west.FencingToken != 2 {
		t.Fatalf("acquire after release: %+v, %v; want west with token 2", west, err)
	}
	got, err := c.GetLease(ctx, "payments", "exporter")
	if err != nil || got.Holder != "west" || got.FencingToken != 2 {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if _, err := c.GetLease(ctx, "payments", "never"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of a never-seen lease: %v, want ErrNotFound", err)
	}
	if _, err := c.Acquire(ctx, "Payments", "exporter", "west", time.Second); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("acquire with a bad namespace: %v, want ErrInvalid", err)
	}

	for i := range 5 {
		if _, err := c.Acquire(ctx, "batch", "job-"+string(rune('a'+i)), "east", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	opts := client.ListOptions{Namespace: "batch", Limit: 2}
	for {
		page, err := c.ListLeases(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range page.Items {
			names = append(names, l.Name)
		}
		if page.Continue == "" {
			break
		}
		opts.Continue = page.Continue
	}
	if len(names) != 5 || names[0] != "job-a" || names[4] != "job-e" {
		t.Fatalf("paged list: %v, want job-a..job-e", names)
	}
}

func TestClusterCalls(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{Tokens: map[string]string{"east": "east-token", "ops": "ops-token", "west": "west-token"}, Admins: []string{"ops"}})
	ctx := t.Context()
	east := newClient(t, client.Config{URL: ts.URL, Token: "east-token"})
	west := newClient(t, client.Config{URL: ts.URL, Token: "west-token"})
	ops := newClient(t, client.Config{URL: ts.URL, Token: "ops-token"})

	if _, err := east.RegisterCluster(ctx, "east", leaseapi.ClusterRegistration{Fingerprint: "uid-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := west.RegisterCluster(ctx, "east", leaseapi.ClusterRegistration{Fingerprint: "uid-2"}); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("registering another subject's cluster: %v, want ErrForbidden", err)
	}
	if _, err := east.Cordon(ctx, "east"); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("cordon by a non-admin: %v, want ErrForbidden", err)
	}
	res, err := ops.Cordon(ctx, "east")
	if err != nil || !res.Cordoned {
		t.Fatalf("cordon by admin: %+v, %v", res, err)
	}
	if hb, err := east.RegisterCluster(ctx, "east", leaseapi.ClusterRegistration{Fingerprint: "uid-1"}); err != nil || !hb.Cordoned {
		t.Fatalf("heartbeat of a cordoned cluster: %+v, %v; want cordoned", hb, err)
	}
	if _, err := east.Acquire(ctx, "ns", "a", "east", time.Minute); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("acquire by a cordoned cluster: %v, want ErrConflict", err)
	}
	if _, err := ops.Uncordon(ctx, "east"); err != nil {
		t.Fatal(err)
	}
	clusters, err := west.ListClusters(ctx)
	if err != nil || len(clusters) != 1 || clusters[0].ID != "east" || clusters[0].Cordoned || !clusters[0].Healthy {
		t.Fatalf("clusters: %+v, %v", clusters, err)
	}
	bad := newClient(t, client.Config{URL: ts.URL, Token: "nope"})
	if _, err := bad.ListClusters(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("bad token: %v, want ErrUnauthorized", err)
	}
}

func TestTokenFileIsReReadWhenItChanges(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{Tokens: map[string]string{"east": "first", "west": "second"}})
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, client.Config{URL: ts.URL, TokenFile: path})
	if res, err := c.Acquire(t.Context(), "ns", "a", "east", time.Minute); err != nil || !res.Acquired {
		t.Fatalf("acquire as east: %+v, %v", res, err)
	}
	// A rotated Secret: new content, and a different mtime.
	if err := os.WriteFile(path, []byte("second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(2 * time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(t.Context(), "ns", "b", "east", time.Minute); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("acquire as east with west's token: %v, want ErrForbidden", err)
	}
	if res, err := c.Acquire(t.Context(), "ns", "b", "west", time.Minute); err != nil || !res.Acquired {
		t.Fatalf("acquire as west after rotation: %+v, %v", res, err)
	}
}

// flaky answers the first n requests with code, then hands over to next.
type flaky struct {
	next  http.Handler
	code  int
	n     int64
	calls atomic.Int64
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.calls.Add(1) <= f.n {
		w.WriteHeader(f.code)
		return
	}
	f.next.ServeHTTP(w, r)
}

func TestRetries(t *testing.T) {
	cases := map[string]struct {
		code      int
		failFirst int64
		wantErr   error
		wantCalls int64
	}{
		"503 then success is retried": {code: http.StatusServiceUnavailable, failFirst: 2, wantCalls: 3},
		"500 then success is retried": {code: http.StatusInternalServerError, failFirst: 1, wantCalls: 2},
		"persistent 502 gives up":     {code: http.StatusBadGateway, failFirst: 100, wantErr: client.ErrUnavailable, wantCalls: 3},
		"400 is never retried":        {code: http.StatusBadRequest, failFirst: 100, wantErr: client.ErrInvalid, wantCalls: 1},
		"409 is never retried":        {code: http.StatusConflict, failFirst: 100, wantErr: client.ErrConflict, wantCalls: 1},
		"429 is retried":              {code: http.StatusTooManyRequests, failFirst: 1, wantCalls: 2},
		"401 is never retried":        {code: http.StatusUnauthorized, failFirst: 100, wantErr: client.ErrUnauthorized, wantCalls: 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := &flaky{next: leaseapitest.Handler(t, leaseapitest.Options{}), code: tc.code, n: tc.failFirst}
			ts := httptest.NewServer(f)
			defer ts.Close()
			c := newClient(t, client.Config{URL: ts.URL, RetryMax: 2})
			res, err := c.Acquire(t.Context(), "ns", "a", "east", time.Minute)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && (!res.Acquired || res.FencingToken != 1) {
				t.Errorf("result %+v, want acquired with token 1", res)
			}
			if got := f.calls.Load(); got != tc.wantCalls {
				t.Errorf("server saw %d calls, want %d", got, tc.wantCalls)
			}
		})
	}
}

func TestCallIsBoundedByContextAndTimeout(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release)

	c := newClient(t, client.Config{URL: ts.URL, Timeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := c.Renew(t.Context(), "ns", "a", "east", 1, time.Minute)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("renew against a hung server succeeded")
	}
	t.Logf("renew against a hung server gave up after %s: %v", elapsed, err)
	if elapsed > 5*time.Second {
		t.Errorf("renew took %s; the default timeout of 200ms must bound it", elapsed)
	}
}

func TestCAFile(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{TLS: true})
	trusted := newClient(t, client.Config{URL: ts.URL, CAFile: ts.CAFile()})
	if res, err := trusted.Acquire(t.Context(), "ns", "a", "east", time.Minute); err != nil || !res.Acquired {
		t.Fatalf("acquire over TLS with the CA: %+v, %v", res, err)
	}
	untrusted := newClient(t, client.Config{URL: ts.URL})
	if _, err := untrusted.Acquire(t.Context(), "ns", "a", "east", time.Minute); err == nil {
		t.Fatal("acquire over TLS without the CA succeeded")
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	cases := map[string]client.Config{
		"no URL":             {},
		"no scheme":          {URL: "leases:8443"},
		"missing token file": {URL: "http://127.0.0.1:1", TokenFile: filepath.Join(t.TempDir(), "absent")},
		"missing CA file":    {URL: "https://127.0.0.1:1", CAFile: filepath.Join(t.TempDir(), "absent")},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := client.New(cfg); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}

func TestWatchLeaseAnswersOnRelease(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{})
	c := newClient(t, client.Config{URL: ts.URL})
	ctx := t.Context()
	held, err := c.Acquire(ctx, "ns", "a", "east", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	// Nothing changes: the watch answers after its wait with the same view.
	start := time.Now()
	l, err := c.WatchLease(ctx, "ns", "a", "east", held.FencingToken, time.Second)
	if err != nil || l.Holder != "east" {
		t.Fatalf("watch without a change: %+v, %v", l, err)
	}
	if waited := time.Since(start); waited < 900*time.Millisecond {
		t.Errorf("watch without a change answered after %s, want about its 1s wait", waited)
	}

	// A release wakes the watcher at once.
	type answer struct {
		l   leaseapi.Lease
		err error
		at  time.Time
	}
	done := make(chan answer, 1)
	go func() {
		l, err := c.WatchLease(ctx, "ns", "a", "east", held.FencingToken, 30*time.Second)
		done <- answer{l, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	if err := c.Release(ctx, "ns", "a", "east", held.FencingToken); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.l.Holder != "" || a.l.FencingToken != held.FencingToken {
		t.Fatalf("watch across a release: %+v, %v; want free with token %d", a.l, a.err, held.FencingToken)
	}
	t.Logf("watcher woke %s after the release", a.at.Sub(released))
	if a.at.Sub(released) > 2*time.Second {
		t.Errorf("watcher woke %s after the release, want at once", a.at.Sub(released))
	}

	// A view that is already stale answers at once.
	if l, err = c.WatchLease(ctx, "ns", "a", "east", held.FencingToken, 30*time.Second); err != nil || l.Holder != "" {
		t.Fatalf("stale view: %+v, %v", l, err)
	}
}

func TestWatchLeaseAnswersOnExpiry(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{})
	c := newClient(t, client.Config{URL: ts.URL})
	held, err := c.Acquire(t.Context(), "ns", "a", "east", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.WatchLease(t.Context(), "ns", "a", "east", held.FencingToken, 30*time.Second)
	if err != nil || l.Holder != "" {
		t.Fatalf("watch across an expiry: %+v, %v; want free", l, err)
	}
	if _, err := c.WatchLease(t.Context(), "ns", "never", "", 0, time.Second); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("watch of a never-seen lease: %v, want ErrNotFound", err)
	}
}

// TestMoveAndHistory: Move and History against a real lease API: the
// holder's own move, the reservation others see, the sentinel errors of the
// refusals, and the history of the moved term.
func TestMoveAndHistory(t *testing.T) {
	ts := leaseapitest.Start(t, leaseapitest.Options{Tokens: map[string]string{"east": "east-token", "ops": "ops-token", "west": "west-token"}, Admins: []string{"ops"}})
	ctx := t.Context()
	east := newClient(t, client.Config{URL: ts.URL, Token: "east-token"})
	west := newClient(t, client.Config{URL: ts.URL, Token: "west-token"})
	ops := newClient(t, client.Config{URL: ts.URL, Token: "ops-token"})
	for c, id := range map[*client.Client]string{east: "east", west: "west"} {
		if _, err := c.RegisterCluster(ctx, id, leaseapi.ClusterRegistration{Fingerprint: "uid-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ops.History(ctx, "ns", "db", 0); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("history of a lease never seen: %v, want ErrNotFound", err)
	}
	term, err := east.Acquire(ctx, "ns", "db", "east", time.Minute)
	if err != nil || !term.Acquired {
		t.Fatalf("acquire: %+v, %v", term, err)
	}
	for to, want := range map[string]error{"east": client.ErrInvalid, "north": client.ErrConflict} {
		if _, err := ops.Move(ctx, "ns", "db", "east", term.FencingToken, to); !errors.Is(err, want) {
			t.Errorf("move to %s: %v, want %v", to, err, want)
		}
	}
	if _, err := west.Move(ctx, "ns", "db", "east", term.FencingToken, "west"); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("move of another cluster's term by a non-admin: %v, want ErrForbidden", err)
	}
	moved, err := east.Move(ctx, "ns", "db", "east", term.FencingToken, "west")
	if err != nil || moved.Move == nil || moved.Move.To != "west" || moved.Move.From != "east" || !moved.Revoked {
		t.Fatalf("move: %+v, %v; want revoked and moving from east to west", moved, err)
	}
	if err := east.Release(ctx, "ns", "db", "east", term.FencingToken); err != nil {
		t.Fatal(err)
	}
	refused, err := east.Acquire(ctx, "ns", "db", "east/other", time.Minute)
	if err != nil || refused.Acquired || refused.ReservedFor != "west" || refused.ReservedUntil.IsZero() || refused.Message == "" {
		t.Fatalf("acquire by east while reserved for west: %+v, %v", refused, err)
	}
	next, err := west.Acquire(ctx, "ns", "db", "west", time.Minute)
	if err != nil || !next.Acquired {
		t.Fatalf("acquire by the destination: %+v, %v", next, err)
	}
	terms, err := east.History(ctx, "ns", "db", 0)
	if err != nil || len(terms) != 2 {
		t.Fatalf("history: %+v, %v", terms, err)
	}
	if terms[0].Holder != "west" || !terms[0].EndedAt.IsZero() || terms[1].Holder != "east" || terms[1].Ending != leaseapi.TermMoved {
		t.Errorf("history: %+v; want west's live term, then east's moved one", terms)
	}
	if one, err := east.History(ctx, "ns", "db", 1); err != nil || len(one) != 1 {
		t.Errorf("history limited to 1: %+v, %v", one, err)
	}
}
