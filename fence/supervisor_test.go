package fence

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Duration
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Duration
	ch chan time.Time
}

func (c *fakeClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- time.Time{}
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{at: c.now + d, ch: ch})
	return ch
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += d
	c.waiters = slices.DeleteFunc(c.waiters, func(w fakeWaiter) bool {
		if w.at <= c.now {
			w.ch <- time.Time{}
			return true
		}
		return false
	})
}

// fakeConfirmer answers each call with answer(n) (n counts from 0), or
// hangs until the call's context ends when answer says so.
type fakeConfirmer struct {
	clock  *fakeClock
	answer func(n int) (leaseapi.Confirmation, error, bool)

	mu    sync.Mutex
	calls []time.Duration // when each call was made
}

func (f *fakeConfirmer) Confirm(ctx context.Context, _, _, _ string, _ int32) (leaseapi.Confirmation, error) {
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, f.clock.Now())
	f.mu.Unlock()
	c, err, hang := f.answer(n)
	if hang {
		<-ctx.Done()
		return leaseapi.Confirmation{}, ctx.Err()
	}
	return c, err
}

func (f *fakeConfirmer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// fakeChild records the signals its group received, at the fake clock's
// time, and exits on SIGTERM and SIGKILL unless told to ignore SIGTERM.
type fakeChild struct {
	clock      *fakeClock
	ignoreTERM bool
	env        []string
	startedAt  time.Duration
	exited     chan ExitStatus

	mu      sync.Mutex
	signals []signalAt
	done    bool
}

type signalAt struct {
	sig syscall.Signal
	at  time.Duration
}

func (c *fakeChild) Pid() int                  { return 4242 }
func (c *fakeChild) Exited() <-chan ExitStatus { return c.exited }

func (c *fakeChild) Signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.signals = append(c.signals, signalAt{sig, c.clock.Now()})
	if (sig == syscall.SIGKILL || (sig == syscall.SIGTERM && !c.ignoreTERM)) && !c.done {
		c.done = true
		c.exited <- ExitStatus{Signal: sig}
	}
	return nil
}

func (c *fakeChild) exit(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.done = true
		c.exited <- ExitStatus{Code: code}
	}
}

func (c *fakeChild) received() []signalAt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.signals)
}

type fakeStarter struct {
	clock      *fakeClock
	ignoreTERM bool
	err        error

	mu    sync.Mutex
	child *fakeChild
}

func (s *fakeStarter) Start(env []string) (Child, error) {
	if s.err != nil {
		return nil, s.err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.child = &fakeChild{clock: s.clock, ignoreTERM: s.ignoreTERM, env: env, startedAt: s.clock.Now(), exited: make(chan ExitStatus, 1)}
	return s.child, nil
}

func (s *fakeStarter) started() *fakeChild {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.child
}

type staticIdentity struct {
	mu       sync.Mutex
	failures int
}

func (s *staticIdentity) Read() (Identity, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures > 0 {
		s.failures--
		return Identity{}, errNotYet
	}
	return Identity{Holder: "east", Token: 7}, nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// harness runs a Supervisor on fakes.
type harness struct {
	clock    *fakeClock
	conf     *fakeConfirmer
	starter  *fakeStarter
	identity *staticIdentity
	signals  chan os.Signal
	log      *syncBuffer
	code     chan int
	once     bool
}

func newHarness(answer func(n int) (leaseapi.Confirmation, error, bool)) *harness {
	clk := &fakeClock{now: 1000 * time.Second}
	return &harness{
		clock:    clk,
		conf:     &fakeConfirmer{clock: clk, answer: answer},
		starter:  &fakeStarter{clock: clk},
		identity: &staticIdentity{},
		signals:  make(chan os.Signal, 1),
		log:      &syncBuffer{},
		code:     make(chan int, 1),
	}
}

func (h *harness) start() {
	s := &Supervisor{
		Namespace: "shop", Name: "exporter",
		Identity: h.identity, Confirmer: h.conf, Starter: h.starter,
		Environ: []string{"PATH=/bin", "BERTH_FENCE_TOKEN_FILE=/var/run/token", "BERTH_LEASE_API_CA=pem", "BERTH_FENCING_TOKEN=1", "BERTH_LEASE_API_URL=https://leases"},
		Clock:   h.clock, Signals: h.signals, Log: &Logger{w: h.log, now: time.Now},
		Once: h.once,
	}
	go func() { h.code <- s.Run() }()
}

// harnessStep is how far step moves the fake clock at a time. The clock
// may move on a step between the supervisor's tick and what it records
// (a call, a signal): a time measured between two records may come out a
// step short.
const harnessStep = 10 * time.Millisecond

// step advances the fake clock in steps of harnessStep, giving the
// supervisor real time to act between them, until cond holds or limit has
// passed on the fake clock; it reports whether cond held.
func (h *harness) step(limit time.Duration, cond func() bool) bool {
	for end := h.clock.Now() + limit; h.clock.Now() < end; {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Microsecond)
		h.clock.advance(harnessStep)
	}
	return cond()
}

// exitCode waits for Run's code, advancing the clock meanwhile.
func (h *harness) exitCode(t *testing.T, limit time.Duration) int {
	t.Helper()
	var code int
	if !h.step(limit, func() bool {
		select {
		case code = <-h.code:
			return true
		default:
			return false
		}
	}) {
		t.Fatalf("supervisor still running after %s; log:\n%s", limit, h.log)
	}
	return code
}

func confirmed(remainingMillis int64) leaseapi.Confirmation {
	return leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 7, TTLSeconds: 3, RemainingMillis: remainingMillis}
}

var errUnreachable = errors.New("dial tcp: connection refused")

func TestStartsOnlyAfterConfirmation(t *testing.T) {
	h := newHarness(func(n int) (leaseapi.Confirmation, error, bool) {
		switch n {
		case 0:
			return leaseapi.Confirmation{}, errUnreachable, false
		case 1:
			return leaseapi.Confirmation{Holder: "east", FencingToken: 8, TTLSeconds: 3}, nil, false
		case 2:
			return leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 8, TTLSeconds: 3, RemainingMillis: 3000}, nil, false
		}
		return confirmed(3000), nil, false
	})
	h.identity.failures = 3
	h.start()
	if !h.step(10*time.Second, func() bool { return h.starter.started() != nil }) {
		t.Fatalf("never started; log:\n%s", h.log)
	}
	if n := h.conf.count(); n != 4 {
		t.Errorf("started after %d confirmation calls, want 4 (an error, a denial, a confirmation of another token, then its own)", n)
	}
	child := h.starter.started()
	wantEnv := []string{"PATH=/bin", "BERTH_LEASE_API_URL=https://leases", "BERTH_FENCING_TOKEN=7", "BERTH_HOLDER=east"}
	if !slices.Equal(child.env, wantEnv) {
		t.Errorf("child env %q, want %q", child.env, wantEnv)
	}
	for _, event := range []string{EventWaitingIdentity, EventWaiting, EventConfirmed, EventChildStarted} {
		if !strings.Contains(h.log.String(), "berth-fence: ") || !strings.Contains(h.log.String(), " "+event) {
			t.Errorf("log lacks %q:\n%s", event, h.log)
		}
	}
	child.exit(0)
	if code := h.exitCode(t, time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}

// TestStopsWhenTheTermIsLost: a denial of the Pod's own revoked term (it
// lasts until released or expired) stops the child gracefully, SIGTERM
// first; any other denial says the term is over and another cluster may be
// granted the lease at once, so the child gets SIGKILL straight away.
func TestStopsWhenTheTermIsLost(t *testing.T) {
	cases := map[string]struct {
		lost leaseapi.Confirmation
		want syscall.Signal
	}{
		"another holder":  {lost: leaseapi.Confirmation{Holder: "west", FencingToken: 8, TTLSeconds: 3}, want: syscall.SIGKILL},
		"another token":   {lost: leaseapi.Confirmation{Holder: "east", FencingToken: 8, TTLSeconds: 3}, want: syscall.SIGKILL},
		"revoked":         {lost: leaseapi.Confirmation{Holder: "east", FencingToken: 7, Revoked: true, TTLSeconds: 3}, want: syscall.SIGTERM},
		"free (expired)":  {lost: leaseapi.Confirmation{FencingToken: 7, TTLSeconds: 3}, want: syscall.SIGKILL},
		"wrong confirmed": {lost: leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 6, TTLSeconds: 3, RemainingMillis: 3000}, want: syscall.SIGKILL},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(func(n int) (leaseapi.Confirmation, error, bool) {
				if n < 3 {
					return confirmed(3000), nil, false
				}
				return tc.lost, nil, false
			})
			h.start()
			if code := h.exitCode(t, 10*time.Second); code != ExitFenced {
				t.Errorf("exit code %d, want %d", code, ExitFenced)
			}
			child := h.starter.started()
			got := child.received()
			if len(got) == 0 || got[0].sig != tc.want {
				t.Fatalf("signals %v, want %v first", got, tc.want)
			}
			// Confirmed every TTL/6 = 500 ms: the fourth call, at
			// 1.5 s, is the denial.
			if at := got[0].at - child.startedAt; at < 1500*time.Millisecond-harnessStep || at > 1500*time.Millisecond+PollInterval {
				t.Errorf("%v %s after the start, want at the fourth confirmation (1.5 s)", tc.want, at)
			}
			events := []string{EventConfirmationLost, EventChildExited, EventExiting + " code=75"}
			if tc.want == syscall.SIGKILL {
				events = append(events, EventSIGKILL)
			} else {
				events = append(events, EventStopping)
			}
			for _, event := range events {
				if !strings.Contains(h.log.String(), event) {
					t.Errorf("log lacks %q:\n%s", event, h.log)
				}
			}
		})
	}
}

// TestStopsAtTheDeadlineWhenTheLeaseAPIHangs: the confirmer never answers
// after the first confirmation; the child gets SIGTERM at the deadline
// (sent + Validity) and, ignoring it, SIGKILL half a stop budget later.
func TestStopsAtTheDeadlineWhenTheLeaseAPIHangs(t *testing.T) {
	h := newHarness(func(n int) (leaseapi.Confirmation, error, bool) {
		if n == 0 {
			return confirmed(3000), nil, false
		}
		return leaseapi.Confirmation{}, nil, true
	})
	h.starter.ignoreTERM = true
	h.start()
	if code := h.exitCode(t, 10*time.Second); code != ExitFenced {
		t.Errorf("exit code %d, want %d", code, ExitFenced)
	}
	sent := h.conf.calls[0]
	deadline := Deadline(sent, 3000, 3)
	got := h.starter.started().received()
	if len(got) < 2 || got[0].sig != syscall.SIGTERM || got[1].sig != syscall.SIGKILL {
		t.Fatalf("signals %v, want SIGTERM then SIGKILL", got)
	}
	if got[0].at < deadline || got[0].at > deadline+PollInterval {
		t.Errorf("SIGTERM at %s, want at the deadline %s (within %s)", got[0].at, deadline, PollInterval)
	}
	// SIGKILL is due KillDelay after the tick that sent SIGTERM, which ran
	// at the deadline or later; the fake clock may have moved on a step
	// between that tick and SIGTERM's record, so the lower bound is
	// measured from the deadline.
	if kill := got[1].at - deadline; kill < KillDelay(3*time.Second) {
		t.Errorf("SIGKILL %s after the deadline, want %s at least", kill, KillDelay(3*time.Second))
	}
	if kill := got[1].at - got[0].at; kill > KillDelay(3*time.Second)+PollInterval {
		t.Errorf("SIGKILL %s after SIGTERM, want %s (within %s)", kill, KillDelay(3*time.Second), PollInterval)
	}
	if bound := sent + 3000*time.Millisecond*99/100; got[1].at > bound {
		t.Errorf("SIGKILL at %s, after the term's bound %s", got[1].at, bound)
	}
	if !strings.Contains(h.log.String(), EventSIGKILL) || !strings.Contains(h.log.String(), "local deadline passed") {
		t.Errorf("log lacks SIGKILL or the reason:\n%s", h.log)
	}
}

// TestNewestConfirmationWins: each confirmation sets the deadline from its
// own send and remaining time, even when that is earlier than before.
func TestNewestConfirmationWins(t *testing.T) {
	h := newHarness(func(n int) (leaseapi.Confirmation, error, bool) {
		switch {
		case n < 2:
			return confirmed(3000), nil, false
		case n == 2:
			return confirmed(2000), nil, false // the server says less remains
		}
		return leaseapi.Confirmation{}, errUnreachable, false
	})
	h.start()
	if code := h.exitCode(t, 10*time.Second); code != ExitFenced {
		t.Errorf("exit code %d, want %d", code, ExitFenced)
	}
	deadline := Deadline(h.conf.calls[2], 2000, 3)
	got := h.starter.started().received()
	if len(got) == 0 || got[0].at < deadline || got[0].at > deadline+PollInterval {
		t.Errorf("signals %v, want SIGTERM at the third confirmation's deadline %s", got, deadline)
	}
	// Failed calls are retried every max(TTL/30, 200 ms) until then.
	if n := h.conf.count(); n < 4 {
		t.Errorf("%d calls, want retries after the failures", n)
	}
}

func TestExitCodes(t *testing.T) {
	cases := map[string]struct {
		status ExitStatus
		want   int
	}{
		"success":       {status: ExitStatus{Code: 0}, want: 0},
		"failure":       {status: ExitStatus{Code: 3}, want: 3},
		"killed":        {status: ExitStatus{Signal: syscall.SIGKILL}, want: 137},
		"fence code 75": {status: ExitStatus{Code: 75}, want: 75},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(func(int) (leaseapi.Confirmation, error, bool) { return confirmed(3000), nil, false })
			h.start()
			h.step(10*time.Second, func() bool { return h.starter.started() != nil })
			c := h.starter.started()
			c.mu.Lock()
			c.done = true
			c.exited <- tc.status
			c.mu.Unlock()
			if code := h.exitCode(t, time.Second); code != tc.want {
				t.Errorf("exit code %d, want %d", code, tc.want)
			}
			if !strings.Contains(h.log.String(), EventChildExited) {
				t.Errorf("log lacks %q:\n%s", EventChildExited, h.log)
			}
		})
	}
}

func TestSignalsAreForwarded(t *testing.T) {
	h := newHarness(func(int) (leaseapi.Confirmation, error, bool) { return confirmed(3000), nil, false })
	h.start()
	h.step(10*time.Second, func() bool { return h.starter.started() != nil })
	child := h.starter.started()
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGHUP, syscall.SIGTERM} {
		h.signals <- sig
	}
	// The child exits on SIGTERM (143); a kubelet's stop is not a fence.
	if code := h.exitCode(t, 5*time.Second); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
	var got []syscall.Signal
	for _, s := range child.received() {
		got = append(got, s.sig)
	}
	if want := []syscall.Signal{syscall.SIGUSR1, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGKILL}; !slices.Equal(got, want) {
		t.Errorf("child's group received %v, want %v (the last to clear the group at exit)", got, want)
	}
}

func TestSignalBeforeStartExits(t *testing.T) {
	h := newHarness(func(int) (leaseapi.Confirmation, error, bool) {
		return leaseapi.Confirmation{Holder: "west", FencingToken: 9, TTLSeconds: 3}, nil, false
	})
	h.start()
	h.step(time.Second, func() bool { return h.conf.count() > 2 })
	h.signals <- syscall.SIGTERM
	if code := h.exitCode(t, time.Second); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
	if h.starter.started() != nil {
		t.Error("child started without a confirmation")
	}
}

func TestStartFailure(t *testing.T) {
	h := newHarness(func(int) (leaseapi.Confirmation, error, bool) { return confirmed(3000), nil, false })
	h.starter.err = &StartError{Code: 127, Err: errors.New("start nope: executable file not found in $PATH")}
	h.start()
	if code := h.exitCode(t, 5*time.Second); code != 127 {
		t.Errorf("exit code %d, want 127", code)
	}
	if !strings.Contains(h.log.String(), EventStartFailed) {
		t.Errorf("log lacks %q:\n%s", EventStartFailed, h.log)
	}
}

func TestChildEnv(t *testing.T) {
	got := ChildEnv([]string{"A=1", "BERTH_FENCE_HOLDER_FILE=/x", "BERTH_LEASE_API_CA=-----BEGIN", "BERTH_HOLDER=old", "BERTH_LEASE_NAME=exporter", "BERTH_FENCING_TOKEN=1"}, "east", 12)
	want := []string{"A=1", "BERTH_LEASE_NAME=exporter", "BERTH_FENCING_TOKEN=12", "BERTH_HOLDER=east"}
	if !slices.Equal(got, want) {
		t.Errorf("ChildEnv = %q, want %q", got, want)
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		EnvLeaseAPIURL: "https://leases:8443", EnvLeaseNamespace: "shop", EnvLeaseName: "exporter",
		EnvTokenFile: "/t", EnvHolderFile: "/h", EnvFencingTokenFile: "/f",
	}
	c, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil || c.URL != "https://leases:8443" || c.TokenOfPodFile != "/f" {
		t.Errorf("ConfigFromEnv = %+v, %v", c, err)
	}
	delete(env, EnvLeaseName)
	delete(env, EnvTokenFile)
	if _, err := ConfigFromEnv(func(k string) string { return env[k] }); !errors.Is(err, ErrConfig) ||
		!strings.Contains(err.Error(), EnvLeaseName) || !strings.Contains(err.Error(), EnvTokenFile) {
		t.Errorf("missing variables: error %v, want ErrConfig naming both", err)
	}
}

// TestOnce: for an exec probe or a lifecycle hook, berth-fence asks once.
// Confirmed, the command runs and its exit code is the fence's; its term
// unreadable, the lease API unreachable, or the term not confirmed, the
// command never starts and the fence exits ExitFenced at once, without
// waiting out the probe's or the hook's time.
func TestOnce(t *testing.T) {
	unreachable := func(int) (leaseapi.Confirmation, error, bool) { return leaseapi.Confirmation{}, errUnreachable, false }
	cases := map[string]struct {
		answer         func(n int) (leaseapi.Confirmation, error, bool)
		noIdentity     bool
		wantCode       int
		wantStarted    bool
		wantCalls      int
		wantLogMessage string
	}{
		"confirmed: runs": {
			answer:   func(int) (leaseapi.Confirmation, error, bool) { return confirmed(3000), nil, false },
			wantCode: 0, wantStarted: true, wantCalls: 1,
		},
		"another holder: never runs": {
			answer: func(int) (leaseapi.Confirmation, error, bool) {
				return leaseapi.Confirmation{Holder: "west", FencingToken: 8, TTLSeconds: 3}, nil, false
			},
			wantCode: ExitFenced, wantCalls: 1, wantLogMessage: `held by holder \"west\"`,
		},
		"lease API unreachable: never runs": {answer: unreachable, wantCode: ExitFenced, wantCalls: 1},
		"term not readable: never asks": {
			answer: unreachable, noIdentity: true, wantCode: ExitFenced, wantCalls: 0,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(tc.answer)
			h.once = true
			if tc.noIdentity {
				h.identity.failures = 1
			}
			h.start()
			if tc.wantStarted {
				if !h.step(time.Second, func() bool { return h.starter.started() != nil }) {
					t.Fatalf("never started; log:\n%s", h.log)
				}
				h.starter.started().exit(0)
			}
			if code := h.exitCode(t, time.Second); code != tc.wantCode {
				t.Errorf("exit code %d, want %d; log:\n%s", code, tc.wantCode, h.log)
			}
			if started := h.starter.started() != nil; started != tc.wantStarted {
				t.Errorf("child started %v, want %v", started, tc.wantStarted)
			}
			if n := h.conf.count(); n != tc.wantCalls {
				t.Errorf("%d confirmation calls, want %d", n, tc.wantCalls)
			}
			if !strings.Contains(h.log.String(), tc.wantLogMessage) {
				t.Errorf("log lacks %q:\n%s", tc.wantLogMessage, h.log)
			}
		})
	}
}
