// Package history records which cluster of a test fleet ran a lease's
// managed Pods when, and with which fencing token, and checks the record for
// Berth's promise: never two clusters at once, tokens strictly increasing
// across holders.
//
// A Recorder looks at every cluster's managed Pods at a fixed interval, all
// clusters in one sweep. A Pod counts as possibly running from the moment it
// is ungated until it is gone (terminating Pods count), which is stricter
// than what its containers do. Two clusters count as running together only
// when the reads prove it (see sweep): a Pod that vanished between two reads
// of its cluster may have gone before the other cluster was read, so the
// recorder resolves time to about one sweep's length.
package history

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/reconciler"
)

// Sweep is one look at every cluster.
type Sweep struct {
	At time.Time
	// Ungated counts, per cluster, the ungated managed Pods that exist. A
	// cluster that could not be read (it may be down) has no entry.
	Ungated map[string]int
	// Running counts, per cluster, the ungated Pods reported Running.
	Running map[string]int
	// Tokens are the fencing tokens on ungated Pods, per cluster.
	Tokens map[string][]int32
}

// Holders lists the clusters with ungated Pods in this sweep.
func (s Sweep) Holders() []string {
	var out []string
	for c, n := range s.Ungated {
		if n > 0 {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// Recorder records sweeps until stopped.
type Recorder struct {
	clusters  map[string]ctrlclient.Reader
	namespace string
	lease     string
	// others are more BerthLeases whose Pods count with lease's (they
	// share its lease name, say).
	others   []string
	interval time.Duration

	mu     sync.Mutex
	sweeps []Sweep
	stop   context.CancelFunc
	done   chan struct{}
}

// Start records the managed Pods of lease (a BerthLease name) in namespace of
// every cluster, every interval.
func Start(clusters map[string]ctrlclient.Reader, namespace, lease string, interval time.Duration) *Recorder {
	return StartLeases(clusters, namespace, []string{lease}, interval)
}

// StartLeases is Start for the managed Pods of several BerthLeases (leases
// holds at least one name) that count as one workload: two BerthLeases with
// the same spec.leaseName, say, share one lease, so a cluster running either
// one's Pods runs the lease's workload.
func StartLeases(clusters map[string]ctrlclient.Reader, namespace string, leases []string, interval time.Duration) *Recorder {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Recorder{clusters: clusters, namespace: namespace, lease: leases[0], others: leases[1:], interval: interval, stop: cancel, done: make(chan struct{})}
	go r.run(ctx)
	return r
}

func (r *Recorder) run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		if s, ok := r.sweep(ctx); ok {
			r.mu.Lock()
			r.sweeps = append(r.sweeps, s)
			r.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep looks at every cluster; a cluster that cannot be read (it may be
// down) is left out of the sweep.
//
// Clusters are read one after another, not at one instant, so a cluster read
// early may have stopped its Pods before one read later started its own.
// Before two clusters count as running together, every holder read before
// the last one is read again, and only its Pods present in both reads count:
// a Pod that exists at two reads (same UID) existed in between, when the
// later cluster was read.
func (r *Recorder) sweep(ctx context.Context) (Sweep, bool) {
	s := Sweep{At: time.Now(), Ungated: map[string]int{}, Running: map[string]int{}, Tokens: map[string][]int32{}}
	ungated := map[string][]corev1.Pod{}
	var order []string // the clusters read, in the order they were read
	for _, name := range slices.Sorted(maps.Keys(r.clusters)) {
		pods, err := r.ungated(ctx, r.clusters[name])
		if err != nil {
			if ctx.Err() != nil {
				return s, false
			}
			continue
		}
		ungated[name] = pods
		order = append(order, name)
	}
	lastHolder := -1
	for i, name := range order {
		if len(ungated[name]) > 0 {
			lastHolder = i
		}
	}
	for _, name := range order[:max(lastHolder, 0)] {
		if len(ungated[name]) == 0 {
			continue
		}
		again, err := r.ungated(ctx, r.clusters[name])
		if err != nil {
			if ctx.Err() != nil {
				return s, false
			}
			continue // keep the first read: the stricter view
		}
		ungated[name] = slices.DeleteFunc(ungated[name], func(p corev1.Pod) bool {
			return !slices.ContainsFunc(again, func(q corev1.Pod) bool { return q.UID == p.UID })
		})
	}
	for _, name := range order {
		s.Ungated[name] = len(ungated[name]) // present, even with nothing ungated
		for _, p := range ungated[name] {
			if p.Status.Phase == corev1.PodRunning {
				s.Running[name]++
			}
			if tok, err := strconv.ParseInt(p.Annotations[reconciler.AnnotationFencingToken], 10, 32); err == nil {
				s.Tokens[name] = append(s.Tokens[name], int32(tok))
			}
		}
	}
	return s, true
}

// ungated lists the lease's ungated, unfinished managed Pods of one cluster.
func (r *Recorder) ungated(ctx context.Context, c ctrlclient.Reader) ([]corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	pods := &corev1.PodList{}
	var sel ctrlclient.ListOption = ctrlclient.MatchingLabels{reconciler.ManagedLease: r.lease}
	if len(r.others) > 0 {
		req, err := labels.NewRequirement(reconciler.ManagedLease, selection.In, append([]string{r.lease}, r.others...))
		if err != nil {
			return nil, err
		}
		sel = ctrlclient.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*req)}
	}
	if err := c.List(ctx, pods, ctrlclient.InNamespace(r.namespace), sel); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
		gated := slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == reconciler.SchedulingGate })
		return gated || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}), nil
}

// Snapshot returns the sweeps so far.
func (r *Recorder) Snapshot() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return History(slices.Clone(r.sweeps))
}

// Stop ends the recording and returns it.
func (r *Recorder) Stop() History {
	r.stop()
	<-r.done
	return r.Snapshot()
}

// History is a recording.
type History []Sweep

// Since is the part of the recording from t on.
func (h History) Since(t time.Time) History {
	for i, s := range h {
		if !s.At.Before(t) {
			return h[i:]
		}
	}
	return nil
}

// Overlaps describes every sweep in which more than one cluster had ungated
// Pods.
func (h History) Overlaps() []string {
	var out []string
	for _, s := range h {
		if holders := s.Holders(); len(holders) > 1 {
			out = append(out, fmt.Sprintf("%s: %s", s.At.Format("15:04:05.000"), strings.Join(holders, " and ")))
		}
	}
	return out
}

// Term is one holder's run as the history saw it.
type Term struct {
	Cluster     string
	Token       int32
	First, Last time.Time
}

// Terms lists the runs in order: a new term starts whenever the token on the
// ungated Pods changes.
func (h History) Terms() []Term {
	var out []Term
	for _, s := range h {
		for _, c := range s.Holders() {
			for _, tok := range s.Tokens[c] {
				if n := len(out); n > 0 && out[n-1].Cluster == c && out[n-1].Token == tok {
					out[n-1].Last = s.At
					continue
				}
				out = append(out, Term{Cluster: c, Token: tok, First: s.At, Last: s.At})
			}
		}
	}
	return out
}

// Check returns what breaks Berth's promise in the history: overlapping
// clusters, or a term whose token does not exceed the previous term's.
func (h History) Check() error {
	var problems []string
	for _, o := range h.Overlaps() {
		problems = append(problems, "two clusters ran at once at "+o)
	}
	terms := h.Terms()
	for i := 1; i < len(terms); i++ {
		if terms[i].Token <= terms[i-1].Token && terms[i].Cluster != terms[i-1].Cluster {
			problems = append(problems, fmt.Sprintf("%s ran with token %d after %s with token %d", terms[i].Cluster, terms[i].Token, terms[i-1].Cluster, terms[i-1].Token))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("history breaks the promise:\n%s", strings.Join(problems, "\n"))
	}
	return nil
}

// Runner returns the one cluster running want Pods in the last sweep, or "".
func (h History) Runner(want int) string {
	if len(h) == 0 {
		return ""
	}
	last := h[len(h)-1]
	holders := last.Holders()
	if len(holders) == 1 && last.Running[holders[0]] == want && last.Ungated[holders[0]] == want {
		return holders[0]
	}
	return ""
}
