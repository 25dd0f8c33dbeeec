package kubeenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopGrace is how long a process may take to exit after SIGTERM before it gets SIGKILL.
const stopGrace = 5 * time.Second

// process is one running control-plane binary whose output goes to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and been reaped
	err     error         // why it exited; read only after done is closed
}

// startProcess starts bin in its own process group, so that stop reaches anything it
// forks, with SIGKILL as its parent-death signal, so that it dies with this process even
// when this process is killed (`go test -timeout`, a panic, SIGKILL). The parent-death
// signal follows the OS thread that started the child; the Go runtime does not end its
// threads while the program runs unless a goroutine exits locked to one, which kubeenv
// and its callers do not do.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes an unexpected exit with the end of the process's log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited (%v); end of %s:\n%s", p.name, p.err, p.logPath, logTail(p.logPath, 15))
}

// stop sends SIGTERM to the process group, and SIGKILL once stopGrace or ctx runs out.
// It returns once the process has been reaped.
func (p *process) stop(ctx context.Context) {
	if p.exited() {
		return
	}
	pgid := -p.pid()
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	timer := time.NewTimer(stopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
		return
	case <-timer.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	<-p.done
}

// logTail returns the last n lines of the file at path, or why it cannot.
func logTail(path string, n int) string {
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
