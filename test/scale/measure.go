package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/procfs"
)

// Metric names read from the lease API (leaseapi/server/metrics.go) and the
// agents (reconciler/metrics.go, and client-go's through controller-runtime).
const (
	metricRequests      = "berth_leaseapi_requests_total"
	metricOutcomes      = "berth_leaseapi_outcomes_total"
	metricRESTRequests  = "rest_client_requests_total"
	metricSelfFences    = "berth_agent_self_fence_total"
	metricTransitions   = "berth_agent_lease_transitions_total"
	transitionLost      = "Lost"
	transitionSelfFence = "SelfFenced"
	outcomeLost         = "lost"
)

// snapshot is one scrape of a /metrics endpoint.
type snapshot map[string]*dto.MetricFamily

// scrape reads url's Prometheus text.
func scrape(ctx context.Context, url string) (snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("scrape %s: %s: %s", url, resp.Status, body)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (snapshot, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return families, nil
}

// sum adds the values of name's counters (or gauges) whose labels match.
func (s snapshot) sum(name string, match func(labels map[string]string) bool) float64 {
	var total float64
	for _, m := range s[name].GetMetric() {
		if match != nil && !match(labelsOf(m)) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total
}

// by sums name's values per value of label.
func (s snapshot) by(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range s[name].GetMetric() {
		v := labelsOf(m)[label]
		switch {
		case m.Counter != nil:
			out[v] += m.GetCounter().GetValue()
		case m.Untyped != nil:
			out[v] += m.GetUntyped().GetValue()
		}
	}
	return out
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func labelIs(name string, values ...string) func(map[string]string) bool {
	return func(l map[string]string) bool { return slices.Contains(values, l[name]) }
}

// writeMethods are the client-go request methods that write.
var writeMethods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// usage is a process's share of a span: CPU in cores, the largest RSS seen.
type usage struct {
	CPU    float64 `json:"cpuCores"`
	MaxRSS uint64  `json:"maxRSSBytes"`
	// Samples counts the RSS samples taken (one a second).
	Samples int `json:"samples"`
}

// span measures processes' CPU over an interval (from /proc/<pid>/stat at
// its start and end) and samples their RSS every second.
type span struct {
	pids  map[string]int
	start time.Time
	cpu0  map[string]float64
	mu    sync.Mutex
	use   map[string]usage
	stopc chan struct{}
	done  chan struct{}
}

func beginSpan(pids map[string]int) *span {
	s := &span{pids: pids, start: time.Now(), cpu0: map[string]float64{}, use: map[string]usage{},
		stopc: make(chan struct{}), done: make(chan struct{})}
	for name, pid := range pids {
		if st, err := procStat(pid); err == nil {
			s.cpu0[name] = st.CPUTime()
		}
	}
	s.sampleRSS()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case <-tick.C:
				s.sampleRSS()
			}
		}
	}()
	return s
}

func procStat(pid int) (procfs.ProcStat, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	return p.Stat()
}

func (s *span) sampleRSS() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, pid := range s.pids {
		st, err := procStat(pid)
		if err != nil {
			continue // exited
		}
		u := s.use[name]
		u.MaxRSS = max(u.MaxRSS, uint64(st.ResidentMemory()))
		u.Samples++
		s.use[name] = u
	}
}

// end stops the sampling and returns each process's usage over the span.
func (s *span) end() (map[string]usage, time.Duration) {
	elapsed := time.Since(s.start)
	close(s.stopc)
	<-s.done
	s.sampleRSS()
	for name, pid := range s.pids {
		st, err := procStat(pid)
		cpu0, ok := s.cpu0[name]
		if err != nil || !ok {
			continue
		}
		u := s.use[name]
		u.CPU = (st.CPUTime() - cpu0) / elapsed.Seconds()
		s.use[name] = u
	}
	return s.use, elapsed
}
