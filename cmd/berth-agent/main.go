// Command berth-agent runs in every cluster of a fleet. It competes for the
// leases of the cluster's BerthLeases at the central lease API and lets their
// managed Pods run only while this cluster holds them.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berthfleet/berth/cmd/internal/flags"
	"github.com/berthfleet/berth/cmd/internal/logging"
	"github.com/berthfleet/berth/fleet"
	"github.com/berthfleet/berth/reconciler"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

// options are the command-line flags.
type options struct {
	clusterID              string
	leaseAPIURL            string
	leaseAPITokenFile      string
	leaseAPICAFile         string
	kubeconfig             string
	fleetKubeconfigDir     string
	managedWorkloads       bool
	operatorNamespace      string
	webhookPort            int
	webhookCertDir         string
	webhookCertSecret      string
	webhookService         string
	metricsBindAddress     string
	healthProbeBindAddress string
	leaderElect            bool
	election               electionTiming
	heartbeatInterval      time.Duration
	kubeAPIQPS             float32
	kubeAPIBurst           int
	concurrentReconciles   int
	fenceImage             string
	fenceLeaseAPIURL       string
	clusterLabels          map[string]string
	fleetViewInterval      time.Duration
	// showVersion prints the version and exits.
	showVersion bool
}

// The client-side rate limit towards each cluster's API server. client-go's
// own default (5 requests/s, bursts of 10) starves a cluster of thousands of
// BerthLeases. The agent writes status only on transitions, so in steady
// state it sends almost nothing; the limit paces the bursts: a cluster's
// first look at every BerthLease (a finalizer and a status write each) and
// a takeover of many leases at once (a status write, then the Pods'
// ungating). The API server's priority and fairness protects it beyond that.
const (
	defaultKubeAPIQPS   = 200
	defaultKubeAPIBurst = 400
)

func (o *options) bind(fs *pflag.FlagSet) {
	fs.StringVar(&o.clusterID, "cluster-id", "", "this cluster's id in the fleet; the holder of every lease (empty: each BerthLease's spec.holderIdentity)")
	fs.StringVar(&o.leaseAPIURL, "lease-api-url", "", "URL of berth-leaseapi, e.g. https://berth-leaseapi.example:8443")
	fs.StringVar(&o.leaseAPITokenFile, "lease-api-token-file", "", "file with the bearer token for the lease API (re-read when it changes)")
	fs.StringVar(&o.leaseAPICAFile, "lease-api-ca-file", "", "CA bundle that verifies the lease API's certificate")
	fs.StringVar(&o.fleetKubeconfigDir, "fleet-kubeconfig-dir", "", "fleet mode: one kubeconfig per cluster in this folder (<cluster>.kubeconfig, lease API token in <cluster>.token), cluster id = file name without extension; --kubeconfig is then the host cluster of leader election")
	fs.BoolVar(&o.managedWorkloads, "managed-workloads", false, "gate and stop the managed Pods of each BerthLease (needs Berth's admission installed)")
	fs.StringVar(&o.operatorNamespace, "operator-namespace", "berth-system", "namespace the agent runs in (leader election lives here)")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the admission webhook server")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "folder with tls.crt and tls.key for the webhook server (with --webhook-cert-secret the agent writes them; default then a new temporary folder)")
	fs.StringVar(&o.webhookCertSecret, "webhook-cert-secret", "", "the agent manages its webhook certificates in this Secret of --operator-namespace, writes them into --webhook-cert-dir and sets the webhook configurations' caBundle (empty: someone else, e.g. cert-manager, provides them in --webhook-cert-dir)")
	fs.StringVar(&o.webhookService, "webhook-service", "berth-agent-webhook", "the Service in --operator-namespace in front of the webhook server; with --webhook-cert-secret the certificate is for its DNS names")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", ":8080", "address of /metrics (0: off)")
	fs.StringVar(&o.healthProbeBindAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0: off)")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader among the agent's replicas (run two for availability)")
	fs.DurationVar(&o.election.LeaseDuration, "leader-elect-lease-duration", defaultElectionTiming.LeaseDuration, "how long a standby replica waits, after the leader's last renewal it saw, before it takes leadership over")
	fs.DurationVar(&o.election.RenewDeadline, "leader-elect-renew-deadline", defaultElectionTiming.RenewDeadline, "how long the leader acts after its last successful renewal of the election; below --leader-elect-lease-duration")
	fs.DurationVar(&o.election.RetryPeriod, "leader-elect-retry-period", defaultElectionTiming.RetryPeriod, "how often replicas try to renew or take the election")
	fs.DurationVar(&o.heartbeatInterval, "cluster-heartbeat-interval", 10*time.Second, "how often the cluster's registration is refreshed at the lease API")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", defaultKubeAPIQPS, "requests per second the agent sends to each cluster's API server, sustained (client-side rate limit)")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", defaultKubeAPIBurst, "requests the agent may send to each cluster's API server in a burst above --kube-api-qps")
	fs.IntVar(&o.concurrentReconciles, "concurrent-reconciles", reconciler.DefaultConcurrentReconciles, "BerthLeases reconciled at once (in fleet mode: over all clusters)")
	fs.StringVar(&o.fenceImage, "fence-image", "", "image that holds /usr/local/bin/berth-fence (Berth's agent image): admission takes berth-fence from it into the Pods of BerthLeases with spec.podFencing Exec (empty: such Pods are refused)")
	fs.StringVar(&o.fenceLeaseAPIURL, "fence-lease-api-url", "", "URL of berth-leaseapi as managed Pods reach it, for berth-fence (default: --lease-api-url); --lease-api-ca-file verifies it there too")
	fs.StringToStringVar(&o.clusterLabels, "cluster-labels", nil, "labels this cluster registers at the lease API, e.g. site=primary,region=eu (spec.placement selects clusters by them); in fleet mode, DIR/<cluster>.labels (the same form) replaces them for that cluster")
	fs.DurationVar(&o.fleetViewInterval, "fleet-view-interval", fleet.DefaultViewInterval, "how often the agent lists the fleet's clusters at the lease API: the view spec.placement's failback decides on, and spec.failover's check that another cluster is healthy")
	flags.Version(fs, &o.showVersion)
}

func (o *options) validate() error {
	switch {
	case o.leaseAPIURL == "":
		return fmt.Errorf("--lease-api-url is required")
	case o.kubeAPIQPS <= 0 || o.kubeAPIBurst < 1:
		return fmt.Errorf("--kube-api-qps must be above 0 and --kube-api-burst at least 1")
	case o.concurrentReconciles < 1:
		return fmt.Errorf("--concurrent-reconciles must be at least 1")
	case o.fleetViewInterval <= 0:
		return fmt.Errorf("--fleet-view-interval must be above 0")
	}
	if o.leaderElect {
		if err := o.election.validate(); err != nil {
			return err
		}
	}
	if err := validateLabels(o.clusterLabels); err != nil {
		return fmt.Errorf("--cluster-labels: %w", err)
	}
	if o.fenceImage != "" && (o.fleetKubeconfigDir != "" || !o.managedWorkloads) {
		return fmt.Errorf("--fence-image needs --managed-workloads and no --fleet-kubeconfig-dir: only an agent that serves the admission webhooks puts berth-fence into Pods")
	}
	if err := o.validateWebhookCerts(); err != nil {
		return err
	}
	switch {
	case o.fleetKubeconfigDir == "":
		return nil
	case o.clusterID != "":
		return fmt.Errorf("--cluster-id: in fleet mode each cluster's id is its kubeconfig's file name")
	case o.leaderElect && o.kubeconfig == "":
		return fmt.Errorf("--leader-elect in fleet mode needs --kubeconfig: the host cluster where the election runs")
	}
	if fi, err := os.Stat(o.fleetKubeconfigDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--fleet-kubeconfig-dir %s: not a folder", o.fleetKubeconfigDir)
	}
	return nil
}

// validateLabels checks that labels are valid Kubernetes labels, as
// spec.placement's selectors match them.
func validateLabels(labels map[string]string) error {
	for k, v := range labels {
		errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...)
		if len(errs) > 0 {
			return fmt.Errorf("%s=%s: %s", k, v, strings.Join(errs, "; "))
		}
	}
	return nil
}

// validateWebhookCerts checks the flags of agent-managed webhook certificates: only an
// agent that serves the webhooks (single-cluster, --managed-workloads) manages them.
func (o *options) validateWebhookCerts() error {
	if o.webhookCertSecret == "" {
		return nil
	}
	switch {
	case o.fleetKubeconfigDir != "":
		return fmt.Errorf("--webhook-cert-secret: fleet mode serves no admission webhooks")
	case !o.managedWorkloads:
		return fmt.Errorf("--webhook-cert-secret needs --managed-workloads: without it the agent serves no admission webhooks")
	}
	for _, f := range []struct {
		flag, value string
		check       func(string) []string
	}{
		{"--webhook-cert-secret", o.webhookCertSecret, validation.IsDNS1123Subdomain},
		{"--webhook-service", o.webhookService, validation.IsDNS1035Label},
		{"--operator-namespace", o.operatorNamespace, validation.IsDNS1123Label},
	} {
		if errs := f.check(f.value); len(errs) > 0 {
			return fmt.Errorf("%s %q: %s", f.flag, f.value, strings.Join(errs, "; "))
		}
	}
	return nil
}

func main() {
	o, logOpts, err := parseFlags(os.Args[1:], flag.CommandLine)
	if errors.Is(err, pflag.ErrHelp) {
		os.Exit(0)
	}
	if err == nil && o.showVersion {
		fmt.Println(flags.VersionLine("berth-agent", version))
		os.Exit(0)
	}
	var log logr.Logger
	if err == nil {
		log, err = logOpts.New(os.Stderr)
	}
	if err == nil {
		err = o.validate()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent:", err)
		os.Exit(2)
	}
	logging.Install(log)
	if err := run(ctrl.SetupSignalHandler(), o, log); err != nil {
		log.Error(err, "berth-agent failed")
		os.Exit(1)
	}
}

// parseFlags reads the command line: the agent's flags, the logging flags,
// and controller-runtime's --kubeconfig, which it registers on goFlags.
func parseFlags(args []string, goFlags *flag.FlagSet) (options, *logging.Options, error) {
	var o options
	logOpts := logging.NewOptions(logging.FormatText)
	fs := pflag.NewFlagSet("berth-agent", pflag.ContinueOnError)
	o.bind(fs)
	logOpts.AddFlags(fs)
	fs.AddGoFlagSet(goFlags)
	if err := flags.Parse(fs, args); err != nil {
		return o, nil, err
	}
	if f := goFlags.Lookup("kubeconfig"); f != nil {
		o.kubeconfig = f.Value.String()
	}
	return o, logOpts, nil
}
