// Package process runs the binaries that tests and test environments start
// (control-plane components, berth-leaseapi, berth-agent) as child processes
// whose output goes to a log file, and reads those logs back: their tails for
// failure reports, a string a test looks for, or the JSON lines a Berth binary
// logs. It does not build binaries (test/binaries does) or know their flags.
//
// Every process runs in its own process group, so that Kill, Stop and Signal
// reach anything it forks, with SIGKILL as its parent-death signal, so that it
// dies with the test even when the test is killed (`go test -timeout`, a panic,
// SIGKILL). The parent-death signal follows the OS thread that started the
// child; the Go runtime does not end its threads while the program runs unless
// a goroutine exits locked to one, which callers of this package do not do.
package process

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/test/poll"
)

// StopGrace is how long a process may take to exit after SIGTERM before Stop
// sends SIGKILL.
const StopGrace = 5 * time.Second

// Process is one running child process whose output goes to a log file.
type Process struct {
	// Name names the process in errors.
	Name string
	// Log is the path of the process's log (stdout and stderr).
	Log  string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // why it exited; read only after done is closed
}

// Start runs binary with args, appending its output to the file at logPath.
func Start(name, binary, logPath string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// StartForTest is Start with the log in a folder of the test's, failing the
// test if the process does not start and killing it when the test ends.
func StartForTest(t testing.TB, name, binary string, args ...string) *Process {
	t.Helper()
	p, err := Start(name, binary, filepath.Join(t.TempDir(), name+".log"), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// Pid is the process's ID (and that of its process group).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits until the process has exited and returns why it did (nil for a
// clean exit).
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// ExitError describes an unexpected exit with the end of the process's log.
// Call it once Exited reports true.
func (p *Process) ExitError() error {
	return fmt.Errorf("%s exited (%v); end of %s:\n%s", p.Name, p.err, p.Log, LogTail(p.Log, 15))
}

// Signal sends sig to the process's group, unless it has exited: SIGSTOP
// freezes it (as a long GC pause or a stalled node would) and SIGCONT thaws it.
func (p *Process) Signal(sig syscall.Signal) error {
	if p == nil || p.Exited() {
		return nil
	}
	return syscall.Kill(-p.Pid(), sig)
}

// Kill ends the process group with SIGKILL, as a crash would, and waits until
// the process has been reaped.
func (p *Process) Kill() {
	if p == nil || p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM to the process group, and SIGKILL once StopGrace or ctx
// runs out. It returns once the process has been reaped.
func (p *Process) Stop(ctx context.Context) {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	timer := time.NewTimer(StopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
		return
	case <-timer.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// LogContains reports whether the process's log contains s.
func (p *Process) LogContains(s string) bool {
	b, _ := os.ReadFile(p.Log)
	return bytes.Contains(b, []byte(s))
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string { return LogTail(p.Log, n) }

// LogTail returns the last n lines of the file at path, or why it cannot.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Line is one JSON line of a log, as Berth's binaries write them
// (`{"level":"INFO","msg":"...","key":"value",...}`).
type Line map[string]any

// String returns the line's value at key as a string ("" when absent).
func (l Line) String(key string) string {
	s, _ := l[key].(string)
	return s
}

// Logged returns the JSON lines of the process's log whose msg is msg, in
// order; lines that are not JSON are skipped.
func (p *Process) Logged(msg string) []Line {
	f, err := os.Open(p.Log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []Line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), []byte(msg)) {
			continue
		}
		var l Line
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.String("msg") == msg {
			out = append(out, l)
		}
	}
	return out
}

// AwaitLogged waits until the process logs a JSON line whose msg is msg and
// returns the first such line. It gives up when the process exits first, ctx
// ends or timeout passes.
func (p *Process) AwaitLogged(ctx context.Context, timeout time.Duration, msg string) (Line, error) {
	var found Line
	_, err := poll.Until(ctx, timeout, fmt.Sprintf("%s logs %q", p.Name, msg), func(context.Context) (bool, error) {
		if lines := p.Logged(msg); len(lines) > 0 {
			found = lines[0]
			return true, nil
		}
		if p.Exited() {
			if lines := p.Logged(msg); len(lines) > 0 { // logged, then exited
				found = lines[0]
				return true, nil
			}
			return false, p.ExitError()
		}
		return false, nil
	})
	return found, err
}

// LogLines returns the lines of the process's log that contain s.
func (p *Process) LogLines(s string) []string {
	b, _ := os.ReadFile(p.Log)
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}
