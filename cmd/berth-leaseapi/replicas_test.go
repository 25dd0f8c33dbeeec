package main_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/pgtest"
	"github.com/berthfleet/berth/test/poll"
)

// TestReplicasShareOnePostgres runs three berth-leaseapi replicas on one
// PostgreSQL database.
func TestReplicasShareOnePostgres(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	testReplicas(t, "--store", "postgres", "--postgres-dsn", dsn)
}

// TestReplicasShareOneKubernetesStore runs three berth-leaseapi replicas on
// the Lease objects of one kube-apiserver.
func TestReplicasShareOneKubernetesStore(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 1, Nodes: 1})
	testReplicas(t, "--store", "kubernetes", "--kubeconfig", env.Clusters[0].KubeconfigPath)
}

// testReplicas runs three replicas on one shared store: holders spread across
// the replicas race for the same leases and exactly one wins each; tokens
// strictly increase whichever replica grants them; a replica killed mid-load
// loses no acknowledged write.
func testReplicas(t *testing.T, storeArgs ...string) {
	var (
		replicas []*server
		clients  []*client.Client
	)
	for range 3 {
		p := start(t, storeArgs...)
		replicas = append(replicas, p)
		clients = append(clients, p.client(t))
	}
	ctx := t.Context()

	// Races: 12 holders per lease, four on each replica.
	const leases, racers = 8, 12
	for i := range leases {
		name := fmt.Sprintf("race-%d", i)
		results := make([]client.AcquireResult, racers)
		var wg sync.WaitGroup
		for j := range racers {
			wg.Go(func() {
				res, err := clients[j%3].Acquire(ctx, "replicas", name, fmt.Sprintf("holder-%d", j), time.Minute)
				if err != nil {
					t.Errorf("%s racer %d: %v", name, j, err)
				}
				results[j] = res
			})
		}
		wg.Wait()
		winners := 0
		for j, res := range results {
			if res.Acquired {
				winners++
			}
			if res.Holder != results[0].Holder || res.FencingToken != 1 {
				t.Errorf("%s racer %d saw %q token %d; racers disagree", name, j, res.Holder, res.FencingToken)
			}
		}
		if winners != 1 {
			t.Errorf("%s: %d winners, want exactly one", name, winners)
		}
	}

	// Tokens grow whichever replica grants them.
	var last int32
	for i := range 9 {
		c := clients[i%3]
		holder := fmt.Sprintf("cycler-%d", i)
		res, err := c.Acquire(ctx, "replicas", "cycle", holder, time.Minute)
		if err != nil || !res.Acquired {
			t.Fatalf("cycle %d: %+v, %v", i, res, err)
		}
		if res.FencingToken <= last {
			t.Fatalf("cycle %d: token %d after %d", i, res.FencingToken, last)
		}
		last = res.FencingToken
		if err := clients[(i+1)%3].Release(ctx, "replicas", "cycle", holder, res.FencingToken); err != nil {
			t.Fatalf("cycle %d: release through another replica: %v", i, err)
		}
	}

	// A long poll held by one replica answers as soon as another replica
	// frees the lease (the store's change feed), not when the poll ends.
	held, err := clients[0].Acquire(ctx, "replicas", "handover", "east", time.Minute)
	if err != nil || !held.Acquired {
		t.Fatalf("acquire handover: %+v, %v", held, err)
	}
	type answer struct {
		l   leaseapi.Lease
		err error
		at  time.Time
	}
	answers := make(chan answer, 1)
	go func() {
		l, err := clients[2].WatchLease(ctx, "replicas", "handover", "east", held.FencingToken, 30*time.Second)
		answers <- answer{l, err, time.Now()}
	}()
	time.Sleep(500 * time.Millisecond) // let the poll start waiting
	released := time.Now()
	if err := clients[1].Release(ctx, "replicas", "handover", "east", held.FencingToken); err != nil {
		t.Fatal(err)
	}
	a := <-answers
	if a.err != nil || a.l.Holder != "" {
		t.Fatalf("long poll at replica 2: %+v, %v; want the released lease", a.l, a.err)
	}
	took := a.at.Sub(released)
	t.Logf("a long poll at replica 2 answered %s after the release through replica 1", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("a long poll at replica 2 answered %s after the release through replica 1: it did not hear of it (the poll waits 30 s)", took)
	}

	// A replica killed with SIGKILL mid-load loses no acknowledged write.
	var (
		mu    sync.Mutex
		acked = map[string]int32{}
		wg    sync.WaitGroup
		stop  = make(chan struct{})
	)
	for i := range 30 {
		wg.Go(func() {
			c := clients[i%2] // replicas 0 and 1 take the load
			name := fmt.Sprintf("own-%02d", i)
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := c.Acquire(ctx, "replicas", name, name, time.Minute)
				if err != nil {
					if i%2 == 0 {
						return // replica 0 is gone
					}
					t.Errorf("%s through the surviving replica: %v", name, err)
					return
				}
				mu.Lock()
				acked[name] = res.FencingToken
				mu.Unlock()
				if err := c.Release(ctx, "replicas", name, name, res.FencingToken); err != nil {
					if i%2 == 0 {
						return
					}
					t.Errorf("%s release: %v", name, err)
					return
				}
			}
		})
	}
	// Kill replica 0 once every holder has a grant, a moment into the load.
	_, _ = poll.Until(ctx, 30*time.Second, "every holder granted", poll.Condition(func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == 30
	}))
	time.Sleep(500 * time.Millisecond)
	replicas[0].Kill()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(acked) < 30 {
		t.Fatalf("only %d of 30 holders got a grant before the kill", len(acked))
	}
	for name, token := range acked {
		got, err := clients[2].GetLease(ctx, "replicas", name)
		if err != nil {
			t.Fatalf("%s through replica 2: %v", name, err)
		}
		if got.FencingToken < token {
			t.Errorf("%s: token %d at replica 2, but %d was acknowledged", name, got.FencingToken, token)
		}
	}
	t.Logf("%d holders' last acknowledged grants all present after replica 0 was killed", len(acked))
}
