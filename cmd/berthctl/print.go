package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/berthfleet/berth/leaseapi"
)

// outputFormat is the value of -o. It refuses unknown formats while the flags
// are parsed, so that a typo is a usage error before any request.
type outputFormat string

const (
	formatTable outputFormat = ""
	formatWide  outputFormat = "wide"
	formatJSON  outputFormat = "json"
	formatYAML  outputFormat = "yaml"
)

var _ pflag.Value = (*outputFormat)(nil)

func (f *outputFormat) String() string { return string(*f) }
func (f *outputFormat) Type() string   { return "format" }
func (f *outputFormat) Set(s string) error {
	switch v := outputFormat(s); v {
	case formatTable, formatWide, formatJSON, formatYAML:
		*f = v
		return nil
	case "table":
		*f = formatTable
		return nil
	}
	return fmt.Errorf("unknown output format %q: want table, wide, json or yaml", s)
}

func bindOutput(fs *pflag.FlagSet, f *outputFormat) {
	fs.VarP(f, "output", "o", "output format: table, wide, json or yaml")
}

// table is a header and rows of cells.
type table struct {
	header []string
	rows   [][]string
}

// printObject writes obj as JSON or YAML, or the table of it otherwise.
func printObject(w io.Writer, format outputFormat, obj any, tab func(wide bool) table) error {
	switch format {
	case formatJSON:
		data, err := json.MarshalIndent(obj, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", data)
		return err
	case formatYAML:
		data, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
		_, err = w.Write(data)
		return err
	}
	return writeTable(w, tab(format == formatWide))
}

// writeTable aligns a table as kubectl does.
func writeTable(w io.Writer, t table) error {
	tw := tabwriter.NewWriter(w, 6, 4, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

const none = "<none>"

// leaseTable is the table of leases as seen at now.
func leaseTable(items []leaseapi.Lease, now time.Time, wide bool) table {
	t := table{header: []string{"NAMESPACE", "NAME", "HOLDER", "TOKEN", "EXPIRES"}}
	if wide {
		t.header = append(t.header, "TTL", "ACQUIRED", "RENEWED")
	}
	for _, l := range items {
		holder, expires := l.Holder, until(now, l.ExpiresAt)
		switch {
		case holder == "":
			holder, expires = none, none
		case l.Move != nil && l.Move.To != "":
			holder += " (moving to " + l.Move.To + ")"
		case l.Move != nil:
			holder += " (moving)"
		case l.Revoked:
			// Its holder hands it over; it ends at the latest at EXPIRES.
			holder += " (revoked)"
		}
		if l.Holder == "" && l.ReservedUntil.After(now) {
			if l.ReservedFor != "" {
				holder = none + " (reserved for " + l.ReservedFor + ")"
			} else {
				holder = none + " (reserved, not " + l.ReservedExcept + ")"
			}
		}
		r := []string{l.Namespace, l.Name, holder, strconv.Itoa(int(l.FencingToken)), expires}
		if wide {
			ttl := none
			if l.TTLSeconds > 0 {
				ttl = duration.HumanDuration(time.Duration(l.TTLSeconds) * time.Second)
			}
			r = append(r, ttl, ago(now, l.AcquiredAt), ago(now, l.RenewedAt))
		}
		t.rows = append(t.rows, r)
	}
	return t
}

// historyTable is the table of a lease's terms as seen at now: when each
// began and ended (how long ago), how long it lasted, and how it ended; the
// live term's HOW is "held" and it has lasted until now.
func historyTable(terms []leaseapi.Term, now time.Time) table {
	t := table{header: []string{"TOKEN", "HOLDER", "STARTED", "ENDED", "DURATION", "HOW"}}
	for _, term := range terms {
		ended, how, end := ago(now, term.EndedAt), term.Ending, term.EndedAt
		if term.EndedAt.IsZero() {
			how, end = "held", now
		}
		lasted := none
		if !term.AcquiredAt.IsZero() {
			lasted = duration.HumanDuration(max(end.Sub(term.AcquiredAt), 0))
		}
		t.rows = append(t.rows, []string{strconv.Itoa(int(term.FencingToken)), term.Holder, ago(now, term.AcquiredAt), ended, lasted, how})
	}
	return t
}

// clusterTable is the table of clusters as seen at now.
func clusterTable(items []leaseapi.Cluster, now time.Time, wide bool) table {
	t := table{header: []string{"ID", "HEALTHY", "CORDONED", "LEASES", "LAST-SEEN", "AGENT"}}
	if wide {
		t.header = append(t.header, "FINGERPRINT", "LABELS")
	}
	for _, c := range items {
		agent := c.AgentVersion
		if agent == "" {
			agent = none
		}
		r := []string{c.ID, strconv.FormatBool(c.Healthy), strconv.FormatBool(c.Cordoned), strconv.Itoa(c.LeasesHeld), ago(now, c.LastSeen), agent}
		if wide {
			r = append(r, c.Fingerprint, labels(c.Labels))
		}
		t.rows = append(t.rows, r)
	}
	return t
}

// until is how long from now to t ("12s"), "expired" when t has passed.
// The times come from the server's clock; a skewed local clock shifts them.
func until(now, t time.Time) string {
	if t.IsZero() {
		return none
	}
	d := t.Sub(now)
	if d <= 0 {
		return "expired"
	}
	return duration.HumanDuration(d)
}

// ago is how long before now t was ("12s"), "<none>" for a zero time.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return none
	}
	return duration.HumanDuration(max(now.Sub(t), 0))
}

// labels prints a label map as k=v pairs sorted by key.
func labels(m map[string]string) string {
	if len(m) == 0 {
		return none
	}
	pairs := make([]string, 0, len(m))
	for k, v := range m {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}
