package monitoring

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// repoRoot is the product's repository, from this file's place in it.
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

// The files under test, in deploy/monitoring.
var (
	agentRules    = filepath.Join(repoRoot, "deploy", "monitoring", "agent-rules.yaml")
	leaseAPIRules = filepath.Join(repoRoot, "deploy", "monitoring", "leaseapi-rules.yaml")
	dashboardFile = filepath.Join(repoRoot, "deploy", "monitoring", "dashboard.json")
	operationsDoc = filepath.Join(repoRoot, "docs", "operations.md")
)

// berthCheck is what the deployed expressions may name besides the binaries'
// metrics.
var berthCheck = Check{
	// up is Prometheus's own: 1 when a target's scrape succeeded. The
	// "agent down" and "lease API down" alerts need it, since a target that
	// is down exposes nothing.
	ExternalMetrics: []string{"up"},
	// Prometheus adds job and instance to every scraped series.
	TargetLabels: []string{"job", "instance"},
}

// deployedExprs returns every expression of the rule files and the
// dashboard, failing the test when one cannot be read.
func deployedExprs(t *testing.T) []Expr {
	t.Helper()
	var exprs []Expr
	for _, path := range []string{agentRules, leaseAPIRules} {
		groups, err := LoadRules(path)
		if err != nil {
			t.Fatal(err)
		}
		exprs = append(exprs, RuleExprs(filepath.Base(path), groups)...)
	}
	d, err := LoadDashboard(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dx, err := DashboardExprs(filepath.Base(dashboardFile), d)
	if err != nil {
		t.Fatal(err)
	}
	return append(exprs, dx...)
}

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	strip := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.ReplaceAll(strip.ReplaceAllString(strings.ToLower(strings.TrimSpace(title)), ""), " ", "-"))
	}
	return out
}

func TestRuleFiles(t *testing.T) {
	const runbooks = "https://github.com/berthfleet/berth/blob/main/docs/operations.md#"
	docAnchors := anchors(t, operationsDoc)
	seen := map[string]string{}
	for _, path := range []string{agentRules, leaseAPIRules} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			groups, err := LoadRules(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(groups.Groups) == 0 {
				t.Fatal("no rule groups")
			}
			for _, g := range groups.Groups {
				for _, r := range g.Rules {
					if r.Alert == "" {
						t.Errorf("group %s: recording rule %s: only alerts belong here", g.Name, r.Record)
						continue
					}
					if other, ok := seen[r.Alert]; ok {
						t.Errorf("alert %s is also in %s", r.Alert, other)
					}
					seen[r.Alert] = filepath.Base(path)
					if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
						t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, s)
					}
					for _, a := range []string{"summary", "description"} {
						if strings.TrimSpace(r.Annotations[a]) == "" {
							t.Errorf("alert %s: no %s annotation", r.Alert, a)
						}
					}
					anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbooks)
					switch {
					case !ok:
						t.Errorf("alert %s: runbook_url %q is not under %s", r.Alert, r.Annotations["runbook_url"], runbooks)
					case anchor != strings.ToLower(r.Alert):
						t.Errorf("alert %s: runbook anchor %q, want %q", r.Alert, anchor, strings.ToLower(r.Alert))
					case !slices.Contains(docAnchors, anchor):
						t.Errorf("alert %s: docs/operations.md has no heading for #%s", r.Alert, anchor)
					}
				}
			}
		})
	}
}

func TestDashboard(t *testing.T) {
	d, err := LoadDashboard(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d, want at least 39", d.SchemaVersion)
	}
	vars := map[string]Variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("variable datasource = %+v, want a data source variable of type prometheus", v)
	}
	for _, name := range []string{"cluster", "namespace"} {
		if vars[name].Type != "query" {
			t.Errorf("variable %s: type %q, want query", name, vars[name].Type)
		}
	}
	const wantDatasource = `{"type":"prometheus","uid":"${datasource}"}`
	var walk func(panels []Panel)
	walk = func(panels []Panel) {
		for _, p := range panels {
			if p.Type != "row" {
				if got := strings.Join(strings.Fields(string(p.Datasource)), ""); got != wantDatasource {
					t.Errorf("panel %q: datasource %s, want %s", p.Title, got, wantDatasource)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	exprs, err := DashboardExprs("dashboard.json", d)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range exprs {
		if _, err := Selectors(x.Query); err != nil {
			t.Errorf("%s: %v", x.Where, err)
		}
	}
}

func TestSelectors(t *testing.T) {
	cases := map[string]struct {
		query   string
		want    []Selector
		wantErr string
	}{
		"name and matchers": {
			query: `berth_agent_lease_held{cluster="east", namespace=~"team.*"} == 1`,
			want:  []Selector{{Metric: "berth_agent_lease_held", Labels: []string{"cluster", "namespace"}}},
		},
		"range selectors in functions and a binary operation": {
			query: `sum by (job) (rate(a_total{code=~"5.."}[5m])) / sum by (job) (rate(a_total[5m]))`,
			want:  []Selector{{Metric: "a_total", Labels: []string{"code"}}, {Metric: "a_total"}},
		},
		"histogram quantile": {
			query: `histogram_quantile(0.99, sum by (le) (rate(d_seconds_bucket{op="put"}[5m])))`,
			want:  []Selector{{Metric: "d_seconds_bucket", Labels: []string{"op"}}},
		},
		"__name__ matcher": {
			query: `{__name__="berth_leaseapi_leases_held", job="x"}`,
			want:  []Selector{{Metric: "berth_leaseapi_leases_held", Labels: []string{"job"}}},
		},
		"subquery and absent": {
			query: `absent(up{job="a"} == 1) or max_over_time(g[1h:5m])`,
			want:  []Selector{{Metric: "up", Labels: []string{"job"}}, {Metric: "g"}},
		},
		"regular expression on __name__": {
			query:   `{__name__=~"berth_.*"}`,
			wantErr: `matches metric names by __name__=~"berth_.*"`,
		},
		"no PromQL": {
			query:   `rate(x[5m]`,
			wantErr: "parse",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Selectors(tc.query)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Selectors(%q) error = %v, want one containing %q", tc.query, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Selectors(%q) (-want +got):\n%s", tc.query, diff)
			}
		})
	}
}

func TestExpandGrafanaVars(t *testing.T) {
	cases := map[string]struct {
		query, want string
	}{
		"rate interval":    {query: `rate(a[$__rate_interval])`, want: `rate(a[5m])`},
		"braced interval":  {query: `rate(a[${__interval}])`, want: `rate(a[5m])`},
		"label variable":   {query: `a{cluster=~"$cluster"}`, want: `a{cluster=~"sample"}`},
		"formatted":        {query: `a{cluster=~"${cluster:regex}"}`, want: `a{cluster=~"sample"}`},
		"old syntax":       {query: `a{cluster=~"[[cluster]]"}`, want: `a{cluster=~"sample"}`},
		"no variable":      {query: `sum(a)`, want: `sum(a)`},
		"range in seconds": {query: `a / $__range_s`, want: `a / 300`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ExpandGrafanaVars(tc.query)); diff != "" {
				t.Errorf("ExpandGrafanaVars(%q) (-want +got):\n%s", tc.query, diff)
			}
		})
	}
}

// TestProblems proves that the check can fail: against a small exposition,
// a made-up metric and a label no series has are reported, while a
// histogram's series, a target label and Prometheus's own up are not.
func TestProblems(t *testing.T) {
	const page = `# TYPE berth_agent_lease_held gauge
berth_agent_lease_held{cluster="east",namespace="payments",name="exporter"} 1
# TYPE berth_leaseapi_store_duration_seconds histogram
berth_leaseapi_store_duration_seconds_bucket{op="ping",le="0.1"} 1
berth_leaseapi_store_duration_seconds_bucket{op="ping",le="+Inf"} 1
berth_leaseapi_store_duration_seconds_sum{op="ping"} 0.01
berth_leaseapi_store_duration_seconds_count{op="ping"} 1
`
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	e := Exposition{}
	e.Add(families)
	cases := map[string]struct {
		query string
		want  []string
	}{
		"exposed gauge": {query: `berth_agent_lease_held{cluster="east", job="berth-agent"} == 1`},
		"histogram series": {
			query: `histogram_quantile(0.99, sum by (le) (rate(berth_leaseapi_store_duration_seconds_bucket{op="ping"}[5m]))) + rate(berth_leaseapi_store_duration_seconds_count[5m])`,
		},
		"Prometheus's own": {query: `absent(up{job=~".*berth.*"} == 1)`},
		"made-up metric": {
			query: `increase(berth_agent_made_up_total[5m]) > 0`,
			want:  []string{"x: metric berth_agent_made_up_total is not exposed"},
		},
		"made-up metric by __name__": {
			query: `{__name__="berth_leaseapi_made_up"}`,
			want:  []string{"x: metric berth_leaseapi_made_up is not exposed"},
		},
		"no such label": {
			query: `berth_agent_lease_held{lease="payments/exporter"}`,
			want:  []string{"x: metric berth_agent_lease_held has no label lease (it has cluster, name, namespace)"},
		},
		"a summary suffix on a gauge": {
			query: `berth_agent_lease_held_count`,
			want:  []string{"x: metric berth_agent_lease_held_count is not exposed"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := berthCheck.Problems([]Expr{{Where: "x", Query: tc.query}}, e)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Problems(%q) (-want +got):\n%s", tc.query, diff)
			}
		})
	}
}
