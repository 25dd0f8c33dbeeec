package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/history"
	"github.com/berthfleet/berth/test/localfleet"
)

// SweepInterval is how often the judge looks at every cluster.
const SweepInterval = 100 * time.Millisecond

// Suite runs schedules one after another on one fleet.
type Suite struct {
	Fleet    *localfleet.Fleet
	Workload localfleet.Workload
	Nemesis  *Nemesis
	Timing   Timing
	// clients call the lease API for the linearizability check: the first
	// directly, the others through the nemesis's Clients proxy.
	clients []*leaseclient.Client
	Logf    func(format string, args ...any)
	// Converge bounds the wait for one holder after a heal.
	Converge time.Duration
}

// NewSuite prepares schedules on a running fleet; berthctl is the berthctl
// binary.
func NewSuite(f *localfleet.Fleet, w localfleet.Workload, berthctl string, logf func(string, ...any)) (*Suite, error) {
	target := strings.TrimPrefix(f.LeaseAPI.URL, "http://")
	proxy, err := localfleet.StartProxy(target)
	if err != nil {
		return nil, err
	}
	s := &Suite{Fleet: f, Workload: w, Logf: logf, Converge: 30 * time.Second,
		Timing: Timing{TTL: time.Duration(w.TTLSeconds) * time.Second, MinSteps: 2, MaxSteps: 5, MaxWait: 2500 * time.Millisecond}}
	s.Nemesis = &Nemesis{Fleet: f, Workload: w, Berthctl: berthctl, Clients: proxy, Logf: logf}
	for i, url := range []string{f.LeaseAPI.URL, "http://" + proxy.Addr, "http://" + proxy.Addr} {
		c, err := leaseclient.New(leaseclient.Config{URL: url, TokenFile: f.LeaseAPI.TokenFiles[localfleet.AdminSubject], RetryMax: -1, Timeout: time.Second})
		if err != nil {
			proxy.Close()
			return nil, fmt.Errorf("lease API client %d: %w", i, err)
		}
		s.clients = append(s.clients, c)
	}
	return s, nil
}

// Close stops what NewSuite started (not the fleet).
func (s *Suite) Close() { s.Nemesis.Clients.Close() }

// Report is what one schedule did and what the judges found.
type Report struct {
	Schedule Schedule
	Faults   []Fault
	Verdict  Verdict
	Lin      LinResult
	// Unconverged says how the fleet failed to settle on one holder after
	// the heal ("" when it did).
	Unconverged string
	// Strays are the Pods deleted by hand so that the fleet could converge.
	Strays []string
	// Broken says the fleet did not converge even after the strays were
	// removed and every agent restarted: later schedules would judge nothing.
	Broken bool
	// HealErr is what the heal could not undo.
	HealErr string
	Took    time.Duration
}

// Failed reports whether the schedule broke a promise.
func (r Report) Failed() bool {
	return r.Verdict.Failures() > 0 || r.Verdict.TokenProblems != "" || r.Lin.Result == porcupine.Illegal || r.Unconverged != ""
}

// Problems describes every failure of the schedule.
func (r Report) Problems() []string {
	var out []string
	for _, e := range r.Verdict.Episodes {
		if e.Limit == "" {
			out = append(out, "overlap: "+e.String())
		}
	}
	if r.Verdict.TokenProblems != "" {
		out = append(out, r.Verdict.TokenProblems)
	}
	if r.Lin.Result == porcupine.Illegal {
		out = append(out, "lease API history not linearizable:\n"+r.Lin.Detail)
	}
	if r.Unconverged != "" {
		out = append(out, "did not converge: "+r.Unconverged)
	}
	return out
}

// Run carries out one schedule, heals the fleet, waits until it converges
// and judges everything recorded meanwhile.
func (s *Suite) Run(ctx context.Context, sched Schedule) Report {
	began := time.Now()
	r := Report{Schedule: sched}
	rec := history.StartLeases(s.Fleet.Readers(), s.Workload.Namespace, []string{s.Workload.Name, reuseName(s.Workload)}, SweepInterval)
	s.Nemesis.Holder = func() string { return runner(rec.Snapshot()) }

	log := NewOpLog()
	nonce := time.Now().UnixMilli()
	h := &Hammer{Log: log, Clients: s.clients, Subject: localfleet.AdminSubject, TTL: 2 * time.Second,
		Keys: []string{fmt.Sprintf("chaos/lin-%d-%d-a", nonce, sched.Seed), fmt.Sprintf("chaos/lin-%d-%d-b", nonce, sched.Seed)}}
	hctx, stopHammer := context.WithCancel(ctx)
	hammered := make(chan struct{})
	go func() { defer close(hammered); h.Run(hctx, sched.Seed) }()

	s.Nemesis.Run(ctx, sched)
	// Let the last fault's consequences play out before healing.
	sleepUntil(ctx, time.Now().Add(time.Second))
	if err := s.Nemesis.Heal(ctx); err != nil {
		r.HealErr = err.Error()
		s.Logf("heal: %v", err)
	}
	stopHammer()
	<-hammered

	if err := s.awaitConvergence(ctx, rec, s.Converge); err != nil {
		// Repair as an operator would: delete the Pods no agent will stop,
		// restart every agent, and look again.
		r.Unconverged = err.Error()
		s.Logf("seed %d: not converged: %v; removing stray Pods and restarting every agent", sched.Seed, err)
		strays, err := s.Nemesis.RemoveStrays(ctx)
		r.Strays = strays
		if err != nil {
			s.Logf("remove strays: %v", err)
		}
		for _, m := range s.Fleet.Members {
			m.StopAgent()
			if err := m.StartAgent(m.Name); err != nil {
				s.Logf("restart %s's agent: %v", m.Name, err)
			}
		}
		if err := s.awaitConvergence(ctx, rec, 2*s.Converge); err != nil {
			r.Unconverged += "; after removing strays and restarting every agent: " + err.Error()
			r.Broken = true
		}
	}
	hist := rec.Stop()
	r.Faults = s.Nemesis.Faults()
	tb := time.Duration(s.Workload.TTLSeconds) * time.Second
	r.Verdict = Judge(hist, r.Faults, s.Nemesis.Outages(), tb, time.Duration(s.Workload.HeartbeatSeconds)*time.Second)
	r.Lin = log.CheckLinearizable(30 * time.Second)
	r.Took = time.Since(began)
	return r
}

// runner is the one cluster with ungated Pods in the last sweep, or "".
func runner(h history.History) string {
	if len(h) == 0 {
		return ""
	}
	if holders := h[len(h)-1].Holders(); len(holders) == 1 {
		return holders[0]
	}
	return ""
}

// awaitConvergence waits until one cluster runs every replica, for a
// second on end, its BerthLease says held and every other one's says
// waiting for it.
func (s *Suite) awaitConvergence(ctx context.Context, rec *history.Recorder, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	var since time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		holder := rec.Snapshot().Runner(int(s.Workload.Replicas))
		why := ""
		if holder == "" {
			why = "no single cluster runs every replica"
		} else {
			for _, m := range s.Fleet.Members {
				st := statusOf(ctx, m)
				want := reconciler.StateWaiting
				if m.Name == holder {
					want = reconciler.StateHeld
				}
				if st.LeaseState != want || st.CurrentHolder != holder {
					why = fmt.Sprintf("%s runs the workload but %s's BerthLease says %q held by %q", holder, m.Name, st.LeaseState, st.CurrentHolder)
					break
				}
			}
		}
		switch {
		case why != "":
			last, since = why, time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= time.Second:
			return nil
		}
		sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
	}
	return fmt.Errorf("not within %s: %s", timeout, last)
}

// statusOf reads the status of m's BerthLease (empty if it cannot).
func statusOf(ctx context.Context, m *localfleet.Member) berthv1alpha1.BerthLeaseStatus {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return m.BerthLease(ctx).Status
}

// Tally adds up reports.
type Tally struct {
	Schedules int
	// Overlaps counts overlaps outside the documented limit; Limit those
	// within it.
	Overlaps, Limit int
	// TokenProblems, NotLinearizable, LinInconclusive and Unconverged count
	// schedules.
	TokenProblems, NotLinearizable, LinInconclusive, Unconverged int
	LinOps, LinUnknown                                           int
	Faults                                                       map[Kind]int
	Failing                                                      []uint64
}

// Add counts one report.
func (t *Tally) Add(r Report) {
	if t.Faults == nil {
		t.Faults = map[Kind]int{}
	}
	t.Schedules++
	for _, e := range r.Verdict.Episodes {
		if e.Limit == "" {
			t.Overlaps++
		} else {
			t.Limit++
		}
	}
	if r.Verdict.TokenProblems != "" {
		t.TokenProblems++
	}
	switch r.Lin.Result {
	case porcupine.Illegal:
		t.NotLinearizable++
	case porcupine.Unknown:
		t.LinInconclusive++
	}
	t.LinOps += r.Lin.Ops
	t.LinUnknown += r.Lin.Unknown
	if r.Unconverged != "" {
		t.Unconverged++
	}
	for _, f := range r.Faults {
		if f.Skipped == "" {
			t.Faults[f.Kind]++
		}
	}
	if r.Failed() {
		t.Failing = append(t.Failing, r.Schedule.Seed)
	}
}

// String is the summary line; runs' lines add up field by field.
func (t Tally) String() string {
	var faults []string
	for _, k := range Kinds() {
		faults = append(faults, fmt.Sprintf("%s=%d", k, t.Faults[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(t.Faults)) {
		if !slices.Contains(Kinds(), k) {
			faults = append(faults, fmt.Sprintf("%s=%d", k, t.Faults[k]))
		}
	}
	s := fmt.Sprintf("soak: %d schedules, %d overlaps, %d overlaps within the documented limit (agent down or frozen past its deadline), "+
		"%d token regressions, %d not linearizable (%d inconclusive, %d lease API calls, %d of unknown outcome), %d not converged, faults: %s",
		t.Schedules, t.Overlaps, t.Limit, t.TokenProblems, t.NotLinearizable, t.LinInconclusive, t.LinOps, t.LinUnknown, t.Unconverged, strings.Join(faults, " "))
	if len(t.Failing) > 0 {
		var seeds []string
		for _, seed := range t.Failing {
			seeds = append(seeds, fmt.Sprint(seed))
		}
		s += "; failing seeds: " + strings.Join(seeds, " ")
	}
	return s
}
