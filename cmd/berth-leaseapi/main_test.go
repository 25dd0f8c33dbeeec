package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/cmd/internal/flags"
	"github.com/berthfleet/berth/cmd/internal/logging"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/server"
)

// TestParseFlags checks the command lines that tests, hack/bench.sh and docs
// pass keep their meaning, and that the logs stay JSON unless asked.
func TestParseFlags(t *testing.T) {
	defaults := options{listen: "127.0.0.1:8443", metricsListen: "127.0.0.1:9090", store: "sqlite",
		sqlitePath: "./berth-leases.db", postgresMigrate: true, coordinationNamespace: "berth-leases",
		limits: server.Limits{ReadHeaderTimeout: server.DefaultReadHeaderTimeout, BodyReadTimeout: server.DefaultBodyReadTimeout,
			IdleTimeout: server.DefaultIdleTimeout, MaxHeaderBytes: server.DefaultMaxHeaderBytes},
		watch: server.WatchOptions{MaxWatches: server.DefaultMaxWatches, MaxWatchesPerSubject: server.DefaultMaxWatchesPerSubject,
			MaxDuration: server.DefaultMaxWatchDuration}, historyTerms: lease.DefaultHistoryTerms, clusterTTL: lease.DefaultClusterTTL}
	with := func(f func(*options)) options { o := defaults; f(&o); return o }
	cases := map[string]struct {
		args     []string
		want     options
		wantLogs logging.Options
	}{
		"defaults": {want: defaults, wantLogs: logging.Options{Format: logging.FormatJSON}},
		"metrics off, as the tests run it": {
			args: []string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--sqlite-path", "x.db", "--postgres-migrate=false"},
			want: with(func(o *options) {
				o.listen, o.metricsListen, o.sqlitePath, o.postgresMigrate = "127.0.0.1:0", "", "x.db", false
			}),
			wantLogs: logging.Options{Format: logging.FormatJSON},
		},
		"service account keys": {
			args:     []string{"--token-file", "tokens", "--service-account-keys-dir", "/etc/berth/cluster-keys"},
			want:     with(func(o *options) { o.tokenFile, o.serviceAccountKeysDir = "tokens", "/etc/berth/cluster-keys" }),
			wantLogs: logging.Options{Format: logging.FormatJSON},
		},
		"history off": {
			args:     []string{"--history-terms", "0"},
			want:     with(func(o *options) { o.historyTerms = 0 }),
			wantLogs: logging.Options{Format: logging.FormatJSON},
		},
		"a short cluster TTL, as the placement suites run it": {
			args:     []string{"--cluster-ttl", "3s"},
			want:     with(func(o *options) { o.clusterTTL = 3 * time.Second }),
			wantLogs: logging.Options{Format: logging.FormatJSON},
		},
		"-v 4":          {args: []string{"-v", "4"}, want: defaults, wantLogs: logging.Options{Format: logging.FormatJSON, Verbosity: 4}},
		"text at --v=1": {args: []string{"--log-format=text", "--v=1"}, want: defaults, wantLogs: logging.Options{Format: logging.FormatText, Verbosity: 1}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o, logs, err := parseFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, o, cmp.AllowUnexported(options{})); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLogs, *logs); diff != "" {
				t.Errorf("logging options (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHistoryTermsBounds: --history-terms is refused outside its bounds,
// and past the annotation's room with --store kubernetes; 0 turns recording
// off (lease.Options has that as negative).
func TestHistoryTermsBounds(t *testing.T) {
	cases := map[string]struct {
		args        []string
		wantErr     string
		wantService int
	}{
		"default":                   {wantService: lease.DefaultHistoryTerms},
		"off":                       {args: []string{"--history-terms=0"}, wantService: -1},
		"at the bound":              {args: []string{"--history-terms=1000"}, wantService: 1000},
		"negative":                  {args: []string{"--history-terms=-1"}, wantErr: "--history-terms must be between 0 and 1000"},
		"past the bound":            {args: []string{"--history-terms=1001"}, wantErr: "--history-terms must be between 0 and 1000"},
		"past the Kubernetes bound": {args: []string{"--store=kubernetes", "--history-terms=201"}, wantErr: "at most 200 with --store kubernetes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o, _, err := parseFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			err = o.checkLimits()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("checkLimits() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := o.serviceHistoryTerms(); got != tc.wantService {
				t.Errorf("service history terms = %d, want %d", got, tc.wantService)
			}
		})
	}
}

// TestVersionFlag checks that the command binds --version (flags.Version; its spellings are
// tested there) and prints its own name with the stamped version.
func TestVersionFlag(t *testing.T) {
	cases := map[string]struct {
		args []string
		want bool
	}{
		"absent":           {want: false},
		"with other flags": {args: []string{"--store", "postgres", "--version"}, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o, _, err := parseFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if o.showVersion != tc.want {
				t.Errorf("showVersion = %t, want %t", o.showVersion, tc.want)
			}
		})
	}
	if got, want := flags.VersionLine("berth-leaseapi", version), "berth-leaseapi dev"; got != want {
		t.Errorf("version line %q, want %q", got, want)
	}
}
