package localfleet

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// Process is a child process whose output goes to a log file. It dies with
// the process that started it, and Kill ends its whole process group.
type Process struct {
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProcess runs binary with args, logging to logPath.
func StartProcess(binary, logPath string, args ...string) (*Process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	p := &Process{Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Kill ends the process (SIGKILL, as a crash would) and waits for it.
func (p *Process) Kill() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Signal sends sig to the process's group, unless it has ended: SIGSTOP
// freezes it (as a long GC pause or a stalled node would) and SIGCONT thaws it.
func (p *Process) Signal(sig syscall.Signal) error {
	if p == nil || p.Exited() {
		return nil
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// LogContains reports whether the process's log contains s.
func (p *Process) LogContains(s string) bool {
	b, _ := os.ReadFile(p.Log)
	return strings.Contains(string(b), s)
}

// LogTail returns the last lines of the process's log.
func (p *Process) LogTail(lines int) string {
	b, _ := os.ReadFile(p.Log)
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
