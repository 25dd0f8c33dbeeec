package fence

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExitStatus is how the child ended: its exit code, or the signal that
// killed it.
type ExitStatus struct {
	Code   int
	Signal syscall.Signal
}

// ExitCode is the status as a shell reports it: the code, or 128 + the
// signal's number.
func (s ExitStatus) ExitCode() int {
	if s.Signal != 0 {
		return 128 + int(s.Signal)
	}
	return s.Code
}

// Child is the workload as the supervisor sees it.
type Child interface {
	// Pid is the child's process id, which is also its process group's id.
	Pid() int
	// Signal sends sig to the child's whole process group. A group that is
	// gone is not an error.
	Signal(sig syscall.Signal) error
	// Exited delivers the child's status once, when it has ended.
	Exited() <-chan ExitStatus
}

// Starter starts the child with an environment.
type Starter interface {
	Start(env []string) (Child, error)
}

// StartError is a child that could not be started; Code is the exit code a
// shell uses for it (127 not found, 126 not executable).
type StartError struct {
	Code int
	Err  error
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// ProcessStarter starts a command in its own process group, with the
// fence's standard streams, and reaps: one goroutine waits for any child
// (wait4(-1)), so that orphans reparented to the fence when it is a
// container's PID 1 do not stay zombies, and reports the main child's
// status when it comes.
type ProcessStarter struct {
	Path string
	Args []string
}

var _ Starter = ProcessStarter{}

// Start starts the command.
func (p ProcessStarter) Start(env []string) (Child, error) {
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if isTerminal(0) {
		// An interactive container (tty: true): the child's group takes
		// the terminal, as a shell's foreground job does, and the fence,
		// now in the background, ignores the terminal's stop signals.
		cmd.SysProcAttr.Foreground, cmd.SysProcAttr.Ctty = true, 0
		signal.Ignore(syscall.SIGTTOU, syscall.SIGTTIN)
	}
	// The child dies with the fence (SIGKILL), should the fence itself be killed: a
	// workload must never outlive its fence, even where the fence is not the
	// container's PID 1 (a shared process namespace). The parent-death signal
	// follows the thread that started the child, so that thread is locked and kept
	// for the process's life: the goroutine never returns.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		started <- cmd.Start()
		select {}
	}()
	if err := <-started; err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return nil, &StartError{Code: code, Err: fmt.Errorf("start %s: %w", p.Path, err)}
	}
	c := &processChild{pid: cmd.Process.Pid, proc: cmd.Process, exited: make(chan ExitStatus, 1)}
	go c.reap()
	return c, nil
}

type processChild struct {
	// pid is the child's and its group's id, kept apart from proc, which
	// forgets it once released.
	pid    int
	proc   *os.Process
	exited chan ExitStatus
}

func (c *processChild) Pid() int                  { return c.pid }
func (c *processChild) Exited() <-chan ExitStatus { return c.exited }

func (c *processChild) Signal(sig syscall.Signal) error {
	if c.pid <= 1 {
		return fmt.Errorf("signal process group %d: not a child's group", c.pid)
	}
	if err := syscall.Kill(-c.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", c.pid, err)
	}
	return nil
}

// reap waits for every child of the process until none is left, and
// reports the main child's status.
func (c *processChild) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing left to wait for. The main child was
			// reaped before (it is the last to go while the group is
			// ours), or never existed.
			return
		}
		if pid != c.pid {
			continue
		}
		_ = c.proc.Release()
		st := ExitStatus{Code: ws.ExitStatus()}
		if ws.Signaled() {
			st = ExitStatus{Signal: ws.Signal()}
		}
		c.exited <- st
	}
}

func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}
