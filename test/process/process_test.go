package process_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/test/process"
)

func TestLogAndKill(t *testing.T) {
	p := process.StartForTest(t, "sh", "/bin/sh", "-c", `echo plain line; echo '{"level":"INFO","msg":"serving","address":"127.0.0.1:1"}'; exec sleep 60`)
	line, err := p.AwaitLogged(t.Context(), 10*time.Second, "serving")
	if err != nil {
		t.Fatal(err)
	}
	if got := line.String("address"); got != "127.0.0.1:1" {
		t.Errorf("address %q, want 127.0.0.1:1", got)
	}
	if !p.LogContains("plain line") || !strings.HasPrefix(p.LogTail(2), "plain line") {
		t.Errorf("log tail %q, want the plain line first", p.LogTail(2))
	}
	if p.Exited() {
		t.Fatal("exited before it was killed")
	}
	p.Kill()
	if !p.Exited() {
		t.Fatal("still running after Kill")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("signal after exit: %v, want nil", err)
	}
}

func TestAwaitLoggedFailsWhenTheProcessExits(t *testing.T) {
	p := process.StartForTest(t, "sh", "/bin/sh", "-c", "echo bye; exit 3")
	_, err := p.AwaitLogged(t.Context(), 10*time.Second, "serving")
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "bye") {
		t.Fatalf("error %v, want the exit and the end of the log", err)
	}
}

func TestStopEndsWithSIGTERM(t *testing.T) {
	p := process.StartForTest(t, "sleep", "/bin/sleep", "60")
	start := time.Now()
	p.Stop(t.Context())
	if err := p.Wait(); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Errorf("exit %v, want terminated by SIGTERM", err)
	}
	if took := time.Since(start); took > process.StopGrace {
		t.Errorf("stop took %s, want well within the grace of %s", took, process.StopGrace)
	}
}
