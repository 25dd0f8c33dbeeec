package monitoring

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Selector is one metric an expression selects, with the labels its
// matchers name.
type Selector struct {
	Metric string
	Labels []string
}

// Selectors parses q and returns every metric it selects (vector and range
// selectors, by name or by an equality matcher on __name__), in order of
// appearance. A selector that names no single metric (a regular expression
// on __name__, or none) is an error: it could not be checked.
func Selectors(q string) ([]Selector, error) {
	expr, err := promqlParser.ParseExpr(q)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", q, err)
	}
	var out []Selector
	var errs []string
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			switch {
			case m.Name != labels.MetricName:
				s.Labels = append(s.Labels, m.Name)
			case m.Type == labels.MatchEqual:
				s.Metric = m.Value
			default:
				errs = append(errs, fmt.Sprintf("selector %s matches metric names by %s", vs, m))
			}
		}
		if s.Metric == "" && len(errs) == 0 {
			errs = append(errs, fmt.Sprintf("selector %s names no metric", vs))
		}
		if s.Metric != "" {
			out = append(out, s)
		}
		return nil
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("%q: %s", q, strings.Join(errs, "; "))
	}
	return out, nil
}

// Exposition is what a set of scraped /metrics pages exposes: each metric
// family by name, merged over the pages.
type Exposition map[string]*dto.MetricFamily

// Add merges scraped families into e.
func (e Exposition) Add(families map[string]*dto.MetricFamily) {
	for name, f := range families {
		if old, ok := e[name]; ok {
			old.Metric = append(old.Metric, f.Metric...)
			continue
		}
		e[name] = f
	}
}

// family returns the family a selected metric name belongs to: the family
// of that name, or a histogram's or summary's whose _bucket, _sum or _count
// series it is.
func (e Exposition) family(name string) *dto.MetricFamily {
	if f, ok := e[name]; ok {
		return f
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f, ok := e[base]
		if !ok {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return f
		case dto.MetricType_SUMMARY:
			if suffix != "_bucket" {
				return f
			}
		}
	}
	return nil
}

// labelNames returns the label names of the family's series; a histogram's
// _bucket series also have le, a summary's quantile.
func labelNames(f *dto.MetricFamily, metric string) []string {
	set := map[string]bool{}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			set[l.GetName()] = true
		}
	}
	switch {
	case strings.HasSuffix(metric, "_bucket"):
		set["le"] = true
	case f.GetType() == dto.MetricType_SUMMARY && metric == f.GetName():
		set["quantile"] = true
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Check holds what may be selected without being exposed by Berth.
type Check struct {
	// ExternalMetrics are metrics that Prometheus itself makes (up,
	// ALERTS), not a scraped binary.
	ExternalMetrics []string
	// TargetLabels are labels Prometheus attaches to every scraped series
	// (job, instance), so a matcher may name them on any metric.
	TargetLabels []string
}

// Problems returns what is wrong with the selectors of exprs against e: a
// metric no binary exposes, or a matcher on a label that none of the
// metric's series has. Each problem names the expression's place.
func (c Check) Problems(exprs []Expr, e Exposition) []string {
	var out []string
	for _, x := range exprs {
		sels, err := Selectors(x.Query)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", x.Where, err))
			continue
		}
		for _, s := range sels {
			if slices.Contains(c.ExternalMetrics, s.Metric) {
				continue
			}
			f := e.family(s.Metric)
			if f == nil {
				out = append(out, fmt.Sprintf("%s: metric %s is not exposed", x.Where, s.Metric))
				continue
			}
			have := labelNames(f, s.Metric)
			for _, l := range s.Labels {
				if !slices.Contains(have, l) && !slices.Contains(c.TargetLabels, l) {
					out = append(out, fmt.Sprintf("%s: metric %s has no label %s (it has %s)", x.Where, s.Metric, l, strings.Join(have, ", ")))
				}
			}
		}
	}
	return out
}

// MetricNames returns the sorted, distinct metric names the expressions
// select.
func MetricNames(exprs []Expr) ([]string, error) {
	set := map[string]bool{}
	for _, x := range exprs {
		sels, err := Selectors(x.Query)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", x.Where, err)
		}
		for _, s := range sels {
			set[s.Metric] = true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// Scrape reads one /metrics page in Prometheus's text format.
func Scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return families, nil
}
