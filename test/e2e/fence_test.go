package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/fencerun"
	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// TestPodFencing proves spec.podFencing Exec: the workload inside a holder's Pods stops
// before any other cluster can run it, with the holder's agent frozen, with the holder's
// node cut from the lease API, with the node partitioned and its Pods force-deleted after
// a revocation, with the holder's agent and control plane killed together, and with the
// TTL lowered under a running term before the holder's agent freezes. kwok runs no containers, so a fencerun.Runner per cluster runs berth-fence for
// each bound Pod, as that cluster's kubelets would; the judge works on the times each
// runner saw each workload process start and its berth-fence exit (an upper bound of the
// workload's end), against the lease API's start of the next term (a lower bound of any
// other cluster's Pod binding) and the recorder's first look at the new holder's Pods.
func TestPodFencing(t *testing.T) {
	w := workload
	w.PodFencing = berthv1alpha1.PodFencingExec
	dir := t.TempDir()
	f, err := localfleet.Start(t.Context(), localfleet.Options{Clusters: 3, BinDir: binaries.Dir, WorkDir: dir, Workload: w, Log: testr.New(t)})
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	ft := &fenceTest{Fleet: f, kubelets: map[string]*kubelet{}, rec: history.Start(f.Readers(), w.Namespace, w.Name, sweepInterval)}
	t.Cleanup(func() {
		ft.rec.Stop()
		for name, k := range ft.kubelets {
			if t.Failed() {
				t.Logf("%s's berth-fences:\n%s", name, k.LogTails(8))
			}
			k.Stop()
			k.proxy.Close()
		}
		if t.Failed() {
			for _, m := range f.Members {
				t.Logf("end of %s:\n%s", m.Agent.Log, m.Agent.LogTail(20))
			}
			t.Logf("end of %s:\n%s", f.LeaseAPI.Log, f.LeaseAPI.LogTail(20))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Stop(ctx); err != nil {
			t.Errorf("stop fleet: %v", err)
		}
	})
	for _, m := range f.Members {
		proxy, err := localfleet.StartProxy(strings.TrimPrefix(f.LeaseAPI.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		// The node's own client to its control plane, which a test may cut (a
		// partitioned node: its kubelet cannot report its Pods gone).
		partitioned := &atomic.Bool{}
		cfg := rest.CopyConfig(m.Cluster.RESTConfig())
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(r *http.Request) (*http.Response, error) {
				if partitioned.Load() {
					return nil, errors.New("the node is partitioned from its control plane")
				}
				return rt.RoundTrip(r)
			})
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r, err := fencerun.Start(t.Context(), fencerun.Options{
			Cluster: m.Name, Client: cs, Namespace: w.Namespace, Fence: binaries.Path("berth-fence"),
			Dir: dir + "/kubelets/" + m.Name, LeaseAPIURL: "http://" + proxy.Addr,
		})
		if err != nil {
			t.Fatal(err)
		}
		ft.kubelets[m.Name] = &kubelet{Runner: r, proxy: proxy, partitioned: partitioned}
	}

	first := ft.awaitWorkload(t, nil)
	t.Logf("%s runs the workload under token %d", first.Holder, first.FencingToken)

	t.Run("agent frozen", func(t *testing.T) {
		agent := f.Member(first.Holder).Agent
		frozen := time.Now()
		if err := agent.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		next := ft.awaitWorkload(t, &first)
		ft.judgeHandover(t, "agent frozen", first, next, frozen)
		if err := agent.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// The thawed agent finds its term gone and deletes its Pods.
		poll.For(t, 30*time.Second, "the thawed cluster's berth-fences are stopped", func() bool { return ft.kubelets[first.Holder].Running() == 0 })
		first = next
	})

	t.Run("cut from the lease API", func(t *testing.T) {
		k := ft.kubelets[first.Holder]
		cut := time.Now()
		k.proxy.Cut()
		// The agent still renews, so the lease stays: only the workload stops, by its
		// own deadline, and does not start again while the node is cut off.
		bound := time.Duration(w.TTLSeconds) * time.Second
		poll.For(t, bound+5*time.Second, "the cut-off workload stops", func() bool { return len(unended(k.Events())) == 0 })
		ended := lastEnd(k.Events(), cut)
		t.Logf("cut from the lease API: the workload stopped %s after the cut (bound: the TTL, %s)", ended.Sub(cut).Round(time.Millisecond), bound)
		if ended.Sub(cut) > bound {
			t.Errorf("the workload ran %s after its node was cut from the lease API, more than the TTL", ended.Sub(cut))
		}
		time.Sleep(2 * time.Second)
		if starts := childStartsAfter(k.Events(), cut); len(starts) > 0 {
			t.Errorf("the workload started again while cut off: %v", starts)
		}
		if l := ft.lease(t); l.Holder != first.Holder || l.FencingToken != first.FencingToken {
			t.Fatalf("the lease moved to %s (token %d) while only the workload's node was cut", l.Holder, l.FencingToken)
		}
		healed := time.Now()
		k.proxy.Heal()
		poll.For(t, 30*time.Second, "the workload starts again once the node reaches the lease API", func() bool {
			return len(childStartsAfter(k.Events(), healed)) >= int(w.Replicas)
		})
	})

	// The holder's node is partitioned from everything while its agent runs; an
	// administrator revokes the term and force-deletes the Pods its kubelets cannot stop.
	// The agent, seeing them gone, gives the term up, but the fences on the node still run
	// the workload to their deadlines: the term must not pass before those (a fenced term
	// is revoked, not freed, and ends at its expiry).
	t.Run("node partitioned, term revoked, Pods force-deleted", func(t *testing.T) {
		h, k := f.Member(first.Holder), ft.kubelets[first.Holder]
		cut := time.Now()
		k.partitioned.Store(true)
		k.proxy.Cut()
		thaw := freezeKubelets(t, h)
		if err := f.LeaseAPI.Admin.Revoke(t.Context(), w.Namespace, w.Name, first.Holder, first.FencingToken); err != nil {
			t.Fatalf("revoke: %v", err)
		}
		cs, err := kubernetes.NewForConfig(h.Cluster.RESTConfig())
		if err != nil {
			t.Fatal(err)
		}
		managed := metav1.ListOptions{LabelSelector: berthv1alpha1.ManagedLeaseLabel}
		poll.For(t, 20*time.Second, "the holder's bound Pods are Terminating", func() bool {
			pods, err := cs.CoreV1().Pods(w.Namespace).List(t.Context(), managed)
			if err != nil {
				return false
			}
			terminating := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil && p.Spec.NodeName != "" {
					terminating++
				}
			}
			return terminating >= int(w.Replicas)
		})
		pods, err := cs.CoreV1().Pods(w.Namespace).List(t.Context(), managed)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				if err := cs.CoreV1().Pods(w.Namespace).Delete(t.Context(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
					t.Fatal(err)
				}
			}
		}
		next := ft.awaitWorkload(t, &first)
		ft.judgeHandover(t, "node partitioned, term revoked, Pods force-deleted", first, next, cut)
		k.partitioned.Store(false)
		k.proxy.Heal()
		thaw()
		poll.For(t, 30*time.Second, "the healed node's berth-fences are stopped", func() bool { return k.Running() == 0 })
		first = next
	})

	var lostCluster string
	t.Run("agent and control plane lost", func(t *testing.T) {
		lost := f.Member(first.Holder)
		killed := time.Now()
		lost.StopAgent()
		if err := lost.Cluster.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		next := ft.awaitWorkload(t, &first)
		ft.judgeHandover(t, "agent and control plane lost", first, next, killed)
		// Its kubelet keeps restarting berth-fence, which never starts the workload again.
		time.Sleep(3 * time.Second)
		if starts := childStartsAfter(ft.kubelets[first.Holder].Events(), killed); len(starts) > 0 {
			t.Errorf("the lost cluster started its workload again: %v", starts)
		}
		lostCluster = first.Holder
		first = next
	})

	// spec.ttlSeconds lowered under a running term: the fences were told the long term's
	// end, so the lease API must not pull it in; then the holder's agent freezes.
	t.Run("TTL lowered, then the agent frozen", func(t *testing.T) {
		setTTL := func(seconds int32) {
			for _, m := range f.Members {
				if m.Name == lostCluster {
					continue
				}
				bl := m.BerthLease(t.Context())
				patch := ctrlclient.MergeFrom(bl.DeepCopy())
				bl.Spec.TTLSeconds = seconds
				if err := m.Client.Patch(t.Context(), &bl, patch); err != nil {
					t.Fatalf("%s: patch ttlSeconds: %v", m.Name, err)
				}
			}
			poll.For(t, 20*time.Second, fmt.Sprintf("the holder renews with TTL %d s", seconds), func() bool { return ft.lease(t).TTLSeconds == seconds })
		}
		setTTL(30)
		time.Sleep(6 * time.Second) // every fence confirms the long term (every 5 s)
		setTTL(w.TTLSeconds)
		agent := f.Member(first.Holder).Agent
		frozen := time.Now()
		if err := agent.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		next := ft.awaitWorkload(t, &first)
		ft.judgeHandover(t, "TTL lowered from 30 s, then the agent frozen", first, next, frozen)
		if err := agent.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	})

	// Across the whole run, no two clusters' workloads ran at once.
	var all []fencerun.Event
	for _, k := range ft.kubelets {
		all = append(all, k.Events()...)
	}
	if err := overlap(all); err != nil {
		t.Error(err)
	}
}

type kubelet struct {
	*fencerun.Runner
	// proxy carries the node's traffic to the lease API; partitioned cuts its
	// traffic to its control plane.
	proxy       *localfleet.Proxy
	partitioned *atomic.Bool
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type fenceTest struct {
	*localfleet.Fleet
	kubelets map[string]*kubelet
	rec      *history.Recorder
}

func (ft *fenceTest) lease(t *testing.T) leaseapi.Lease {
	t.Helper()
	w := workload
	l, err := ft.LeaseAPI.Admin.GetLease(t.Context(), w.Namespace, w.Name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// awaitWorkload waits until a cluster other than after's holder holds the lease and runs
// every replica's workload under its term, and returns the lease as then.
func (ft *fenceTest) awaitWorkload(t *testing.T, after *leaseapi.Lease) leaseapi.Lease {
	t.Helper()
	var l leaseapi.Lease
	poll.For(t, 90*time.Second, "a cluster runs the fenced workload", func() bool {
		l = ft.lease(t)
		if l.Holder == "" || (after != nil && (l.Holder == after.Holder || l.FencingToken == after.FencingToken)) {
			return false
		}
		started := 0
		for _, e := range ft.kubelets[l.Holder].Events() {
			if e.Kind == fencerun.ChildStarted && e.Token == l.FencingToken {
				started++
			}
		}
		return started >= int(workload.Replicas)
	})
	return l
}

// judgeHandover checks that every workload process of old's holder had ended before
// next's term began at the lease API, and reports the margins: to the term's start, to
// the new holder's first workload start, and to the recorder's first sight of the new
// holder's Pods bound.
func (ft *fenceTest) judgeHandover(t *testing.T, scenario string, old, next leaseapi.Lease, fault time.Time) {
	t.Helper()
	events := ft.kubelets[old.Holder].Events()
	if still := unended(events); len(still) > 0 {
		t.Fatalf("%s: %s still runs its workload (%v) while %s holds the lease", scenario, old.Holder, still, next.Holder)
	}
	ended := lastEnd(events, fault)
	firstStart := time.Time{}
	for _, e := range ft.kubelets[next.Holder].Events() {
		if e.Kind == fencerun.ChildStarted && e.Token == next.FencingToken && (firstStart.IsZero() || e.At.Before(firstStart)) {
			firstStart = e.At
		}
	}
	bound := time.Time{}
	for _, term := range ft.rec.Snapshot().Terms() {
		if term.Cluster == next.Holder && term.Token == next.FencingToken {
			bound = term.First
		}
	}
	t.Logf("%s: %s's workload ended %s after the fault; %s's term began %s later (margin), its first Pod was seen bound %s later, its workload started %s later",
		scenario, old.Holder, ended.Sub(fault).Round(time.Millisecond), next.Holder,
		next.AcquiredAt.Sub(ended).Round(time.Millisecond), bound.Sub(ended).Round(time.Millisecond), firstStart.Sub(ended).Round(time.Millisecond))
	if !ended.Before(next.AcquiredAt) {
		t.Errorf("%s: %s's workload ended at %s, not before %s's term began at %s", scenario, old.Holder,
			ended.Format(time.StampMicro), next.Holder, next.AcquiredAt.Format(time.StampMicro))
	}
}

// interval is one workload process's run: from its start to its berth-fence's exit.
type interval struct {
	cluster, container string
	token              int32
	start, end         time.Time // end zero: still running
}

func (i interval) String() string {
	return fmt.Sprintf("%s %s token %d from %s to %s", i.cluster, i.container, i.token, i.start.Format(time.StampMilli), i.end.Format(time.StampMilli))
}

// intervals pairs each workload start with the first exit of its berth-fence after it.
func intervals(events []fencerun.Event) []interval {
	byContainer := map[string][]fencerun.Event{}
	for _, e := range events {
		key := e.Cluster + "/" + e.Pod + "/" + e.Container
		byContainer[key] = append(byContainer[key], e)
	}
	var out []interval
	for key, es := range byContainer {
		slices.SortFunc(es, func(a, b fencerun.Event) int { return a.At.Compare(b.At) })
		for i, e := range es {
			if e.Kind != fencerun.ChildStarted {
				continue
			}
			in := interval{cluster: e.Cluster, container: key, token: e.Token, start: e.At}
			if j := slices.IndexFunc(es[i:], func(x fencerun.Event) bool { return x.Kind == fencerun.Exited }); j >= 0 {
				in.end = es[i+j].At
			}
			out = append(out, in)
		}
	}
	return out
}

// unended lists the workload processes that have not ended.
func unended(events []fencerun.Event) []interval {
	var out []interval
	for _, in := range intervals(events) {
		if in.end.IsZero() {
			out = append(out, in)
		}
	}
	return out
}

// lastEnd is the latest end of a workload process that ran at or after since.
func lastEnd(events []fencerun.Event, since time.Time) time.Time {
	var last time.Time
	for _, in := range intervals(events) {
		if !in.end.IsZero() && in.end.After(since) && in.end.After(last) {
			last = in.end
		}
	}
	return last
}

func childStartsAfter(events []fencerun.Event, since time.Time) []fencerun.Event {
	var out []fencerun.Event
	for _, e := range events {
		if e.Kind == fencerun.ChildStarted && e.At.After(since) {
			out = append(out, e)
		}
	}
	return out
}

// overlap reports workload processes of two clusters that ran at once.
func overlap(events []fencerun.Event) error {
	ins := intervals(events)
	slices.SortFunc(ins, func(a, b interval) int { return a.start.Compare(b.start) })
	var bad []string
	for i, a := range ins {
		for _, b := range ins[i+1:] {
			if a.cluster != b.cluster && (a.end.IsZero() || b.start.Before(a.end)) {
				bad = append(bad, a.String()+" and "+b.String())
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("workloads of two clusters ran at once:\n%s", strings.Join(bad, "\n"))
	}
	return nil
}
