package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/history"
)

// Episode is a stretch of consecutive sweeps in which more than one cluster
// had ungated Pods.
type Episode struct {
	// Start is the first sweep that saw it; it began after the sweep before.
	Start, End time.Time
	Clusters   []string
	// Active lists the faults under way when it began.
	Active []string
	// Limit says why it lies within the documented limit (an agent down or
	// frozen past its local deadline), or is empty when it is a failure.
	Limit string
}

func (e Episode) String() string {
	s := fmt.Sprintf("%s and %s ran at once from %s to %s", strings.Join(e.Clusters[:len(e.Clusters)-1], ", "), e.Clusters[len(e.Clusters)-1],
		e.Start.Format("15:04:05.000"), e.End.Format("15:04:05.000"))
	if len(e.Active) > 0 {
		s += " during " + strings.Join(e.Active, "; ")
	} else {
		s += " with no fault under way"
	}
	if e.Limit != "" {
		s += " [within the documented limit: " + e.Limit + "]"
	}
	return s
}

// Verdict is the judgement of one schedule's history.
type Verdict struct {
	Episodes []Episode
	// TokenProblems are terms whose token did not exceed the previous
	// term's, outside any overlap.
	TokenProblems string
}

// Failures counts the episodes outside the documented limit.
func (v Verdict) Failures() int {
	n := 0
	for _, e := range v.Episodes {
		if e.Limit == "" {
			n++
		}
	}
	return n
}

// Judge finds the overlaps in h and sorts them: an overlap that began while
// one of its clusters' agents was down or frozen past its local deadline is
// within the documented limit; any other is a failure. An agent is taken to
// be past its deadline when it was out longer than the shortest validity it
// can have left after a renewal (validity minus one heartbeat), or when it
// was out at all while it could not renew (its cluster cut off, or the lease
// API down, in the validity before the outage or during it).
func Judge(h history.History, faults []Fault, outages []Outage, ttl, heartbeat time.Duration) Verdict {
	var v Verdict
	validity := reconciler.LocalValidity(ttl)
	slack := time.Second // a sweep or two
	var single history.History
	for i := 0; i < len(h); i++ {
		if len(h[i].Holders()) < 2 {
			single = append(single, h[i])
			continue
		}
		e := Episode{Start: h[i].At}
		began := e.Start
		if i > 0 {
			began = h[i-1].At // it began after the sweep before
		}
		seen := map[string]bool{}
		for ; i < len(h) && len(h[i].Holders()) > 1; i++ {
			for _, c := range h[i].Holders() {
				seen[c] = true
			}
			e.End = h[i].At
		}
		i--
		for c := range seen {
			e.Clusters = append(e.Clusters, c)
		}
		slices.Sort(e.Clusters)
		for _, f := range faults {
			// A fault that happens at once counts as under way for two
			// TTLs after it.
			until := f.End.Add(slack)
			if f.End.Equal(f.Start) {
				until = f.Start.Add(2 * ttl)
			}
			if f.Skipped == "" && !f.Start.After(e.Start) && !began.After(until) {
				e.Active = append(e.Active, f.String())
			}
		}
		for _, o := range outages {
			if !slices.Contains(e.Clusters, o.Cluster) || o.Start.After(e.Start) || began.After(o.End.Add(slack)) {
				continue
			}
			if out := o.End.Sub(o.Start); out > validity-heartbeat {
				e.Limit = fmt.Sprintf("%s's agent out for %s (validity %s)", o.Cluster, out.Round(time.Millisecond), validity.Round(time.Millisecond))
				break
			}
			if f, ok := couldNotRenew(faults, o, validity); ok {
				e.Limit = fmt.Sprintf("%s's agent out for %s while it could not renew (%s)", o.Cluster, o.End.Sub(o.Start).Round(time.Millisecond), f)
				break
			}
		}
		v.Episodes = append(v.Episodes, e)
	}
	if err := single.Check(); err != nil {
		v.TokenProblems = err.Error()
	}
	return v
}

// couldNotRenew finds a fault that kept o's agent from renewing in the
// validity before its outage or during it.
func couldNotRenew(faults []Fault, o Outage, validity time.Duration) (Fault, bool) {
	for _, f := range faults {
		if f.Skipped != "" || (f.Kind != Cut && f.Kind != KillAPI) || (f.Kind == Cut && f.Cluster != o.Cluster) {
			continue
		}
		if f.Start.Before(o.End) && f.End.After(o.Start.Add(-validity)) {
			return f, true
		}
	}
	return Fault{}, false
}
