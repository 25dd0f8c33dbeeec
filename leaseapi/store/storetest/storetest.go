package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// OpenFunc opens a fresh, empty store; the suite closes it.
type OpenFunc func(t *testing.T) store.Store

// Run runs the whole suite against the backend that open returns.
func Run(t *testing.T, open OpenFunc) {
	tests := map[string]func(*testing.T, OpenFunc){
		"compare-and-swap":                 testCompareAndSwap,
		"concurrent writes from one state": testConcurrentWritesFromOneState,
		"racing acquirers":                 testRacingAcquirers,
		"tokens increase across cycles":    testTokensIncrease,
		"expiry on injected clock":         testExpiry,
		"pagination":                       testPagination,
		"pagination, namespace prefixes":   testPaginationPrefixNamespaces,
		"token ceiling":                    testTokenCeiling,
		"restart grace":                    testRestartGrace,
		"cluster registry":                 testClusterRegistry,
		"cordoned cluster":                 testCordonedCluster,
		"lease feed":                       testLeaseFeed,
		"revocation":                       testRevocation,
		"move and reservation":             testMove,
		"term history":                     testHistory,
		"batch reads and writes":           testBatchReadWrite,
		"batch writes from one version":    testBatchOneVersion,
		"batch renewal":                    testBatchRenewal,
		"batch of many":                    testBatchMany,
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { tc(t, open) })
	}
}

// epoch is where every fake clock starts.
var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type fixture struct {
	store store.Store
	clock *testingclock.FakeClock
	svc   *lease.Service
	ctx   context.Context
}

func newFixture(t *testing.T, open OpenFunc) *fixture {
	t.Helper()
	s := open(t)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	clk := testingclock.NewFakeClock(epoch)
	return &fixture{
		store: s,
		clock: clk,
		svc:   lease.NewService(s, lease.Options{Clock: clk, ClusterTTL: 30 * time.Second}),
		ctx:   t.Context(),
	}
}

var key = leaseapi.Key{Namespace: "payments", Name: "billing-exporter"}

func (f *fixture) acquire(t *testing.T, holder string, ttl time.Duration) lease.Decision {
	t.Helper()
	d, err := f.svc.Acquire(f.ctx, key, holder, ttl)
	if err != nil {
		t.Fatalf("acquire by %s: %v", holder, err)
	}
	return d
}

func (f *fixture) release(t *testing.T, holder string, token int32) {
	t.Helper()
	if _, err := f.svc.Release(f.ctx, key, holder, token); err != nil {
		t.Fatalf("release by %s with token %d: %v", holder, token, err)
	}
}

func testCompareAndSwap(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	if _, err := f.store.GetLease(f.ctx, key.Namespace, key.Name); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get of a key never written: got %v, want ErrNotFound", err)
	}
	first, err := f.store.PutLease(f.ctx, store.Lease{Namespace: key.Namespace, Name: key.Name, Holder: "a", FencingToken: 1})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if first.Version == 0 {
		t.Fatalf("create returned version 0; the store must own a non-zero version")
	}
	if _, err := f.store.PutLease(f.ctx, store.Lease{Namespace: key.Namespace, Name: key.Name, Holder: "b", FencingToken: 1}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second create: got %v, want ErrConflict", err)
	}
	next := first
	next.Holder = "c"
	second, err := f.store.PutLease(f.ctx, next)
	if err != nil {
		t.Fatalf("update at current version: %v", err)
	}
	if second.Version == first.Version {
		t.Fatalf("update kept version %d; it must change on every write", first.Version)
	}
	stale := first
	stale.Holder = "stale"
	if _, err := f.store.PutLease(f.ctx, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("write at old version %d: got %v, want ErrConflict", first.Version, err)
	}
	got, err := f.store.GetLease(f.ctx, key.Namespace, key.Name)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(second, got); diff != "" {
		t.Errorf("stored record after a stale write (-want +got):\n%s", diff)
	}

	c, err := f.store.PutCluster(f.ctx, store.Cluster{ID: "east", Fingerprint: "fp", Labels: map[string]string{"region": "eu"}})
	if err != nil {
		t.Fatalf("create cluster: %v", err)
	}
	if _, err := f.store.PutCluster(f.ctx, store.Cluster{ID: "east", Fingerprint: "other"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second cluster create: got %v, want ErrConflict", err)
	}
	gotC, err := f.store.GetCluster(f.ctx, "east")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, gotC); diff != "" {
		t.Errorf("stored cluster (-want +got):\n%s", diff)
	}
}

// testConcurrentWritesFromOneState has many writers prepare a write from the
// same read; exactly one may land.
func testConcurrentWritesFromOneState(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	base, err := f.store.PutLease(f.ctx, store.Lease{Namespace: key.Namespace, Name: key.Name, FencingToken: 1})
	if err != nil {
		t.Fatal(err)
	}
	const writers = 32
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		landed []string
	)
	for i := range writers {
		wg.Go(func() {
			next := base
			next.Holder = fmt.Sprintf("writer-%d", i)
			_, err := f.store.PutLease(f.ctx, next)
			switch {
			case err == nil:
				mu.Lock()
				landed = append(landed, next.Holder)
				mu.Unlock()
			case !errors.Is(err, store.ErrConflict):
				t.Errorf("writer %d: got %v, want nil or ErrConflict", i, err)
			}
		})
	}
	wg.Wait()
	if len(landed) != 1 {
		t.Fatalf("writes landed from one state: %v, want exactly one", landed)
	}
	got, err := f.store.GetLease(f.ctx, key.Namespace, key.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Holder != landed[0] {
		t.Errorf("stored holder %q, want the one write that landed, %q", got.Holder, landed[0])
	}
}

func testRacingAcquirers(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const racers = 64
	results := make([]lease.Decision, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			d, err := f.svc.Acquire(f.ctx, key, fmt.Sprintf("cluster-%d", i), 10*time.Second)
			if err != nil {
				t.Errorf("racer %d: %v", i, err)
			}
			results[i] = d
		})
	}
	wg.Wait()
	var winners []string
	for i, d := range results {
		if d.Held() {
			winners = append(winners, fmt.Sprintf("cluster-%d", i))
		}
	}
	if len(winners) != 1 {
		t.Fatalf("winners: %v, want exactly one", winners)
	}
	for i, d := range results {
		if d.Next.Holder != winners[0] || d.Next.FencingToken != 1 {
			t.Errorf("racer %d saw holder %q token %d, want %q token 1", i, d.Next.Holder, d.Next.FencingToken, winners[0])
		}
	}
}

func testTokensIncrease(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const ttl = 5 * time.Second
	var last int32
	for cycle := range 6 {
		holder := fmt.Sprintf("cluster-%d", cycle%3)
		d := f.acquire(t, holder, ttl)
		if d.Outcome != lease.OutcomeAcquired {
			t.Fatalf("cycle %d: outcome %s, want acquired", cycle, d.Outcome)
		}
		if d.Next.FencingToken <= last {
			t.Fatalf("cycle %d: token %d after %d; tokens must strictly increase", cycle, d.Next.FencingToken, last)
		}
		last = d.Next.FencingToken
		if again := f.acquire(t, holder, ttl); again.Next.FencingToken != last || again.Outcome != lease.OutcomeRenewed {
			t.Fatalf("cycle %d: holder's own acquire gave %s token %d, want renewed token %d", cycle, again.Outcome, again.Next.FencingToken, last)
		}
		if cycle%2 == 0 {
			f.release(t, holder, last)
		} else {
			f.clock.Step(ttl) // let it expire
			if _, err := f.svc.Sweep(f.ctx); err != nil {
				t.Fatalf("sweep: %v", err)
			}
		}
		got, err := f.svc.Get(f.ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder != "" || got.FencingToken != last {
			t.Fatalf("cycle %d: after release/expiry holder %q token %d, want free with token %d kept", cycle, got.Holder, got.FencingToken, last)
		}
	}
	if last != 6 {
		t.Errorf("last token %d, want 6 after six grants", last)
	}
}

func testExpiry(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const ttl = 10 * time.Second
	a := f.acquire(t, "east", ttl)
	if !a.Next.ExpiresAt.Equal(epoch.Add(ttl)) {
		t.Fatalf("expiresAt %s, want %s", a.Next.ExpiresAt, epoch.Add(ttl))
	}

	f.clock.Step(ttl - time.Millisecond)
	if d := f.acquire(t, "west", ttl); d.Outcome != lease.OutcomeHeldByOther || d.Next.Holder != "east" {
		t.Fatalf("acquire just before expiry: %s holder %q, want held-by-other east", d.Outcome, d.Next.Holder)
	}
	res, err := f.svc.Sweep(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(lease.SweepResult{Held: 1}, res); diff != "" {
		t.Errorf("sweep before expiry (-want +got):\n%s", diff)
	}

	f.clock.Step(time.Millisecond)
	got, err := f.svc.Get(f.ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got.Holder != "" {
		t.Errorf("get at expiry shows holder %q before the sweep; want none", got.Holder)
	}
	if d, err := f.svc.Renew(f.ctx, key, "east", a.Next.FencingToken, ttl); err != nil || d.Outcome != lease.OutcomeLost {
		t.Fatalf("renew after expiry: %s, %v; want lost", d.Outcome, err)
	}
	res, err = f.svc.Sweep(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(lease.SweepResult{Expired: 1}, res); diff != "" {
		t.Errorf("sweep after expiry (-want +got):\n%s", diff)
	}
	stored, err := f.store.GetLease(f.ctx, key.Namespace, key.Name)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Holder != "" || stored.FencingToken != 1 {
		t.Errorf("stored after sweep: holder %q token %d, want free with token 1", stored.Holder, stored.FencingToken)
	}
	if d := f.acquire(t, "west", ttl); d.Outcome != lease.OutcomeAcquired || d.Next.FencingToken != 2 {
		t.Fatalf("acquire after expiry: %s token %d, want acquired token 2", d.Outcome, d.Next.FencingToken)
	}
	if d, err := f.svc.Renew(f.ctx, key, "east", 1, ttl); err != nil || d.Outcome != lease.OutcomeLost || d.Next.Holder != "west" {
		t.Fatalf("stale holder's renew: %s holder %q, %v; want lost to west", d.Outcome, d.Next.Holder, err)
	}
	if _, err := f.svc.Release(f.ctx, key, "east", 1); !errors.Is(err, lease.ErrNotHolder) {
		t.Fatalf("stale holder's release: %v, want ErrNotHolder", err)
	}
}

func testPagination(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	var want []string
	for _, ns := range []string{"a", "b", "c"} {
		for i := range 9 {
			k := leaseapi.Key{Namespace: ns, Name: fmt.Sprintf("lease-%02d", i)}
			if _, err := f.svc.Acquire(f.ctx, k, "east", time.Minute); err != nil {
				t.Fatal(err)
			}
			want = append(want, k.String())
		}
	}
	list := func(opts store.ListOptions) []string { return listAll(t, f, opts) }
	if diff := cmp.Diff(want, list(store.ListOptions{Limit: 4})); diff != "" {
		t.Errorf("paged list (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, list(store.ListOptions{})); diff != "" {
		t.Errorf("unpaged list (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[9:18], list(store.ListOptions{Namespace: "b", Limit: 5})); diff != "" {
		t.Errorf("namespace b (-want +got):\n%s", diff)
	}
}

// testPaginationPrefixNamespaces pages through namespaces where one is a
// prefix of the other followed by '-', which sorts before the '/' of a
// "namespace/name" string: a continue key compared as that string instead of
// as the (namespace, name) pair skips every lease of "team-b" after a page
// ending in "team".
func testPaginationPrefixNamespaces(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	var want []string
	for _, ns := range []string{"team", "team-b"} {
		for i := range 5 {
			k := leaseapi.Key{Namespace: ns, Name: fmt.Sprintf("lease-%02d", i)}
			if _, err := f.svc.Acquire(f.ctx, k, "east", time.Minute); err != nil {
				t.Fatal(err)
			}
			want = append(want, k.String())
		}
	}
	cases := map[string]struct {
		opts store.ListOptions
		want []string
	}{
		"unpaged":                {opts: store.ListOptions{}, want: want},
		"pages of 3":             {opts: store.ListOptions{Limit: 3}, want: want},
		"pages of 5":             {opts: store.ListOptions{Limit: 5}, want: want},
		"namespace team":         {opts: store.ListOptions{Namespace: "team", Limit: 2}, want: want[:5]},
		"namespace team-b":       {opts: store.ListOptions{Namespace: "team-b", Limit: 2}, want: want[5:]},
		"after the last of team": {opts: store.ListOptions{After: "team/lease-04", Limit: 3}, want: want[5:]},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, listAll(t, f, tc.opts)); diff != "" {
				t.Errorf("list (-want +got):\n%s", diff)
			}
		})
	}
}

// listAll follows a list from opts page by page, each page after the last
// key of the one before, as the API's continue token does.
func listAll(t *testing.T, f *fixture, opts store.ListOptions) []string {
	t.Helper()
	var got []string
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("pagination does not end")
		}
		page, more, err := f.svc.List(f.ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if opts.Limit > 0 && len(page) > opts.Limit {
			t.Fatalf("page of %d items over limit %d", len(page), opts.Limit)
		}
		for _, l := range page {
			got = append(got, leaseapi.Key{Namespace: l.Namespace, Name: l.Name}.String())
		}
		if !more || len(page) == 0 {
			return got
		}
		opts.After = got[len(got)-1]
	}
}

func testTokenCeiling(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	if _, err := f.store.PutLease(f.ctx, store.Lease{Namespace: key.Namespace, Name: key.Name, FencingToken: math.MaxInt32 - 1}); err != nil {
		t.Fatal(err)
	}
	d := f.acquire(t, "east", time.Minute)
	if d.Next.FencingToken != math.MaxInt32 {
		t.Fatalf("token %d, want %d", d.Next.FencingToken, int32(math.MaxInt32))
	}
	f.release(t, "east", math.MaxInt32)
	if _, err := f.svc.Acquire(f.ctx, key, "west", time.Minute); !errors.Is(err, lease.ErrTokensExhausted) {
		t.Fatalf("acquire past the ceiling: %v, want ErrTokensExhausted", err)
	}
	got, err := f.store.GetLease(f.ctx, key.Namespace, key.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Holder != "" || got.FencingToken != math.MaxInt32 {
		t.Errorf("after refused acquire: holder %q token %d, want free at the ceiling", got.Holder, got.FencingToken)
	}
}

func testRestartGrace(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const ttl = 10 * time.Second
	a := f.acquire(t, "east", ttl)
	other := leaseapi.Key{Namespace: "payments", Name: "free"}
	if _, err := f.svc.Acquire(f.ctx, other, "west", ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Release(f.ctx, other, "west", 1); err != nil {
		t.Fatal(err)
	}

	f.clock.Step(time.Hour) // the server was down for an hour
	restarted := lease.NewService(f.store, lease.Options{Clock: f.clock})
	graced, err := restarted.GrantGrace(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if graced != 1 {
		t.Errorf("graced %d leases, want 1 (only the held one)", graced)
	}
	if d := f.acquire(t, "west", ttl); d.Outcome != lease.OutcomeHeldByOther {
		t.Fatalf("acquire by another right after restart: %s, want held-by-other", d.Outcome)
	}
	d, err := restarted.Renew(f.ctx, key, "east", a.Next.FencingToken, ttl)
	if err != nil || d.Outcome != lease.OutcomeRenewed || d.Next.FencingToken != a.Next.FencingToken {
		t.Fatalf("holder's renew after restart: %s token %d, %v; want renewed token %d", d.Outcome, d.Next.FencingToken, err, a.Next.FencingToken)
	}
	freeAfter, err := f.store.GetLease(f.ctx, other.Namespace, other.Name)
	if err != nil {
		t.Fatal(err)
	}
	if freeAfter.Holder != "" {
		t.Errorf("grace gave released lease a holder %q", freeAfter.Holder)
	}
}

func testClusterRegistry(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	reg := leaseapi.ClusterRegistration{Fingerprint: "uid-east", AgentVersion: "v0.1.0", Labels: map[string]string{"region": "eu-west"}}
	c, err := f.svc.RegisterCluster(f.ctx, "east", reg)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	if !c.LastSeen.Equal(epoch) || c.Cordoned {
		t.Fatalf("registered %+v, want lastSeen %s, not cordoned", c, epoch)
	}

	f.clock.Step(10 * time.Second)
	if c, err = f.svc.RegisterCluster(f.ctx, "east", reg); err != nil || !c.LastSeen.Equal(epoch.Add(10*time.Second)) {
		t.Fatalf("heartbeat: lastSeen %s, %v", c.LastSeen, err)
	}
	impostor := leaseapi.ClusterRegistration{Fingerprint: "uid-other"}
	if _, err := f.svc.RegisterCluster(f.ctx, "east", impostor); !errors.Is(err, lease.ErrFingerprintConflict) {
		t.Fatalf("second fingerprint while live: %v, want ErrFingerprintConflict", err)
	}

	if _, err := f.svc.Acquire(f.ctx, key, "east/payments", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Acquire(f.ctx, leaseapi.Key{Namespace: "payments", Name: "other"}, "east", time.Hour); err != nil {
		t.Fatal(err)
	}
	statuses, err := f.svc.Clusters(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(statuses) != 1 || !statuses[0].Healthy || statuses[0].LeasesHeld != 2 {
		t.Fatalf("clusters: %+v, want east healthy holding 2", statuses)
	}

	f.clock.Step(30 * time.Second) // east's registration goes stale
	statuses, err = f.svc.Clusters(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if statuses[0].Healthy {
		t.Errorf("cluster unseen for 30s reported healthy")
	}
	if c, err = f.svc.RegisterCluster(f.ctx, "east", impostor); err != nil || c.Fingerprint != "uid-other" {
		t.Fatalf("register over a stale registration: %+v, %v; want it taken over", c, err)
	}

	if _, err := f.svc.SetCordoned(f.ctx, "nowhere", true); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cordon of an unknown cluster: %v, want ErrNotFound", err)
	}
}

func testCordonedCluster(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	if _, err := f.svc.RegisterCluster(f.ctx, "east", leaseapi.ClusterRegistration{Fingerprint: "uid-east"}); err != nil {
		t.Fatal(err)
	}
	held := f.acquire(t, "east", time.Minute)
	c, err := f.svc.SetCordoned(f.ctx, "east", true)
	if err != nil || !c.Cordoned {
		t.Fatalf("cordon: %+v, %v", c, err)
	}
	if d, err := f.svc.Renew(f.ctx, key, "east", held.Next.FencingToken, time.Minute); err != nil || d.Outcome != lease.OutcomeRenewed {
		t.Fatalf("cordoned holder's renew: %s, %v; want renewed so it can stop its Pods in order", d.Outcome, err)
	}
	if _, err := f.svc.Acquire(f.ctx, leaseapi.Key{Namespace: "payments", Name: "new"}, "east/x", time.Minute); !errors.Is(err, lease.ErrCordoned) {
		t.Fatalf("cordoned cluster's new acquire: %v, want ErrCordoned", err)
	}
	if c, err = f.svc.SetCordoned(f.ctx, "east", false); err != nil || c.Cordoned {
		t.Fatalf("uncordon: %+v, %v", c, err)
	}
	if _, err := f.svc.Acquire(f.ctx, leaseapi.Key{Namespace: "payments", Name: "new"}, "east/x", time.Minute); err != nil {
		t.Fatalf("uncordoned cluster's acquire: %v", err)
	}
}

// testLeaseFeed checks a shared store's LeaseFeed: it reports new leases and
// changes of holder, and a second server following it wakes its long polls
// at the first server's writes.
func testLeaseFeed(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	feed, ok := f.store.(store.LeaseFeed)
	if !ok {
		t.Skip("the store offers no LeaseFeed: one server owns it")
	}
	ctx, cancel := context.WithCancel(f.ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	reports := make(chan store.LeaseChange, 1024)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := feed.FollowLeases(ctx, func(c store.LeaseChange) {
			select {
			case reports <- c:
			default:
			}
		}); err != nil {
			t.Errorf("FollowLeases: %v", err)
		}
	}()
	awaitReport := func(what string, match func(store.LeaseChange) bool) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case c := <-reports:
				if match(c) {
					return
				}
			case <-timeout:
				t.Fatalf("the feed did not report %s within 20s", what)
			}
		}
	}
	awaitReport("that it follows", func(c store.LeaseChange) bool { return c.All })
	isKey := func(c store.LeaseChange) bool { return c.Namespace == key.Namespace && c.Name == key.Name }
	d := f.acquire(t, "east", 30*time.Second)
	awaitReport("the new lease", isKey)

	// A second server on the same store hears of the first one's writes only
	// through the feed: its long poll answers the release at once, long
	// before the lease would expire.
	other := lease.NewService(f.store, lease.Options{Clock: f.clock, ClusterTTL: 30 * time.Second})
	wg.Add(1)
	go func() {
		defer wg.Done()
		other.FollowFeed(ctx, feed, func(err error) { t.Errorf("feed broke: %v", err) })
	}()
	type answer struct {
		l    store.Lease
		err  error
		took time.Duration
	}
	answers := make(chan answer, 1)
	go func() {
		start := time.Now()
		l, err := other.WaitForChange(ctx, key, "east", d.Next.FencingToken, 25*time.Second)
		answers <- answer{l, err, time.Since(start)}
	}()
	time.Sleep(200 * time.Millisecond) // let the poll start waiting
	f.release(t, "east", d.Next.FencingToken)
	awaitReport("the release", isKey)
	a := <-answers
	if a.err != nil || a.l.Holder != "" || a.took > 15*time.Second {
		t.Errorf("the other server's long poll answered %+v, %v after %s; want the released lease well before its 30s TTL", a.l, a.err, a.took)
	}

	// A reservation's end is reported too: the sweep's write that clears
	// it wakes the clusters it held back, whichever replica they wait on.
	f.register(t, "east", "west")
	d = f.acquire(t, "east", 30*time.Second)
	if _, err := f.svc.Move(f.ctx, key, "east", d.Next.FencingToken, "west"); err != nil {
		t.Fatal(err)
	}
	f.release(t, "east", d.Next.FencingToken)
	awaitReport("the moved term's release", isKey)
	time.Sleep(500 * time.Millisecond)
	for len(reports) > 0 {
		<-reports
	}
	f.clock.Step(time.Minute)
	if _, err := f.svc.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	awaitReport("the end of the reservation", isKey)
}
