// Command demo shows Berth's lease API at work on this machine: it starts
// berth-leaseapi with its defaults, has two holders contend for one lease,
// stops the holder's renewals as if it had died, and shows the other taking
// over with a higher fencing token. It finishes by itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berthfleet/berth/leaseapi/client"
)

const (
	namespace = "payments"
	name      = "billing-exporter"
	ttl       = 3 * time.Second
	heartbeat = 500 * time.Millisecond
	apiURL    = "http://127.0.0.1:8443"
)

func main() {
	bin := flag.String("bin", "bin", "folder with the berth binaries")
	flag.Parse()
	if err := run(*bin); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

var start = time.Now()

func say(format string, args ...any) {
	fmt.Printf("[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

func run(bin string) error {
	binary, err := filepath.Abs(filepath.Join(bin, "berth-leaseapi"))
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "berth-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	say("starting berth-leaseapi with its defaults (listen 127.0.0.1:8443, store ./berth-leases.db in %s)", dir)
	logFile, err := os.Create(filepath.Join(dir, "berth-leaseapi.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	server := exec.Command(binary)
	server.Dir = dir
	server.Stdout, server.Stderr = logFile, logFile
	server.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := server.Start(); err != nil {
		return fmt.Errorf("start berth-leaseapi: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- server.Wait() }()
	defer func() {
		_ = server.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			say("berth-leaseapi stopped")
		case <-time.After(10 * time.Second):
			_ = server.Process.Kill()
		}
	}()

	c, err := client.New(client.Config{URL: apiURL, Timeout: 2 * time.Second})
	if err != nil {
		return err
	}
	if err := waitReady(c, exited, logFile.Name()); err != nil {
		return err
	}
	say("lease API ready at %s", apiURL)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastCtx, eastDies := context.WithCancel(ctx)
	eastFirst, westTook := make(chan int32, 1), make(chan int32, 1)
	go contend(eastCtx, c, "east", eastFirst)
	first := <-eastFirst
	go contend(ctx, c, "west", westTook)

	time.Sleep(2 * time.Second)
	say("east stops renewing, as if its cluster died; its lease runs out in at most %s", ttl)
	eastDies()
	stopped := time.Now()

	var second int32
	select {
	case second = <-westTook:
	case <-ctx.Done():
		return errors.New("west never took the lease over")
	}
	say("west took over %.1fs after east stopped, with fencing token %d (east had %d)", time.Since(stopped).Seconds(), second, first)
	if second <= first {
		return fmt.Errorf("fencing token went from %d to %d; it must grow", first, second)
	}
	l, err := c.GetLease(ctx, namespace, name)
	if err != nil {
		return err
	}
	say("GET %s/%s: holder=%s fencingToken=%d expiresAt=%s", l.Namespace, l.Name, l.Holder, l.FencingToken, l.ExpiresAt.Format(time.RFC3339))
	time.Sleep(heartbeat)
	cancel()
	return nil
}

// contend acquires the lease for holder every heartbeat until ctx ends,
// reporting each change it sees and sending its first grant on took.
func contend(ctx context.Context, c *client.Client, holder string, took chan<- int32) {
	var last string
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for {
		res, err := c.Acquire(ctx, namespace, name, holder, ttl)
		var line string
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			line = fmt.Sprintf("%s: lease API error: %v", holder, err)
		case res.Acquired:
			line = fmt.Sprintf("%s: holds %s/%s with fencing token %d", holder, namespace, name, res.FencingToken)
			select {
			case took <- res.FencingToken:
			default:
			}
		default:
			line = fmt.Sprintf("%s: waiting; held by %s (token %d) until %s", holder, res.Holder, res.FencingToken, res.ExpiresAt.Format("15:04:05.0"))
		}
		if line != last {
			say("%s", line)
			last = line
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func waitReady(c *client.Client, exited <-chan error, logPath string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("berth-leaseapi exited (%v); is port 8443 in use?\n%s", err, tail(log))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ready(ctx)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("berth-leaseapi did not become ready within 15s")
}

func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
