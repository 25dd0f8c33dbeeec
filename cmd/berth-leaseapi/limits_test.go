package main_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthfleet/berth/test/binaries"
)

// TestStalledBodiesAreClosed runs the real binary with a short
// --body-read-timeout, stalls connections after their headers, and checks
// that each is answered 408 and closed while a holder acquires and renews.
func TestStalledBodiesAreClosed(t *testing.T) {
	const (
		bound = time.Second
		conns = 16
	)
	p := start(t, "--sqlite-path", filepath.Join(t.TempDir(), "leases.db"), "--body-read-timeout", bound.String())
	stalled := make([]net.Conn, conns)
	for i := range stalled {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, "POST /v1alpha1/namespaces/team/leases/x/acquire HTTP/1.1\r\nHost: berth\r\nContent-Length: 64\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		stalled[i] = c
	}
	start := time.Now()

	c := p.client(t)
	a, err := c.Acquire(t.Context(), "team", "exporter", "east", 30*time.Second)
	if err != nil || !a.Acquired {
		t.Fatalf("acquire beside stalled connections: %+v, %v", a, err)
	}
	if r, err := c.Renew(t.Context(), "team", "exporter", "east", a.FencingToken, 30*time.Second); err != nil || !r.Acquired {
		t.Fatalf("renew beside stalled connections: %+v, %v", r, err)
	}

	for i, conn := range stalled {
		_ = conn.SetReadDeadline(start.Add(bound + 10*time.Second))
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("connection %d: no answer: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusRequestTimeout {
			t.Errorf("connection %d: status %d, want 408", i, res.StatusCode)
		}
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("connection %d: not closed after the answer: %v", i, err)
		}
	}
	t.Logf("%d stalled connections answered 408 and closed within %s (bound %s)", conns, time.Since(start), bound)
}

func TestLimitsMustBePositive(t *testing.T) {
	for _, flag := range []string{"--read-header-timeout", "--body-read-timeout", "--idle-timeout", "--max-header-bytes",
		"--max-watches", "--max-watches-per-subject", "--watch-max-duration"} {
		t.Run(flag, func(t *testing.T) {
			out, err := exec.Command(binaries.Path("berth-leaseapi"), "--listen", "127.0.0.1:0", "--metrics-listen", "",
				"--sqlite-path", filepath.Join(t.TempDir(), "x.db"), flag+"=0").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "must be positive") {
				t.Fatalf("%s=0: %v, %s; want refused as not positive", flag, err, out)
			}
		})
	}
}
