package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// Expr is one PromQL expression and where it was found.
type Expr struct {
	// Where names the expression's place: a file and an alert, panel or
	// variable.
	Where string
	// Query is the expression, with Grafana's variables replaced.
	Query string
}

// promqlParser is the parser with Prometheus's default options, as a Prometheus
// server without feature flags reads rules.
var promqlParser = parser.NewParser(parser.Options{})

// LoadRules parses and validates a rule file as Prometheus does (unknown
// fields refused, every expression and template parsed) and also refuses a
// second YAML document, which Prometheus would ignore with a warning.
func LoadRules(path string) (*rulefmt.RuleGroups, error) {
	var warnings bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promqlParser, logger)
	if len(errs) > 0 {
		return nil, fmt.Errorf("parse rules: %w", errors.Join(errs...))
	}
	if warnings.Len() > 0 {
		return nil, fmt.Errorf("parse rules %s: %s", path, strings.TrimSpace(warnings.String()))
	}
	return groups, nil
}

// RuleExprs returns the expression of every rule in groups.
func RuleExprs(file string, groups *rulefmt.RuleGroups) []Expr {
	var out []Expr
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			out = append(out, Expr{Where: fmt.Sprintf("%s: group %s, rule %s", file, g.Name, name), Query: r.Expr})
		}
	}
	return out
}

// Dashboard is the part of a Grafana dashboard that holds queries.
type Dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []Panel `json:"panels"`
	Templating    struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; a row holds its collapsed panels.
type Panel struct {
	Title      string          `json:"title"`
	Type       string          `json:"type"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []Target        `json:"targets"`
	Panels     []Panel         `json:"panels"`
}

// Target is one query of a panel.
type Target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// Variable is a template variable. A query variable's query is a string or
// an object with a "query" field, as Grafana's versions wrote it.
type Variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// LoadDashboard reads a dashboard's JSON.
func LoadDashboard(path string) (*Dashboard, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read dashboard: %w", err)
	}
	d := &Dashboard{}
	if err := json.Unmarshal(data, d); err != nil {
		return nil, fmt.Errorf("decode dashboard %s: %w", path, err)
	}
	return d, nil
}

// DashboardExprs returns every Prometheus query of the dashboard: each
// panel's targets (rows' collapsed panels too) and each query variable's
// label_values or query_result selector, with Grafana's variables replaced.
func DashboardExprs(file string, d *Dashboard) ([]Expr, error) {
	var out []Expr
	var walk func(prefix string, panels []Panel)
	walk = func(prefix string, panels []Panel) {
		for _, p := range panels {
			where := fmt.Sprintf("%s: %spanel %q", file, prefix, p.Title)
			for _, t := range p.Targets {
				if t.Expr == "" {
					continue
				}
				out = append(out, Expr{Where: where + " target " + t.RefID, Query: ExpandGrafanaVars(t.Expr)})
			}
			walk(fmt.Sprintf("row %q, ", p.Title), p.Panels)
		}
	}
	walk("", d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := variableQuery(v.Query)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", file, v.Name, err)
		}
		sel, err := variableSelector(q)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", file, v.Name, err)
		}
		if sel != "" {
			out = append(out, Expr{Where: fmt.Sprintf("%s: variable %s", file, v.Name), Query: ExpandGrafanaVars(sel)})
		}
	}
	return out, nil
}

func variableQuery(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("decode query: %w", err)
	}
	return obj.Query, nil
}

// variableFunc matches the Prometheus data source's variable functions
// whose argument is PromQL: label_values(selector, label),
// query_result(expr) and metrics(regex) (whose argument is no selector).
var variableFunc = regexp.MustCompile(`(?s)^\s*(label_values|query_result|label_names|metrics)\((.*)\)\s*$`)

// variableSelector returns the PromQL within a variable's query: the
// selector of label_values, the expression of query_result; empty for
// label_values(label) and label_names() without a selector.
func variableSelector(q string) (string, error) {
	m := variableFunc.FindStringSubmatch(q)
	if m == nil {
		return "", fmt.Errorf("query %q is none of label_values, query_result, label_names", q)
	}
	arg := strings.TrimSpace(m[2])
	switch m[1] {
	case "label_values":
		i := strings.LastIndex(arg, ",")
		if i < 0 {
			return "", nil // label_values(label): every series
		}
		return strings.TrimSpace(arg[:i]), nil
	case "query_result", "label_names":
		return arg, nil
	default:
		return "", fmt.Errorf("query %q: metrics() names no metric to check", q)
	}
}

// grafanaVar matches Grafana's variable syntaxes: $name, ${name},
// ${name:format} and [[name]].
var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// ExpandGrafanaVars replaces Grafana's variables by sample values PromQL
// accepts where a dashboard uses them: Grafana's interval variables
// ($__rate_interval, $__interval, $__range...) by a duration, any other
// variable (a label value in a matcher) by a plain word.
func ExpandGrafanaVars(q string) string {
	return grafanaVar.ReplaceAllStringFunc(q, func(v string) string {
		m := grafanaVar.FindStringSubmatch(v)
		name := m[1] + m[2] + m[3]
		switch {
		case name == "__range_s" || name == "__interval_ms" || name == "__range_ms":
			return "300"
		case strings.HasPrefix(name, "__"):
			return "5m"
		default:
			return "sample"
		}
	})
}
