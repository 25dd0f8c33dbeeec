package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
)

func TestExitCode(t *testing.T) {
	apiErr := func(code int) error {
		return fmt.Errorf("release lease a/b: %w", &client.APIError{StatusCode: code, Message: http.StatusText(code)})
	}
	cases := map[string]struct {
		err      error
		wantCode int
	}{
		"success":                 {err: nil, wantCode: 0},
		"usage":                   {err: usageErrorf("bad flag"), wantCode: 2},
		"wrapped usage":           {err: fmt.Errorf("x: %w", usageErrorf("bad flag")), wantCode: 2},
		"400 from the server":     {err: apiErr(http.StatusBadRequest), wantCode: 2},
		"413 from the server":     {err: apiErr(http.StatusRequestEntityTooLarge), wantCode: 2},
		"404":                     {err: apiErr(http.StatusNotFound), wantCode: 3},
		"409 release raced":       {err: apiErr(http.StatusConflict), wantCode: 4},
		"401":                     {err: apiErr(http.StatusUnauthorized), wantCode: 5},
		"403":                     {err: apiErr(http.StatusForbidden), wantCode: 5},
		"500":                     {err: apiErr(http.StatusInternalServerError), wantCode: 1},
		"503":                     {err: apiErr(http.StatusServiceUnavailable), wantCode: 1},
		"unexpected status":       {err: apiErr(http.StatusTeapot), wantCode: 1},
		"connection refused":      {err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), wantCode: 1},
		"deadline":                {err: fmt.Errorf("list leases: %w", context.DeadlineExceeded), wantCode: 1},
		"usage wrapping conflict": {err: &usageError{err: client.ErrConflict}, wantCode: 2},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.wantCode {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.wantCode)
			}
		})
	}
}

func TestOneLine(t *testing.T) {
	if got, want := oneLine(errors.New("a\nb\t c\n")), "a b c"; got != want {
		t.Errorf("oneLine = %q, want %q", got, want)
	}
}

func TestLeaseTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	items := []leaseapi.Lease{
		{Namespace: "payments", Name: "exporter", Holder: "east", FencingToken: 3, TTLSeconds: 30,
			AcquiredAt: now.Add(-2 * time.Hour), RenewedAt: now.Add(-18 * time.Second), ExpiresAt: now.Add(12 * time.Second)},
		{Namespace: "batch", Name: "nightly", FencingToken: 7},
		{Namespace: "batch", Name: "stale", Holder: "west/job", FencingToken: 1, ExpiresAt: now.Add(-time.Second)},
		{Namespace: "batch", Name: "moving", Holder: "west", FencingToken: 4, ExpiresAt: now.Add(5 * time.Second), Revoked: true},
		{Namespace: "batch", Name: "moved", Holder: "west", FencingToken: 5, ExpiresAt: now.Add(5 * time.Second), Revoked: true,
			Move: &leaseapi.Move{From: "west", To: "east"}},
		{Namespace: "batch", Name: "away", Holder: "west", FencingToken: 6, ExpiresAt: now.Add(5 * time.Second), Revoked: true,
			Move: &leaseapi.Move{From: "west"}},
		{Namespace: "batch", Name: "reserved", FencingToken: 7, Reservation: leaseapi.Reservation{ReservedFor: "east", ReservedUntil: now.Add(time.Second)}},
		{Namespace: "batch", Name: "not-west", FencingToken: 8, Reservation: leaseapi.Reservation{ReservedExcept: "west", ReservedUntil: now.Add(time.Second)}},
		{Namespace: "batch", Name: "ran-out", FencingToken: 9, Reservation: leaseapi.Reservation{ReservedFor: "east", ReservedUntil: now}},
	}
	cases := map[string]struct {
		wide bool
		want table
	}{
		"default": {want: table{
			header: []string{"NAMESPACE", "NAME", "HOLDER", "TOKEN", "EXPIRES"},
			rows: [][]string{
				{"payments", "exporter", "east", "3", "12s"},
				{"batch", "nightly", "<none>", "7", "<none>"},
				{"batch", "stale", "west/job", "1", "expired"},
				{"batch", "moving", "west (revoked)", "4", "5s"},
				{"batch", "moved", "west (moving to east)", "5", "5s"},
				{"batch", "away", "west (moving)", "6", "5s"},
				{"batch", "reserved", "<none> (reserved for east)", "7", "<none>"},
				{"batch", "not-west", "<none> (reserved, not west)", "8", "<none>"},
				{"batch", "ran-out", "<none>", "9", "<none>"},
			},
		}},
		"wide": {wide: true, want: table{
			header: []string{"NAMESPACE", "NAME", "HOLDER", "TOKEN", "EXPIRES", "TTL", "ACQUIRED", "RENEWED"},
			rows: [][]string{
				{"payments", "exporter", "east", "3", "12s", "30s", "120m", "18s"},
				{"batch", "nightly", "<none>", "7", "<none>", "<none>", "<none>", "<none>"},
				{"batch", "stale", "west/job", "1", "expired", "<none>", "<none>", "<none>"},
				{"batch", "moving", "west (revoked)", "4", "5s", "<none>", "<none>", "<none>"},
				{"batch", "moved", "west (moving to east)", "5", "5s", "<none>", "<none>", "<none>"},
				{"batch", "away", "west (moving)", "6", "5s", "<none>", "<none>", "<none>"},
				{"batch", "reserved", "<none> (reserved for east)", "7", "<none>", "<none>", "<none>", "<none>"},
				{"batch", "not-west", "<none> (reserved, not west)", "8", "<none>", "<none>", "<none>", "<none>"},
				{"batch", "ran-out", "<none>", "9", "<none>", "<none>", "<none>", "<none>"},
			},
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, leaseTable(items, now, tc.wide), cmp.AllowUnexported(table{})); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHistoryTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	terms := []leaseapi.Term{
		{Holder: "west", FencingToken: 4, AcquiredAt: now.Add(-90 * time.Second)},
		{Holder: "east", FencingToken: 3, AcquiredAt: now.Add(-2 * time.Hour), EndedAt: now.Add(-2 * time.Minute), Ending: leaseapi.TermMoved},
		{Holder: "east/job", FencingToken: 2, AcquiredAt: now.Add(-3 * time.Hour), EndedAt: now.Add(-2*time.Hour - time.Minute), Ending: leaseapi.TermExpired},
	}
	want := table{
		header: []string{"TOKEN", "HOLDER", "STARTED", "ENDED", "DURATION", "HOW"},
		rows: [][]string{
			{"4", "west", "90s", "<none>", "90s", "held"},
			{"3", "east", "120m", "2m", "118m", "moved"},
			{"2", "east/job", "3h", "121m", "59m", "expired"},
		},
	}
	if diff := cmp.Diff(want, historyTable(terms, now), cmp.AllowUnexported(table{})); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestClusterTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	items := []leaseapi.Cluster{
		{ID: "east", Fingerprint: "uid-1", AgentVersion: "v0.1.0", Labels: map[string]string{"zone": "b", "region": "eu"},
			LastSeen: now.Add(-4 * time.Second), Healthy: true, LeasesHeld: 2},
		{ID: "west", Fingerprint: "uid-2", LastSeen: now.Add(-5 * time.Minute), Cordoned: true},
	}
	want := table{
		header: []string{"ID", "HEALTHY", "CORDONED", "LEASES", "LAST-SEEN", "AGENT", "FINGERPRINT", "LABELS"},
		rows: [][]string{
			{"east", "true", "false", "2", "4s", "v0.1.0", "uid-1", "region=eu,zone=b"},
			{"west", "false", "true", "0", "5m", "<none>", "uid-2", "<none>"},
		},
	}
	if diff := cmp.Diff(want, clusterTable(items, now, true), cmp.AllowUnexported(table{})); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

// pager serves n leases in pages as the server does; it records the limits asked for.
type pager struct {
	n      int
	limits []int
	stuck  bool // answer the same continue token forever
}

func (p *pager) ListLeases(_ context.Context, opts client.ListOptions) (leaseapi.LeaseList, error) {
	p.limits = append(p.limits, opts.Limit)
	start := 0
	if opts.Continue != "" {
		start, _ = strconv.Atoi(opts.Continue)
	}
	end := min(start+opts.Limit, p.n)
	var out leaseapi.LeaseList
	for i := start; i < end; i++ {
		out.Items = append(out.Items, leaseapi.Lease{Namespace: "ns", Name: fmt.Sprintf("l%02d", i)})
	}
	if p.stuck {
		out.Continue = "1"
	} else if end < p.n {
		out.Continue = strconv.Itoa(end)
	}
	return out, nil
}

func TestListLeasesPaging(t *testing.T) {
	cases := map[string]struct {
		n            int
		opts         listOptions
		wantItems    int
		wantContinue string
		wantLimits   []int
	}{
		"empty":               {n: 0, opts: listOptions{chunkSize: 3}, wantItems: 0, wantLimits: []int{3}},
		"all in one page":     {n: 3, opts: listOptions{chunkSize: 5}, wantItems: 3, wantLimits: []int{5}},
		"all over pages":      {n: 7, opts: listOptions{chunkSize: 3}, wantItems: 7, wantLimits: []int{3, 3, 3}},
		"limit within a page": {n: 7, opts: listOptions{chunkSize: 5, limit: 2}, wantItems: 2, wantContinue: "2", wantLimits: []int{2}},
		"limit over pages":    {n: 7, opts: listOptions{chunkSize: 3, limit: 5}, wantItems: 5, wantContinue: "5", wantLimits: []int{3, 2}},
		"limit at the end":    {n: 4, opts: listOptions{chunkSize: 3, limit: 4}, wantItems: 4, wantLimits: []int{3, 1}},
		"limit beyond all":    {n: 4, opts: listOptions{chunkSize: 3, limit: 10}, wantItems: 4, wantLimits: []int{3, 3}},
		"resume":              {n: 7, opts: listOptions{chunkSize: 3, continueToken: "5"}, wantItems: 2, wantLimits: []int{3}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &pager{n: tc.n}
			got, err := listLeases(t.Context(), p, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Items) != tc.wantItems || got.Continue != tc.wantContinue {
				t.Errorf("got %d items, continue %q; want %d, %q", len(got.Items), got.Continue, tc.wantItems, tc.wantContinue)
			}
			if got.Items == nil {
				t.Error("items is nil; JSON would print null")
			}
			if diff := cmp.Diff(tc.wantLimits, p.limits); diff != "" {
				t.Errorf("limits asked for (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := listLeases(t.Context(), &pager{n: 5, stuck: true}, listOptions{chunkSize: 1}); err == nil {
		t.Error("a server repeating its continue token did not stop the list")
	}
}

func TestResolveConnection(t *testing.T) {
	env := map[string]string{envServer: "https://env:8443", envTokenFile: "/env/token", envCAFile: "/env/ca"}
	cases := map[string]struct {
		args      []string
		env       map[string]string
		want      connection
		wantUsage bool
	}{
		"defaults": {want: connection{server: defaultServer}},
		"environment": {env: env,
			want: connection{server: "https://env:8443", serverExplicit: true, tokenFile: "/env/token", caFile: "/env/ca"}},
		"flags win": {env: env, args: []string{"--server", "http://flag:1", "--token-file", "/flag/token", "--ca-file", "/flag/ca"},
			want: connection{server: "http://flag:1", serverExplicit: true, tokenFile: "/flag/token", caFile: "/flag/ca"}},
		"flag set to empty wins": {env: env, args: []string{"--token-file", ""},
			want: connection{server: "https://env:8443", serverExplicit: true, caFile: "/env/ca"}},
		"empty server":     {args: []string{"--server", ""}, wantUsage: true},
		"cert without key": {args: []string{"--client-cert", "c.pem"}, wantUsage: true},
		"key without cert": {args: []string{"--client-key", "k.pem"}, wantUsage: true},
		"negative timeout": {args: []string{"--timeout", "-1s"}, wantUsage: true},
		"client certificate": {args: []string{"--client-cert", "c.pem", "--client-key", "k.pem"},
			want: connection{server: defaultServer, clientCert: "c.pem", clientKey: "k.pem"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := &globalOptions{}
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.bind(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := resolveConnection(fs, o, func(k string) string { return tc.env[k] })
			if tc.wantUsage {
				if exitCode(err) != exitUsage {
					t.Fatalf("error %v, want a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(connection{})); diff != "" {
				t.Errorf("connection (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOutputFormat(t *testing.T) {
	cases := map[string]struct {
		want    outputFormat
		wantErr bool
	}{
		"":      {want: formatTable},
		"table": {want: formatTable},
		"wide":  {want: formatWide},
		"json":  {want: formatJSON},
		"yaml":  {want: formatYAML},
		"JSON":  {wantErr: true},
		"xml":   {wantErr: true},
	}
	for in, tc := range cases {
		t.Run(in, func(t *testing.T) {
			f := formatJSON
			err := f.Set(in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Set(%q) error %v, want error %t", in, err, tc.wantErr)
			}
			if err == nil && f != tc.want {
				t.Errorf("Set(%q) = %q, want %q", in, f, tc.want)
			}
		})
	}
}

func TestBuildVersion(t *testing.T) {
	info := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/berthfleet/berth", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
		},
	}
	got := buildVersion("", info)
	want := clientVersion{Version: "v0.3.0", GoVersion: "go1.26.8", Module: "github.com/berthfleet/berth",
		Revision: "abc123", Time: "2026-01-02T03:04:05Z", Modified: true, Platform: got.Platform}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("build info (-want +got):\n%s", diff)
	}
	if got := buildVersion("v1.0.0", info); got.Version != "v1.0.0" {
		t.Errorf("linked version %q, want it to win over the module version", got.Version)
	}
	if got := buildVersion("", nil); got.Version != "unknown" {
		t.Errorf("version without build info %q, want unknown", got.Version)
	}
}

// TestLogFlags checks that berthctl takes the logging flags of every Berth
// command: -v 1 shows the client's retries on stderr, silent by default.
func TestLogFlags(t *testing.T) {
	cases := map[string]struct {
		args        []string
		wantCode    int
		wantRetries bool
	}{
		"silent by default": {wantCode: exitError},
		"v 1 shows retries": {args: []string{"-v", "1"}, wantCode: exitError, wantRetries: true},
		"json lines":        {args: []string{"--log-format=json", "--v=1"}, wantCode: exitError, wantRetries: true},
		"unknown format":    {args: []string{"--log-format=xml"}, wantCode: exitUsage},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errOut strings.Builder
			args := append([]string{"--server", "http://127.0.0.1:1", "--timeout", "500ms", "leases", "get", "team/exporter"}, tc.args...)
			err := run(t.Context(), args, streams{out: &out, err: &errOut, getenv: func(string) string { return "" }})
			if got := exitCode(err); got != tc.wantCode {
				t.Errorf("exit code %d (%v), want %d", got, err, tc.wantCode)
			}
			if got := strings.Contains(errOut.String(), "retrying lease API call"); got != tc.wantRetries {
				t.Errorf("stderr shows retries: %v, want %v:\n%s", got, tc.wantRetries, errOut.String())
			}
		})
	}
}

// TestVersionFlag checks that berthctl --version prints one line naming
// the binary and its version, and leaves the version command alone.
func TestVersionFlag(t *testing.T) {
	cases := map[string]struct {
		args      []string
		wantOut   string
		wantStart string
	}{
		"--version":           {args: []string{"--version"}, wantOut: "berthctl " + linkedVersion() + "\n"},
		"the version command": {args: []string{"version"}, wantStart: "Client Version: " + linkedVersion() + "\n"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errOut strings.Builder
			err := run(t.Context(), tc.args, streams{out: &out, err: &errOut, getenv: func(string) string { return "" }})
			if err != nil {
				t.Fatalf("berthctl %v: %v (stderr %q)", tc.args, err, errOut.String())
			}
			if tc.wantOut != "" && out.String() != tc.wantOut {
				t.Errorf("stdout %q, want %q", out.String(), tc.wantOut)
			}
			if !strings.HasPrefix(out.String(), tc.wantStart) {
				t.Errorf("stdout %q, want it to start %q", out.String(), tc.wantStart)
			}
		})
	}
	if linkedVersion() == "" {
		t.Error("linkedVersion is empty: cobra would not add --version")
	}
}
