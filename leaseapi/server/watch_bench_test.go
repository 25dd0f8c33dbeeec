package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// benchLeases is how many leases the watch benchmarks hold.
const benchLeases = 10000

// watchBench is one server (SQLite on tmpfs where there is one: the disk's
// fsync is not what these measure) holding benchLeases leases, with one
// client following every change through WatchLeases.
type watchBench struct {
	b      *testing.B
	clock  *testingclock.FakeClock
	srv    *Server
	client *client.Client
	url    string
	mu     sync.Mutex
	onFree func(leaseapi.Lease) // called for every CHANGED to a free lease
}

func newWatchBench(b *testing.B) *watchBench {
	dir := b.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "berth-bench-"); err == nil {
		dir = shm
		b.Cleanup(func() { _ = os.RemoveAll(shm) })
	}
	st, err := sqlite.Open(b.Context(), filepath.Join(dir, "leases.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	wb := &watchBench{b: b, clock: testingclock.NewFakeClock(epoch)}
	wb.srv = New(Config{
		Service: lease.NewService(st, lease.Options{Clock: wb.clock}),
		Store:   st,
		Auth:    NewAuthenticator(nil, false, nil),
		Log:     logr.Discard(),
		Clock:   wb.clock,
	})
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = wb.srv.HTTPServer(nil)
	ts.Start()
	b.Cleanup(ts.Close)
	wb.url = ts.URL
	if wb.client, err = client.New(client.Config{URL: ts.URL}); err != nil {
		b.Fatal(err)
	}
	wb.acquireAll("east")

	ctx, cancel := context.WithCancel(context.Background())
	reset := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = wb.client.WatchLeases(ctx, nil, func(e client.LeaseEvent) {
			if e.Reset {
				close(reset)
				return
			}
			wb.mu.Lock()
			onFree := wb.onFree
			wb.mu.Unlock()
			if e.Lease.Holder == "" && onFree != nil {
				onFree(e.Lease)
			}
		}, nil)
	}()
	b.Cleanup(func() { cancel(); <-done })
	<-reset
	return wb
}

func benchKey(i int) leaseapi.Key {
	return leaseapi.Key{Namespace: "bench", Name: fmt.Sprintf("lease-%05d", i)}
}

// acquireAll gives every lease a new term of holder, through the service.
func (wb *watchBench) acquireAll(holder string) {
	for i := range benchLeases {
		if _, err := wb.srv.Service.Acquire(wb.b.Context(), benchKey(i), holder, time.Minute); err != nil {
			wb.b.Fatal(err)
		}
	}
}

func (wb *watchBench) setOnFree(f func(leaseapi.Lease)) {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	wb.onFree = f
}

// BenchmarkWatchReleaseLatency measures, with 10,000 leases held and one
// watcher, the time from sending a release (POST .../release over HTTP) to
// the CHANGED line of the freed lease reaching the watcher's callback, one
// release at a time. Run it with -benchtime=1000x.
func BenchmarkWatchReleaseLatency(b *testing.B) {
	wb := newWatchBench(b)
	arrived := make(chan time.Time, 1)
	wb.setOnFree(func(leaseapi.Lease) { arrived <- time.Now() })
	var latencies, releases []time.Duration
	i := 0
	for b.Loop() {
		key := benchKey(i % benchLeases)
		i++
		sent := time.Now()
		if err := wb.client.Release(b.Context(), key.Namespace, key.Name, "east", 1); err != nil {
			b.Fatal(err)
		}
		answered := time.Since(sent)
		select {
		case at := <-arrived:
			latencies = append(latencies, at.Sub(sent))
			releases = append(releases, answered)
		case <-time.After(10 * time.Second):
			b.Fatalf("no CHANGED for %s within 10 s", key)
		}
	}
	b.ReportMetric(float64(percentile(latencies, 50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(latencies, 99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(percentile(releases, 50).Microseconds()), "release-p50-µs")
}

// BenchmarkWatchExpiryBurst measures how fast one stream delivers when
// 10,000 leases expire at once: the sweep frees them all, and the time runs
// from the sweep's start to the last of the 10,000 CHANGED lines reaching
// the watcher. Each iteration first grants the leases new terms (untimed).
// Run it with -benchtime=1x -count=3.
func BenchmarkWatchExpiryBurst(b *testing.B) {
	wb := newWatchBench(b)
	var sweep, total time.Duration
	round := 0
	for b.Loop() {
		b.StopTimer()
		if round > 0 {
			wb.acquireAll(fmt.Sprintf("east-%d", round))
		}
		round++
		all := make(chan struct{})
		var freed int
		wb.setOnFree(func(leaseapi.Lease) {
			if freed++; freed == benchLeases {
				close(all)
			}
		})
		wb.clock.Step(2 * time.Minute)
		b.StartTimer()
		start := time.Now()
		res, err := wb.srv.Service.Sweep(b.Context())
		if err != nil || res.Expired != benchLeases {
			b.Fatalf("sweep: %+v, %v", res, err)
		}
		sweep += time.Since(start)
		select {
		case <-all:
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d expiries reached the watcher within a minute", freed, benchLeases)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(round*benchLeases)/total.Seconds(), "events/s")
	b.ReportMetric(float64(round*benchLeases)/sweep.Seconds(), "sweep-expiries/s")
	b.ReportMetric(float64(total-sweep)/float64(round)/float64(time.Millisecond), "ms-after-sweep")
}

// BenchmarkWatchReplay measures the rate at which one stream delivers
// changes the server already logged: a watch resumed from a revision before
// 10,000 expiries, replayed from the change log. Run it with -benchtime=3x.
func BenchmarkWatchReplay(b *testing.B) {
	wb := newWatchBench(b)
	before := wb.srv.Service.Watch(nil, "").Revision()
	wb.clock.Step(2 * time.Minute)
	if res, err := wb.srv.Service.Sweep(b.Context()); err != nil || res.Expired != benchLeases {
		b.Fatalf("sweep: %+v, %v", res, err)
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		if got := wb.replay(before); got != benchLeases {
			b.Fatalf("replayed %d changes, want %d", got, benchLeases)
		}
		total += time.Since(start)
		n++
	}
	b.ReportMetric(float64(n*benchLeases)/total.Seconds(), "events/s")
}

// replay opens a watch from revision and reads CHANGED lines, decoded as
// a client decodes them, until benchLeases arrived or the stream went quiet.
func (wb *watchBench) replay(revision string) int {
	ctx, cancel := context.WithCancel(wb.b.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, wb.url+"/v1alpha1/watch/leases?revision="+url.QueryEscape(revision), nil)
	if err != nil {
		wb.b.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		wb.b.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	got := 0
	for got < benchLeases && sc.Scan() {
		var e leaseapi.WatchEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			wb.b.Fatal(err)
		}
		switch e.Type {
		case leaseapi.WatchChanged:
			got++
		case leaseapi.WatchReset:
			wb.b.Fatalf("a RESET replaying from %s", revision)
		}
	}
	return got
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}
