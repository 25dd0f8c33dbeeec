package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/fence"
	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/leaseapi/satoken/satokentest"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/poll"
)

func TestMain(m *testing.M) { binaries.Main(m, "berth-fence") }

// fleet is a real lease API over TLS, the agent's client of cluster east,
// and the files a fenced Pod of lease payments/exporter reads: its projected
// service account token and its identity annotations.
type fleet struct {
	api                            *leaseapitest.Server
	agent                          *client.Client
	dir                            string
	tokenFile, holderFile, fenFile string
	ca                             string
}

var exporter = leaseapi.Key{Namespace: "payments", Name: "exporter"}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	key := satokentest.NewRSA(t, "east-1")
	keysDir := t.TempDir()
	satokentest.WriteJWKS(t, keysDir, "east", key)
	api := leaseapitest.Start(t, leaseapitest.Options{Tokens: map[string]string{"east": "token-of-east"}, ServiceAccountKeysDir: keysDir, TLS: true})
	f := &fleet{api: api, agent: api.Client(t, client.Config{TokenFile: api.TokenFiles["east"]}), dir: t.TempDir()}
	f.tokenFile = filepath.Join(f.dir, "token")
	f.holderFile = filepath.Join(f.dir, "holder")
	f.fenFile = filepath.Join(f.dir, "fencing-token")
	writeFile(t, f.tokenFile, key.Sign(t, satokentest.PodClaims(exporter, "exporter-0", time.Now())))
	ca, err := os.ReadFile(api.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	f.ca = string(ca)
	return f
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// acquire takes the lease for east and writes the Pod's identity files.
func (f *fleet) acquire(t *testing.T, ttl time.Duration) client.AcquireResult {
	t.Helper()
	res, err := f.agent.Acquire(t.Context(), exporter.Namespace, exporter.Name, "east", ttl)
	if err != nil || !res.Acquired {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	writeFile(t, f.holderFile, "east")
	writeFile(t, f.fenFile, strconv.Itoa(int(res.FencingToken)))
	return res
}

// fenced is one berth-fence exec process.
type fenced struct {
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
	err    error
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

func (f *fleet) run(t *testing.T, child ...string) *fenced {
	t.Helper()
	return f.start(t, append([]string{"exec", "--"}, child...)...)
}

// start runs berth-fence with args in the fleet's Pod environment.
func (f *fleet) start(t *testing.T, args ...string) *fenced {
	t.Helper()
	p := &fenced{done: make(chan struct{})}
	p.cmd = exec.Command(binaries.Path("berth-fence"), args...)
	p.cmd.Env = append(os.Environ(),
		"BERTH_LEASE_API_URL="+f.api.URL, "BERTH_LEASE_API_CA="+f.ca,
		"BERTH_LEASE_NAMESPACE="+exporter.Namespace, "BERTH_LEASE_NAME="+exporter.Name,
		"BERTH_FENCE_TOKEN_FILE="+f.tokenFile, "BERTH_FENCE_HOLDER_FILE="+f.holderFile,
		"BERTH_FENCE_FENCING_TOKEN_FILE="+f.fenFile)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		t.Logf("berth-fence's log:\n%s", p.stderr.String())
	})
	return p
}

// exitCode waits for berth-fence to exit.
func (p *fenced) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("berth-fence still running after %s:\n%s", timeout, p.stderr.String())
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) {
		return exit.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

// event finds the first log line of event and returns its time and fields.
func (p *fenced) event(t *testing.T, event string) (time.Time, string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), fence.LogPrefix+" ")
		if !ok {
			continue
		}
		stamp, text, _ := strings.Cut(rest, " ")
		if !strings.HasPrefix(text, event) {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		return at, text
	}
	t.Fatalf("no %q line in berth-fence's log:\n%s", event, p.stderr.String())
	return time.Time{}, ""
}

// TestExecRunsTheChildUnderItsTerm: the child starts only once the
// identity files are written and the term confirmed, sees the fencing
// token and holder but none of berth-fence's variables, and its exit code
// is berth-fence's.
func TestExecRunsTheChildUnderItsTerm(t *testing.T) {
	f := newFleet(t)
	writeFile(t, f.holderFile, "")
	p := f.run(t, "/bin/sh", "-c", `echo "token=$BERTH_FENCING_TOKEN holder=$BERTH_HOLDER fence=$(env | grep -c -e ^BERTH_FENCE_ -e ^BERTH_LEASE_API_CA)"; exit 3`)
	poll.For(t, 5*time.Second, "berth-fence waits for its identity", func() bool {
		return strings.Contains(p.stderr.String(), fence.EventWaitingIdentity)
	})
	res := f.acquire(t, 30*time.Second)
	if code := p.exitCode(t, 10*time.Second); code != 3 {
		t.Errorf("exit code %d, want the child's 3", code)
	}
	want := "token=" + strconv.Itoa(int(res.FencingToken)) + " holder=east fence=0\n"
	if got := p.stdout.String(); got != want {
		t.Errorf("child printed %q, want %q", got, want)
	}
	confirmedAt, _ := p.event(t, fence.EventConfirmed)
	startedAt, _ := p.event(t, fence.EventChildStarted)
	if startedAt.Before(confirmedAt) {
		t.Errorf("child started at %s, before the confirmation at %s", startedAt, confirmedAt)
	}
	if _, line := p.event(t, fence.EventChildExited); !strings.Contains(line, "code=3") {
		t.Errorf("child exited line %q, want code=3", line)
	}
}

// TestExecOnce: an exec probe's or a lifecycle hook's berth-fence asks
// once. Under another term it exits 75 at once without running its command;
// under its own term it runs it and passes its exit code on.
func TestExecOnce(t *testing.T) {
	f := newFleet(t)
	res := f.acquire(t, 30*time.Second)
	writeFile(t, f.fenFile, strconv.Itoa(int(res.FencingToken)+1))
	p := f.start(t, "exec", "--once", "--", "/bin/sh", "-c", "echo ran")
	if code := p.exitCode(t, 5*time.Second); code != fence.ExitFenced {
		t.Errorf("another term: exit code %d, want %d", code, fence.ExitFenced)
	}
	if p.stdout.String() != "" {
		t.Errorf("another term: the command ran: %q", p.stdout.String())
	}
	writeFile(t, f.fenFile, strconv.Itoa(int(res.FencingToken)))
	p = f.start(t, "exec", "--once", "--", "/bin/sh", "-c", "echo ran; exit 4")
	if code := p.exitCode(t, 5*time.Second); code != 4 {
		t.Errorf("own term: exit code %d, want the command's 4", code)
	}
	if got := p.stdout.String(); got != "ran\n" {
		t.Errorf("own term: the command printed %q, want \"ran\\n\"", got)
	}
}

// TestExecWaitsForItsOwnToken: a Pod of an older term never starts its
// child; a kubelet's SIGTERM then ends berth-fence.
func TestExecWaitsForItsOwnToken(t *testing.T) {
	f := newFleet(t)
	res := f.acquire(t, 30*time.Second)
	writeFile(t, f.fenFile, strconv.Itoa(int(res.FencingToken)+1))
	p := f.run(t, "/bin/sh", "-c", "echo started")
	poll.For(t, 5*time.Second, "berth-fence waits for a confirmation", func() bool {
		return strings.Contains(p.stderr.String(), fence.EventWaiting)
	})
	time.Sleep(time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, 5*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit code %d, want 143", code)
	}
	if p.stdout.String() != "" {
		t.Errorf("the child ran: %q", p.stdout.String())
	}
}

// TestExecKillsAChildThatIgnoresSIGTERM: the term is not renewed, so the
// fence's deadline passes; the child ignores SIGTERM (as does its own
// child, sleep), so berth-fence SIGKILLs the group, before the term's
// expiry at the lease API, and exits 75.
func TestExecKillsAChildThatIgnoresSIGTERM(t *testing.T) {
	f := newFleet(t)
	res := f.acquire(t, 3*time.Second)
	p := f.run(t, "/bin/sh", "-c", `trap "" TERM; echo $$; sleep 60`)
	if code := p.exitCode(t, 10*time.Second); code != fence.ExitFenced {
		t.Errorf("exit code %d, want %d", code, fence.ExitFenced)
	}
	termAt, _ := p.event(t, fence.EventStopping)
	killAt, _ := p.event(t, fence.EventSIGKILL)
	exitAt, line := p.event(t, fence.EventChildExited)
	if !strings.Contains(line, "signal=SIGKILL") {
		t.Errorf("child exited line %q, want killed by SIGKILL", line)
	}
	// The log's times are the wall clock's, the delay the boot clock's.
	if d := killAt.Sub(termAt); d < fence.KillDelay(3*time.Second)-10*time.Millisecond {
		t.Errorf("SIGKILL %s after SIGTERM, want at least %s", d, fence.KillDelay(3*time.Second))
	}
	// Both clocks are this machine's: the child is dead before the term
	// could end at the lease API.
	t.Logf("child dead %s before the term's expiry at the lease API", res.ExpiresAt.Sub(exitAt))
	if !exitAt.Before(res.ExpiresAt) {
		t.Errorf("child exited at %s, not before the term's expiry %s", exitAt, res.ExpiresAt)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(p.stdout.String()))
	if err != nil {
		t.Fatalf("child printed %q, want its pid", p.stdout.String())
	}
	// Killed with the group, sleep is reaped by whoever inherited it.
	poll.For(t, 5*time.Second, "the child's process group is gone", func() bool {
		return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
	})
}

// TestExecStopsOnRelease: the term is released at the lease API; the next
// confirmation (every TTL/6) denies it and the child is stopped at once.
func TestExecStopsOnRelease(t *testing.T) {
	f := newFleet(t)
	res := f.acquire(t, 6*time.Second)
	p := f.run(t, "/bin/sh", "-c", `echo started; exec sleep 60`)
	poll.For(t, 5*time.Second, "child started", func() bool { return strings.Contains(p.stdout.String(), "started") })
	if err := f.agent.Release(t.Context(), exporter.Namespace, exporter.Name, "east", res.FencingToken); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if code := p.exitCode(t, 10*time.Second); code != fence.ExitFenced {
		t.Errorf("exit code %d, want %d", code, fence.ExitFenced)
	}
	_, line := p.event(t, fence.EventConfirmationLost)
	if !strings.Contains(line, "lease free") {
		t.Errorf("confirmation lost line %q, want the lease free", line)
	}
	exitAt, _ := p.event(t, fence.EventChildExited)
	if d := exitAt.Sub(released); d > fence.ConfirmInterval(6*time.Second)+time.Second {
		t.Errorf("child exited %s after the release, want within a confirmation interval", d)
	}
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command(binaries.Path("berth-fence"), "install", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), fence.LogPrefix) || !strings.Contains(string(out), fence.EventInstalled) || strings.Count(string(out), "\n") != 1 {
		t.Errorf("install printed %q, want one %q line", out, fence.EventInstalled)
	}
	installed := filepath.Join(dir, "berth-fence")
	fi, err := os.Stat(installed)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("installed mode %o, want 755", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("install left %d files in the folder, want 1", len(entries))
	}
	v, err := exec.Command(installed, "--version").Output()
	if err != nil || !strings.HasPrefix(string(v), "berth-fence ") {
		t.Errorf("installed copy --version: %q, %v", v, err)
	}
}

func TestUsage(t *testing.T) {
	cases := map[string]struct {
		args     []string
		wantCode int
	}{
		"no command":      {args: nil, wantCode: fence.ExitUsage},
		"unknown command": {args: []string{"run"}, wantCode: fence.ExitUsage},
		"exec without":    {args: []string{"exec", "--"}, wantCode: fence.ExitUsage},
		"install without": {args: []string{"install"}, wantCode: fence.ExitUsage},
		"version":         {args: []string{"--version"}, wantCode: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(tc.args, &out, &errOut); code != tc.wantCode {
				t.Errorf("run(%q) = %d, want %d; stderr %q", tc.args, code, tc.wantCode, errOut.String())
			}
		})
	}
}

func TestExecWithoutConfiguration(t *testing.T) {
	cmd := exec.Command(binaries.Path("berth-fence"), "exec", "--", "/bin/true")
	cmd.Env = []string{"PATH=/bin"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != fence.ExitConfig {
		t.Fatalf("exec without its environment: %v, want exit %d\n%s", err, fence.ExitConfig, out)
	}
	if !strings.Contains(string(out), "BERTH_LEASE_API_URL") {
		t.Errorf("output %q does not name the missing variable", out)
	}
}

// TestExecChildDiesWithTheFence: berth-fence killed outright (SIGKILL, the OOM killer)
// takes its workload with it, even where it is not a container's PID 1 whose end ends
// the rest.
func TestExecChildDiesWithTheFence(t *testing.T) {
	f := newFleet(t)
	f.acquire(t, 30*time.Second)
	p := f.run(t, "/bin/sh", "-c", `echo $$; trap "" TERM; while :; do sleep 0.05; done`)
	poll.For(t, 10*time.Second, "the child runs", func() bool { return strings.TrimSpace(p.stdout.String()) != "" })
	child, err := strconv.Atoi(strings.TrimSpace(p.stdout.String()))
	if err != nil {
		t.Fatalf("child printed %q, want its pid", p.stdout.String())
	}
	// Should it outlive the fence, it holds the fence's output open: end it after the
	// judgement, before the fence's own cleanup waits for that output.
	t.Cleanup(func() { _ = syscall.Kill(-child, syscall.SIGKILL) })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 5*time.Second, "the child is gone with its fence", func() bool {
		return errors.Is(syscall.Kill(child, 0), syscall.ESRCH) || zombie(child)
	})
}

// zombie reports whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}
