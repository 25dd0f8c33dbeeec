package main

import (
	"flag"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/cmd/internal/flags"
	"github.com/berthfleet/berth/cmd/internal/logging"
	"github.com/berthfleet/berth/fleet"
	"github.com/berthfleet/berth/reconciler"
)

// TestParseFlags checks the command lines that tests, docs and deployments
// pass (Go flag's spellings included) keep their meaning.
func TestParseFlags(t *testing.T) {
	defaults := options{operatorNamespace: "berth-system", webhookPort: 9443, webhookService: "berth-agent-webhook", metricsBindAddress: ":8080",
		healthProbeBindAddress: ":8081", heartbeatInterval: 10 * time.Second, fleetViewInterval: fleet.DefaultViewInterval,
		kubeAPIQPS: defaultKubeAPIQPS, kubeAPIBurst: defaultKubeAPIBurst, concurrentReconciles: reconciler.DefaultConcurrentReconciles,
		election: defaultElectionTiming}
	with := func(f func(*options)) options { o := defaults; f(&o); return o }
	cases := map[string]struct {
		args     []string
		want     options
		wantLogs logging.Options
	}{
		"defaults": {want: defaults, wantLogs: logging.Options{Format: logging.FormatText}},
		"per-cluster agent, as test/localfleet starts it": {
			args: []string{"--cluster-id", "east", "--kubeconfig", "east.kubeconfig", "--lease-api-url", "http://127.0.0.1:1",
				"--lease-api-token-file", "east.token", "--managed-workloads", "--webhook-port", "9999", "--webhook-cert-dir", "certs",
				"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cluster-heartbeat-interval", "2s"},
			want: with(func(o *options) {
				o.clusterID, o.kubeconfig, o.leaseAPIURL, o.leaseAPITokenFile = "east", "east.kubeconfig", "http://127.0.0.1:1", "east.token"
				o.managedWorkloads, o.webhookPort, o.webhookCertDir = true, 9999, "certs"
				o.metricsBindAddress, o.healthProbeBindAddress, o.heartbeatInterval = "0", "0", 2*time.Second
			}),
			wantLogs: logging.Options{Format: logging.FormatText},
		},
		"agent-managed webhook certificates, as the Helm chart starts it": {
			args: []string{"--lease-api-url", "http://x", "--managed-workloads", "--leader-elect",
				"--webhook-cert-secret", "berth-agent-webhook-tls", "--webhook-service", "berth-webhook"},
			want: with(func(o *options) {
				o.leaseAPIURL, o.managedWorkloads, o.leaderElect = "http://x", true, true
				o.webhookCertSecret, o.webhookService = "berth-agent-webhook-tls", "berth-webhook"
			}),
			wantLogs: logging.Options{Format: logging.FormatText},
		},
		"replicas with a short election, as the frozen-leader suite starts them": {
			args: []string{"--lease-api-url", "http://x", "--leader-elect", "--leader-elect-lease-duration", "4s",
				"--leader-elect-renew-deadline=1500ms", "--leader-elect-retry-period", "250ms"},
			want: with(func(o *options) {
				o.leaseAPIURL, o.leaderElect = "http://x", true
				o.election = electionTiming{LeaseDuration: 4 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 250 * time.Millisecond}
			}),
			wantLogs: logging.Options{Format: logging.FormatText},
		},
		"fleet agent at -v 1": {
			args:     []string{"--fleet-kubeconfig-dir", "dir", "--leader-elect=true", "--operator-namespace=berth", "-v", "1"},
			want:     with(func(o *options) { o.fleetKubeconfigDir, o.leaderElect, o.operatorNamespace = "dir", true, "berth" }),
			wantLogs: logging.Options{Format: logging.FormatText, Verbosity: 1},
		},
		"Go flag's single-dash spellings, as before pflag": {
			args: []string{"-cluster-id=east", "-lease-api-url", "http://x", "-kubeconfig=east.kubeconfig", "-managed-workloads", "-v", "2"},
			want: with(func(o *options) {
				o.clusterID, o.leaseAPIURL, o.kubeconfig, o.managedWorkloads = "east", "http://x", "east.kubeconfig", true
			}),
			wantLogs: logging.Options{Format: logging.FormatText, Verbosity: 2},
		},
		"klog's spellings": {
			args:     []string{"--v=4", "--vmodule=run=2"},
			want:     defaults,
			wantLogs: logging.Options{Format: logging.FormatText, Verbosity: 4, VModule: "run=2"},
		},
		"json": {
			args:     []string{"--log-format", "json", "--v", "2"},
			want:     defaults,
			wantLogs: logging.Options{Format: logging.FormatJSON, Verbosity: 2},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			goFlags := flag.NewFlagSet("go", flag.ContinueOnError)
			goFlags.String("kubeconfig", "", "as controller-runtime registers it")
			o, logs, err := parseFlags(tc.args, goFlags)
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

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	// valid is o with the flags that have defaults at them.
	valid := func(o options) options {
		o.kubeAPIQPS, o.kubeAPIBurst, o.concurrentReconciles = defaultKubeAPIQPS, defaultKubeAPIBurst, reconciler.DefaultConcurrentReconciles
		o.fleetViewInterval, o.election = fleet.DefaultViewInterval, defaultElectionTiming
		return o
	}
	cases := map[string]struct {
		o       options
		wantErr bool
	}{
		"single-cluster":                              {o: valid(options{leaseAPIURL: "http://x"})},
		"no lease API":                                {o: valid(options{}), wantErr: true},
		"fleet mode":                                  {o: valid(options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir})},
		"fleet mode with leader election":             {o: valid(options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir, leaderElect: true, kubeconfig: "host.kubeconfig"})},
		"fleet mode elects on no host":                {o: valid(options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir, leaderElect: true}), wantErr: true},
		"fleet mode names its clusters":               {o: valid(options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir, clusterID: "east"}), wantErr: true},
		"fleet folder missing":                        {o: valid(options{leaseAPIURL: "http://x", fleetKubeconfigDir: dir + "/missing"}), wantErr: true},
		"agent-managed certificates":                  {o: valid(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true}))},
		"agent-managed certificates, own folder":      {o: valid(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true, webhookCertDir: dir}))},
		"agent-managed certificates without webhooks": {o: valid(selfManaged(options{leaseAPIURL: "http://x"})), wantErr: true},
		"agent-managed certificates in fleet mode": {
			o: valid(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true, fleetKubeconfigDir: dir})), wantErr: true,
		},
		"Secret name not a DNS subdomain": {
			o: valid(changed(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true}), func(o *options) { o.webhookCertSecret = "Berth_TLS" })), wantErr: true,
		},
		"no Service": {
			o: valid(changed(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true}), func(o *options) { o.webhookService = "" })), wantErr: true,
		},
		"Service name not a DNS label": {
			o: valid(changed(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true}), func(o *options) { o.webhookService = "berth.webhook" })), wantErr: true,
		},
		"namespace not a DNS label": {
			o: valid(changed(selfManaged(options{leaseAPIURL: "http://x", managedWorkloads: true}), func(o *options) { o.operatorNamespace = "berth.system" })), wantErr: true,
		},
		"bad Service name, certificates not managed": {o: valid(options{leaseAPIURL: "http://x", webhookService: "berth.webhook"})},
		"no client rate":  {o: options{leaseAPIURL: "http://x", kubeAPIBurst: 1, concurrentReconciles: 1, fleetViewInterval: time.Second}, wantErr: true},
		"no reconciles":   {o: options{leaseAPIURL: "http://x", kubeAPIQPS: 1, kubeAPIBurst: 1, fleetViewInterval: time.Second}, wantErr: true},
		"no fleet view":   {o: changed(valid(options{leaseAPIURL: "http://x"}), func(o *options) { o.fleetViewInterval = 0 }), wantErr: true},
		"cluster labels":  {o: valid(options{leaseAPIURL: "http://x", clusterLabels: map[string]string{"site": "primary", "topology.example.com/zone": "eu-1"}})},
		"bad label key":   {o: valid(options{leaseAPIURL: "http://x", clusterLabels: map[string]string{"site primary": "x"}}), wantErr: true},
		"bad label value": {o: valid(options{leaseAPIURL: "http://x", clusterLabels: map[string]string{"site": "primary/eu"}}), wantErr: true},
		"election's renew deadline past its lease": {
			o: changed(valid(options{leaseAPIURL: "http://x", leaderElect: true}), func(o *options) { o.election.RenewDeadline = o.election.LeaseDuration }), wantErr: true,
		},
		"election's lease in fractions of a second": {
			o: changed(valid(options{leaseAPIURL: "http://x", leaderElect: true}), func(o *options) {
				o.election = electionTiming{LeaseDuration: 5900 * time.Millisecond, RenewDeadline: 3 * time.Second, RetryPeriod: time.Second}
			}), wantErr: true,
		},
		"election's renew deadline within the rounded second and the margin": {
			o: changed(valid(options{leaseAPIURL: "http://x", leaderElect: true}), func(o *options) {
				o.election = electionTiming{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 250 * time.Millisecond}
			}), wantErr: true,
		},
		"election at the shortest renew deadline its lease allows": {
			o: changed(valid(options{leaseAPIURL: "http://x", leaderElect: true}), func(o *options) {
				o.election = electionTiming{LeaseDuration: 4 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond}
			}),
		},
		"election retried slower than its renew deadline": {
			o: changed(valid(options{leaseAPIURL: "http://x", leaderElect: true}), func(o *options) { o.election.RetryPeriod = o.election.RenewDeadline }), wantErr: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if err := tc.o.validate(); (err != nil) != tc.wantErr {
				t.Errorf("validate() = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

// selfManaged is o with agent-managed webhook certificates, at the default Service and
// namespace.
func selfManaged(o options) options {
	o.webhookCertSecret, o.webhookService, o.operatorNamespace = "berth-agent-webhook-tls", "berth-agent-webhook", "berth-system"
	return o
}

// changed is o after f.
func changed(o options, f func(*options)) options { f(&o); return o }

func TestClusterTokenFile(t *testing.T) {
	dir := t.TempDir()
	o := options{fleetKubeconfigDir: dir, leaseAPITokenFile: "/shared.token"}
	if got := clusterTokenFile(o, "east"); got != "/shared.token" {
		t.Errorf("without east.token: %q, want the shared --lease-api-token-file", got)
	}
	if err := writeFile(dir + "/east.token"); err != nil {
		t.Fatal(err)
	}
	if got, want := clusterTokenFile(o, "east"), dir+"/east.token"; got != want {
		t.Errorf("with east.token: %q, want %q", got, want)
	}
}

func TestClusterLabels(t *testing.T) {
	dir := t.TempDir()
	o := options{fleetKubeconfigDir: dir, clusterLabels: map[string]string{"site": "backup"}}
	if got := clusterLabels(o, "east", logr.Discard()); !maps.Equal(got, o.clusterLabels) {
		t.Errorf("without east.labels: %v, want --cluster-labels", got)
	}
	if err := os.WriteFile(dir+"/east.labels", []byte("site=primary, region=eu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := clusterLabels(o, "east", logr.Discard()), map[string]string{"site": "primary", "region": "eu"}; !maps.Equal(got, want) {
		t.Errorf("with east.labels: %v, want %v", got, want)
	}
	if err := os.WriteFile(dir+"/west.labels", []byte("site=primary/eu"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := clusterLabels(o, "west", logr.Discard()); !maps.Equal(got, o.clusterLabels) {
		t.Errorf("with bad labels in west.labels: %v, want --cluster-labels", got)
	}
}

func writeFile(path string) error { return os.WriteFile(path, []byte("token"), 0o600) }

// TestVersionFlag checks that the command binds --version (flags.Version; its spellings are
// tested there) and prints its own name with the stamped version.
func TestVersionFlag(t *testing.T) {
	cases := map[string]struct {
		args []string
		want bool
	}{
		"absent":           {want: false},
		"with other flags": {args: []string{"--cluster-id", "east", "--version"}, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o, _, err := parseFlags(tc.args, flag.NewFlagSet("go", flag.ContinueOnError))
			if err != nil {
				t.Fatal(err)
			}
			if o.showVersion != tc.want {
				t.Errorf("showVersion = %t, want %t", o.showVersion, tc.want)
			}
		})
	}
	if got, want := flags.VersionLine("berth-agent", version), "berth-agent dev"; got != want {
		t.Errorf("version line %q, want %q", got, want)
	}
}
