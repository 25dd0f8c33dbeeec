package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// result is every figure of one cell.
type result struct {
	Clusters  int           `json:"clusters"`
	N         int           `json:"n"`
	TTL       time.Duration `json:"ttl"`
	Heartbeat time.Duration `json:"heartbeat"`
	AgentArgs []string      `json:"agentArgs,omitempty"`
	Date      string        `json:"date"`
	Nproc     int           `json:"nproc"`
	LoadAvg   string        `json:"loadAvg"`
	// Create is how long creating every BerthLease in every cluster took.
	Create   time.Duration `json:"create"`
	Converge convergence   `json:"converge"`
	Steady   *figures      `json:"steady,omitempty"`
	Kill     move          `json:"kill"`
	Restart  outcome       `json:"restart"`
	Cordon   move          `json:"cordon"`
	// Skipped says why the phases after a phase that did not finish were
	// skipped.
	Skipped string        `json:"skipped,omitempty"`
	Wall    time.Duration `json:"wall"`
}

// outcome is how a phase ended: done after Seconds, or not done after
// Timeout with Got of Want.
type outcome struct {
	Done    bool          `json:"done"`
	Seconds float64       `json:"seconds,omitempty"`
	Got     int           `json:"got"`
	Want    int           `json:"want"`
	Timeout time.Duration `json:"timeout,omitempty"`
}

func done(took time.Duration, want int) outcome {
	return outcome{Done: true, Seconds: took.Seconds(), Got: want, Want: want}
}

func notDone(timeout time.Duration, got, want int) outcome {
	return outcome{Got: got, Want: want, Timeout: timeout}
}

func (o outcome) String() string {
	switch {
	case o.Done:
		return fmt.Sprintf("%.1f s", o.Seconds)
	case o.Want == 0:
		return "-"
	default:
		return fmt.Sprintf("not done after %s: %d of %d", o.Timeout, o.Got, o.Want)
	}
}

// convergence is phase 1.
type convergence struct {
	// AllHeld is until every lease was held at the lease API.
	AllHeld outcome `json:"allHeld"`
	// StatusesRight is until every cluster's status agreed: the holder's
	// `held`, every other cluster's `waiting`.
	StatusesRight outcome `json:"statusesRight"`
	// Held, Waiting and WantWaiting are the counts at the end.
	Held        int `json:"held"`
	Waiting     int `json:"waiting"`
	WantWaiting int `json:"wantWaiting"`
	// Traffic is what the lease API and the agents did meanwhile.
	Traffic figures `json:"traffic"`
}

// move is a kill or a cordon: the leases of Cluster moving to others.
type move struct {
	outcome
	Cluster      string  `json:"cluster"`
	FirstSeconds float64 `json:"firstSeconds"`
	LastSeconds  float64 `json:"lastSeconds"`
}

// figures are the rates and usage of a window.
type figures struct {
	Seconds float64 `json:"seconds"`
	// LeaseAPIRoutes is requests/s by route.
	LeaseAPIRoutes map[string]float64 `json:"leaseAPIRoutes"`
	LeaseAPI       usage              `json:"leaseAPI"`
	// Agents by cluster.
	Agents map[string]agentFigures `json:"agents"`
	// LostRenewals counts the lease API's `lost` outcomes; SelfFences and
	// AgentLost the agents' self-fences and Lost or SelfFenced transitions.
	LostRenewals float64 `json:"lostRenewals"`
	SelfFences   float64 `json:"selfFences"`
	AgentLost    float64 `json:"agentLost"`
	// HeldBy counts the leases each cluster held at the window's end
	// (steady state only).
	HeldBy map[string]int `json:"heldBy,omitempty"`
}

// agentFigures are one agent's usage and kube-apiserver requests/s.
type agentFigures struct {
	usage
	Writes float64 `json:"writesPerSecond"`
	Reads  float64 `json:"readsPerSecond"`
}

// row is a line of the table: a figure and how to show it for a cell.
type row struct {
	name string
	show func(r *result) string
}

// table renders every cell's figures as a markdown table, one column a cell.
func table(c config, results []*result) string {
	if len(results) == 0 {
		return "no cell finished\n"
	}
	target := c.ttl + 2*time.Second
	rows := []row{
		{"machine: cores, load average at start", func(r *result) string { return fmt.Sprintf("%d, %s", r.Nproc, r.LoadAvg) }},
		{"BerthLeases created in all clusters", func(r *result) string {
			return fmt.Sprintf("%d in %.1f s", r.N*r.Clusters, r.Create.Seconds())
		}},
		{"1. every lease held at the lease API (from the agents' start)", func(r *result) string { return r.Converge.AllHeld.String() }},
		{"1. every status right (holder `held`, others `waiting`)", func(r *result) string { return r.Converge.StatusesRight.String() }},
		{"1. at the end: held; waiting statuses", func(r *result) string {
			return fmt.Sprintf("%d of %d; %d of %d", r.Converge.Held, r.N, r.Converge.Waiting, r.Converge.WantWaiting)
		}},
		{"1. during convergence: agent kube-apiserver writes/s", func(r *result) string { return perAgent(r.Converge.Traffic, writesOf) }},
		{"1. during convergence: agent kube-apiserver reads/s", func(r *result) string { return perAgent(r.Converge.Traffic, readsOf) }},
		{"1. during convergence: agent CPU cores", func(r *result) string { return perAgent(r.Converge.Traffic, cpuOf) }},
		{"1. during convergence: agent max RSS MiB", func(r *result) string { return perAgent(r.Converge.Traffic, rssOf) }},
		{"1. during convergence: lease API requests/s", func(r *result) string {
			return fmt.Sprintf("%.0f", sumValues(r.Converge.Traffic.LeaseAPIRoutes))
		}},
	}
	for _, route := range steadyRoutes(results) {
		rows = append(rows, row{"2. lease API requests/s: " + shortRoute(route), steady(func(f *figures) string {
			return fmt.Sprintf("%.1f", f.LeaseAPIRoutes[route])
		})})
	}
	rows = append(rows,
		row{"2. leases held at the end, by cluster", steady(func(f *figures) string {
			var parts []string
			for _, name := range sortedKeys(f.HeldBy) {
				parts = append(parts, fmt.Sprintf("%s: %d", name, f.HeldBy[name]))
			}
			return orDash(strings.Join(parts, ", "))
		})},
		row{"2. lease API requests/s, all routes", steady(func(f *figures) string { return fmt.Sprintf("%.1f", sumValues(f.LeaseAPIRoutes)) })},
		row{"2. lease API CPU cores; max RSS MiB", steady(func(f *figures) string {
			return fmt.Sprintf("%.3f; %.0f", f.LeaseAPI.CPU, mib(f.LeaseAPI.MaxRSS))
		})},
		row{"2. agent CPU cores", steady(func(f *figures) string { return perAgent(*f, cpuOf) })},
		row{"2. agent max RSS MiB", steady(func(f *figures) string { return perAgent(*f, rssOf) })},
		row{"2. agent kube-apiserver writes/s (POST, PUT, PATCH, DELETE)", steady(func(f *figures) string { return perAgent(*f, writesOf) })},
		row{"2. agent kube-apiserver reads/s (GET, LIST, WATCH)", steady(func(f *figures) string { return perAgent(*f, readsOf) })},
		row{"2. missed renewals: self-fences; agents' Lost/SelfFenced; lease API `lost`", steady(func(f *figures) string {
			return fmt.Sprintf("%g; %g; %g", f.SelfFences, f.AgentLost, f.LostRenewals)
		})},
		row{"3. holder's agent killed: cluster, leases", func(r *result) string { return moveWho(r.Kill) }},
		row{"3. first lease held elsewhere (from the kill)", func(r *result) string { return moveAt(r.Kill, r.Kill.FirstSeconds) }},
		row{"3. last lease held elsewhere (from the kill)", func(r *result) string { return r.Kill.String() }},
		row{fmt.Sprintf("3. last − first (target ≤ TTL + 2 s = %s)", target), func(r *result) string {
			if !r.Kill.Done {
				return "-"
			}
			return fmt.Sprintf("%.1f s", r.Kill.LastSeconds-r.Kill.FirstSeconds)
		}},
		row{"4. killed agent restarted: every status right", func(r *result) string { return r.Restart.String() }},
		row{"4. cordon: cluster, leases", func(r *result) string { return moveWho(r.Cordon) }},
		row{"4. cordon: first lease held elsewhere", func(r *result) string { return moveAt(r.Cordon, r.Cordon.FirstSeconds) }},
		row{"4. cordon: every lease held elsewhere", func(r *result) string { return r.Cordon.String() }},
		row{"phases skipped", func(r *result) string { return orDash(r.Skipped) }},
		row{"wall time of the cell", func(r *result) string { return fmt.Sprintf("%.0f s", r.Wall.Seconds()) }},
	)

	var b strings.Builder
	b.WriteString("| figure |")
	for _, r := range results {
		fmt.Fprintf(&b, " %d clusters, N = %d |", r.Clusters, r.N)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(results)))
	b.WriteString("\n")
	for _, rw := range rows {
		fmt.Fprintf(&b, "| %s |", rw.name)
		for _, r := range results {
			fmt.Fprintf(&b, " %s |", rw.show(r))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// steady shows a steady-state figure, or "-" for a cell that has none.
func steady(show func(f *figures) string) func(r *result) string {
	return func(r *result) string {
		if r.Steady == nil {
			return "-"
		}
		return show(r.Steady)
	}
}

// steadyRoutes are the lease API routes that any cell's steady state used.
func steadyRoutes(results []*result) []string {
	seen := map[string]bool{}
	for _, r := range results {
		if r.Steady != nil {
			for route := range r.Steady.LeaseAPIRoutes {
				seen[route] = true
			}
		}
	}
	return sortedKeys(seen)
}

// shortRoute abbreviates a lease API route pattern for the table.
func shortRoute(route string) string {
	return strings.Replace(route, "/v1alpha1/namespaces/{namespace}/leases/{name}", "…/leases/{name}", 1)
}

func cpuOf(a agentFigures) string    { return fmt.Sprintf("%.3f", a.CPU) }
func rssOf(a agentFigures) string    { return fmt.Sprintf("%.0f", mib(a.MaxRSS)) }
func writesOf(a agentFigures) string { return fmt.Sprintf("%.1f", a.Writes) }
func readsOf(a agentFigures) string  { return fmt.Sprintf("%.1f", a.Reads) }

// perAgent shows a figure of every agent, by cluster.
func perAgent(f figures, show func(agentFigures) string) string {
	if len(f.Agents) == 0 {
		return "-"
	}
	var parts []string
	for _, name := range sortedKeys(f.Agents) {
		parts = append(parts, fmt.Sprintf("%s: %s", name, show(f.Agents[name])))
	}
	return strings.Join(parts, ", ")
}

func moveWho(m move) string {
	if m.Want == 0 {
		return "-"
	}
	return fmt.Sprintf("%s, %d", m.Cluster, m.Want)
}

func moveAt(m move, seconds float64) string {
	if m.Got == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f s", seconds)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
