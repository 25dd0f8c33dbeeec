package main_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/test/pgtest"
)

// TestWatchAcrossPostgresReplicas runs two berth-leaseapi replicas on one
// PostgreSQL database: a watch held by replica B is sent the changes made
// through replica A (the store's change feed, read back by B), and no
// renewal.
func TestWatchAcrossPostgresReplicas(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	a := start(t, "--store", "postgres", "--postgres-dsn", dsn)
	b := start(t, "--store", "postgres", "--postgres-dsn", dsn)
	ca := a.client(t)
	ctx, cancel := context.WithCancel(t.Context())
	changes := make(chan string, 64)
	done := make(chan error, 1)
	go func() {
		done <- b.client(t).WatchLeases(ctx, []string{"replicas"}, func(e client.LeaseEvent) {
			if e.Reset {
				changes <- "RESET"
				return
			}
			changes <- fmt.Sprintf("%s %s#%d", e.Lease.Name, e.Lease.Holder, e.Lease.FencingToken)
		}, nil)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchLeases at B: %v", err)
		}
	})
	// next is the next change of lease name, past the resets of B's feed
	// (re)starting and the changes of other leases.
	next := func(name string, within time.Duration) (string, time.Duration, bool) {
		t.Helper()
		start := time.Now()
		timeout := time.After(within)
		for {
			select {
			case c := <-changes:
				if c != "RESET" && strings.HasPrefix(c, name+" ") {
					return c, time.Since(start), true
				}
			case <-timeout:
				return "", time.Since(start), false
			}
		}
	}
	if c := <-changes; c != "RESET" {
		t.Fatalf("first event %q, want a reset", c)
	}
	// B starts listening to the store's change feed in the background, so a
	// change made before that reaches B's watchers only as a reset (which
	// tells them to read again). Change a lease of its own through A until B
	// sends the change itself: from then on B's feed is live.
	warm := false
	for i := 0; i < 20 && !warm; i++ {
		w, err := ca.Acquire(ctx, "replicas", "warm-up", "east", time.Minute)
		if err != nil || !w.Acquired {
			t.Fatalf("acquire warm-up through A: %+v, %v", w, err)
		}
		_, _, warm = next("warm-up", time.Second)
		if err := ca.Release(ctx, "replicas", "warm-up", "east", w.FencingToken); err != nil {
			t.Fatal(err)
		}
	}
	if !warm {
		t.Fatal("replica B sent no change made through A within 20 tries")
	}

	held, err := ca.Acquire(ctx, "replicas", "handover", "east", time.Minute)
	if err != nil || !held.Acquired {
		t.Fatalf("acquire through A: %+v, %v", held, err)
	}
	if c, took, ok := next("handover", 20*time.Second); !ok {
		t.Fatal("acquire through A: nothing at replica B within 20 s")
	} else if c != "handover east#1" {
		t.Fatalf("after an acquire through A, B sent %q", c)
	} else {
		t.Logf("B's watch had the acquire %s after A answered it", took.Round(time.Millisecond))
	}
	if _, err := ca.Renew(ctx, "replicas", "handover", "east", held.FencingToken, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := ca.Release(ctx, "replicas", "handover", "east", held.FencingToken); err != nil {
		t.Fatal(err)
	}
	if c, took, ok := next("handover", 20*time.Second); !ok {
		t.Fatal("release through A: nothing at replica B within 20 s")
	} else if c != "handover #1" {
		t.Fatalf("after a renewal and a release through A, B sent %q, want the release", c)
	} else {
		t.Logf("B's watch had the release %s after A answered it", took.Round(time.Millisecond))
	}
}

// TestShutdownEndsWatches: a server with a watch open shuts down at once
// on SIGTERM, not after the shutdown timeout, and its client is told the
// stream broke.
func TestShutdownEndsWatches(t *testing.T) {
	p := start(t, "--sqlite-path", filepath.Join(t.TempDir(), "leases.db"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	connected := make(chan bool, 8)
	done := make(chan error, 1)
	go func() {
		done <- p.client(t).WatchLeases(ctx, nil, func(client.LeaseEvent) {}, func(up bool) { connected <- up })
	}()
	if up := <-connected; !up {
		t.Fatal("connected(false) first")
	}
	start := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	took := time.Since(start)
	t.Logf("the server exited %s after SIGTERM with a watch open", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("the server took %s to exit: it waited for the watch", took)
	}
	select {
	case up := <-connected:
		if up {
			t.Error("connected(true) after the server exited")
		}
	case <-time.After(5 * time.Second):
		t.Error("the client was not told that the stream broke")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("WatchLeases: %v", err)
	}
}
