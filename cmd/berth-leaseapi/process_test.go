package main_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/poll"
	"github.com/berthfleet/berth/test/process"
)

func TestMain(m *testing.M) {
	binaries.Main(m, "berth-leaseapi")
}

// server is a running berth-leaseapi.
type server struct {
	*process.Process
	addr string
}

// start runs berth-leaseapi with args and waits until it serves. The lines
// it logs at ERROR are logged to t when the test ends.
func start(t *testing.T, args ...string) *server {
	t.Helper()
	p := process.StartForTest(t, "berth-leaseapi", binaries.Path("berth-leaseapi"), append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", ""}, args...)...)
	t.Cleanup(func() {
		for _, line := range p.LogLines(`"level":"ERROR"`) {
			t.Logf("berth-leaseapi: %s", line)
		}
	})
	serving, err := p.AwaitLogged(t.Context(), 30*time.Second, "serving lease API")
	if err != nil {
		t.Fatal(err)
	}
	return &server{Process: p, addr: serving.String("address")}
}

func (p *server) client(t *testing.T) *client.Client {
	c, err := client.New(client.Config{URL: "http://" + p.addr, RetryMax: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// grant is an acquisition the server acknowledged.
type grant struct {
	holder string
	token  int32
}

// TestKillNineLosesNoAcknowledgedWrite holds leases under load, kills the
// server with SIGKILL mid-load, restarts it on the same file, and checks that
// every acknowledged acquisition survived, no token is reused, and holders
// keep their leases through the restart.
func TestKillNineLosesNoAcknowledgedWrite(t *testing.T) {
	db := filepath.Join(t.TempDir(), "leases.db")
	const (
		ownHolders = 40 // each holds a lease of its own and renews it
		contended  = 8  // leases that several holders take in turn
		ttl        = time.Minute
	)
	p := start(t, "--sqlite-path", db)
	c := p.client(t)

	var (
		mu        sync.Mutex
		own       = map[string]grant{} // lease name -> last acknowledged grant
		maxTokens = map[string]int32{} // contended lease -> highest acknowledged token
		wg        sync.WaitGroup
		stop      = make(chan struct{})
	)
	for i := range ownHolders {
		wg.Go(func() {
			name, holder := fmt.Sprintf("own-%02d", i), fmt.Sprintf("holder-%02d", i)
			var token int32
			for {
				select {
				case <-stop:
					return
				default:
				}
				var (
					res client.AcquireResult
					err error
				)
				if token == 0 {
					res, err = c.Acquire(t.Context(), "load", name, holder, ttl)
				} else {
					res, err = c.Renew(t.Context(), "load", name, holder, token, ttl)
				}
				if err != nil {
					return // the server is gone
				}
				if !res.Acquired {
					t.Errorf("%s lost its own lease %s to %q", holder, name, res.Holder)
					return
				}
				token = res.FencingToken
				mu.Lock()
				own[name] = grant{holder: holder, token: token}
				mu.Unlock()
			}
		})
	}
	for i := range contended * 3 {
		wg.Go(func() {
			name, holder := fmt.Sprintf("shared-%d", i%contended), fmt.Sprintf("taker-%02d", i)
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := c.Acquire(t.Context(), "load", name, holder, ttl)
				if err != nil {
					return
				}
				if !res.Acquired {
					continue
				}
				mu.Lock()
				maxTokens[name] = max(maxTokens[name], res.FencingToken)
				mu.Unlock()
				if err := c.Release(t.Context(), "load", name, holder, res.FencingToken); err != nil {
					return
				}
			}
		})
	}

	// Kill it once the load is under way (every own holder granted, some
	// contended grants), and a moment later, in the middle of it.
	loaded := func() bool {
		mu.Lock()
		defer mu.Unlock()
		grants := 0
		for _, m := range maxTokens {
			grants += int(m)
		}
		return len(own) == ownHolders && grants >= contended
	}
	_, _ = poll.Until(t.Context(), 30*time.Second, "load under way", poll.Condition(loaded))
	time.Sleep(500 * time.Millisecond)
	p.Kill()
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	grants := 0
	for _, m := range maxTokens {
		grants += int(m)
	}
	t.Logf("before kill -9: %d own leases held, %d contended grants acknowledged", len(own), grants)
	if len(own) < ownHolders || grants < contended {
		t.Fatalf("load too light to prove anything: %d own leases, %d contended grants", len(own), grants)
	}

	p = start(t, "--sqlite-path", db)
	c = p.client(t)
	for name, g := range own {
		got, err := c.GetLease(t.Context(), "load", name)
		if err != nil {
			t.Fatalf("get %s after restart: %v", name, err)
		}
		if got.Holder != g.holder || got.FencingToken != g.token {
			t.Errorf("%s after restart: holder %q token %d, want %q token %d (acknowledged before the kill)", name, got.Holder, got.FencingToken, g.holder, g.token)
		}
		res, err := c.Renew(t.Context(), "load", name, g.holder, g.token, ttl)
		if err != nil || !res.Acquired {
			t.Errorf("holder %s renewing %s after restart: %+v, %v; want it kept", g.holder, name, res, err)
		}
	}
	for name, acked := range maxTokens {
		got, err := c.GetLease(t.Context(), "load", name)
		if err != nil {
			t.Fatalf("get %s after restart: %v", name, err)
		}
		if got.FencingToken < acked {
			t.Errorf("%s after restart: token %d, but %d was acknowledged before the kill", name, got.FencingToken, acked)
		}
		if got.Holder != "" {
			if err := c.Release(t.Context(), "load", name, got.Holder, got.FencingToken); err != nil {
				t.Fatal(err)
			}
		}
		res, err := c.Acquire(t.Context(), "load", name, "newcomer", ttl)
		if err != nil || !res.Acquired {
			t.Fatalf("acquire %s after restart: %+v, %v", name, res, err)
		}
		if res.FencingToken <= acked {
			t.Errorf("%s: new token %d after restart reuses or goes below acknowledged %d", name, res.FencingToken, acked)
		}
	}
}

// TestSecondServerOnSameFileIsRefused runs two servers on one file.
func TestSecondServerOnSameFileIsRefused(t *testing.T) {
	db := filepath.Join(t.TempDir(), "leases.db")
	start(t, "--sqlite-path", db)
	out, err := exec.Command(binaries.Path("berth-leaseapi"), "--listen", "127.0.0.1:0", "--metrics-listen", "", "--sqlite-path", db).CombinedOutput()
	if err == nil {
		t.Fatal("second berth-leaseapi on the same file started")
	}
	if !strings.Contains(string(out), "in use by another process") {
		t.Errorf("second server's error does not say why:\n%s", out)
	}
}

// TestRefusesToExposePlainHTTP checks that without TLS and tokens the server
// will not listen beyond loopback.
func TestRefusesToExposePlainHTTP(t *testing.T) {
	out, err := exec.Command(binaries.Path("berth-leaseapi"), "--listen", "0.0.0.0:0", "--metrics-listen", "", "--sqlite-path", filepath.Join(t.TempDir(), "x.db")).CombinedOutput()
	if err == nil {
		t.Fatal("server listened on 0.0.0.0 without TLS and authentication")
	}
	if !strings.Contains(string(out), "not a loopback address") {
		t.Errorf("refusal does not say why:\n%s", out)
	}
}

// TestGracefulShutdown sends SIGTERM and expects a clean exit with the store
// closed (a new server can open the file at once).
func TestGracefulShutdown(t *testing.T) {
	db := filepath.Join(t.TempDir(), "leases.db")
	p := start(t, "--sqlite-path", db)
	if _, err := p.client(t).Acquire(t.Context(), "ns", "a", "east", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	p = start(t, "--sqlite-path", db)
	got, err := p.client(t).GetLease(t.Context(), "ns", "a")
	if err != nil || got.Holder != "east" {
		t.Fatalf("lease after graceful restart: %+v, %v", got, err)
	}
}
