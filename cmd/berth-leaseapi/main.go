// Command berth-leaseapi is Berth's central lease API: one lease per workload
// with a fencing token, and the registry of the fleet's clusters.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"

	"github.com/berthfleet/berth/cmd/internal/flags"
	"github.com/berthfleet/berth/cmd/internal/logging"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/server"
	"github.com/berthfleet/berth/leaseapi/store/kubernetes"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	o, logOpts, err := parseFlags(os.Args[1:])
	if errors.Is(err, pflag.ErrHelp) {
		os.Exit(0)
	}
	if err == nil && o.showVersion {
		fmt.Println(flags.VersionLine("berth-leaseapi", version))
		os.Exit(0)
	}
	var log logr.Logger
	if err == nil {
		log, err = logOpts.New(os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-leaseapi:", err)
		os.Exit(2)
	}
	logging.Install(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error(err, "berth-leaseapi failed")
		os.Exit(1)
	}
}

// parseFlags reads the command line: the server's flags and the logging
// flags (JSON lines by default).
func parseFlags(args []string) (options, *logging.Options, error) {
	var o options
	logOpts := logging.NewOptions(logging.FormatJSON)
	fs := pflag.NewFlagSet("berth-leaseapi", pflag.ContinueOnError)
	o.bind(fs)
	logOpts.AddFlags(fs)
	return o, logOpts, flags.Parse(fs, args)
}

// options are the command-line flags.
type options struct {
	listen        string
	metricsListen string
	store         string
	sqlitePath    string
	postgresDSN   string
	// postgresDSNFile holds the DSN instead of the command line.
	postgresDSNFile string
	// postgresMigrate: migrate the schema on start, else only verify it.
	postgresMigrate bool
	// kubeconfig and coordinationNamespace place --store kubernetes.
	kubeconfig            string
	coordinationNamespace string
	tokenFile             string
	adminSubjects         string
	tlsCertFile           string
	tlsKeyFile            string
	clientCAFile          string
	// serviceAccountKeysDir holds the clusters' service account signing
	// keys, one "<cluster-id>.json" JWKS each: Pods confirm leases with
	// their tokens.
	serviceAccountKeysDir string
	// limits bound slow and large requests.
	limits server.Limits
	// watch bounds watch streams.
	watch server.WatchOptions
	// historyTerms is how many ended terms of each lease are kept.
	historyTerms int
	// clusterTTL is how long a cluster counts as healthy after a heartbeat.
	clusterTTL time.Duration
	// showVersion prints the version and exits.
	showVersion bool
}

func (o *options) bind(fs *pflag.FlagSet) {
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8443", "address of the lease API")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9090", "address of /metrics (empty: off)")
	fs.StringVar(&o.store, "store", "sqlite", "store backend: sqlite (one process, embedded), postgres or kubernetes (several replicas on one database or cluster)")
	fs.StringVar(&o.sqlitePath, "sqlite-path", "./berth-leases.db", "file of the embedded SQLite store")
	fs.StringVar(&o.postgresDSN, "postgres-dsn", "", "PostgreSQL connection string (with --store postgres)")
	fs.StringVar(&o.postgresDSNFile, "postgres-dsn-file", "", "file holding the PostgreSQL connection string, instead of --postgres-dsn")
	fs.BoolVar(&o.postgresMigrate, "postgres-migrate", true, "create and migrate the PostgreSQL schema on start; false only verifies it, for a role without rights to alter it")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "central cluster of --store kubernetes (empty: in-cluster)")
	fs.StringVar(&o.coordinationNamespace, "coordination-namespace", "berth-leases", "namespace of the Lease objects of --store kubernetes")
	fs.StringVar(&o.tokenFile, "token-file", "", "file of <subject>:<sha256-hex-of-token> lines; re-read on SIGHUP")
	fs.StringVar(&o.adminSubjects, "admin-subjects", "", "comma-separated subjects that may cordon clusters and release any lease")
	fs.StringVar(&o.tlsCertFile, "tls-cert-file", "", "serving certificate (PEM)")
	fs.StringVar(&o.tlsKeyFile, "tls-key-file", "", "serving key (PEM)")
	fs.StringVar(&o.clientCAFile, "client-ca-file", "", "CA bundle that verifies client certificates; a verified certificate's common name is its subject")
	fs.StringVar(&o.serviceAccountKeysDir, "service-account-keys-dir", "", "folder of <cluster-id>.json files, each the JWKS a cluster's kube-apiserver serves at /openid/v1/jwks: a managed Pod's projected service account token, verified with its cluster's keys, may read its lease's confirmation (empty: service account tokens are not accepted); re-read on SIGHUP")
	fs.DurationVar(&o.limits.ReadHeaderTimeout, "read-header-timeout", server.DefaultReadHeaderTimeout, "time a connection has to send a request line and headers")
	fs.DurationVar(&o.limits.BodyReadTimeout, "body-read-timeout", server.DefaultBodyReadTimeout, "time a request has to send its body after its headers (long polls have none and are not cut)")
	fs.DurationVar(&o.limits.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "time a kept-alive connection may wait for its next request")
	fs.IntVar(&o.limits.MaxHeaderBytes, "max-header-bytes", server.DefaultMaxHeaderBytes, "largest request line and headers; more is answered 431")
	fs.IntVar(&o.watch.MaxWatches, "max-watches", server.DefaultMaxWatches, "most watch streams open at once; more are answered 429")
	fs.IntVar(&o.watch.MaxWatchesPerSubject, "max-watches-per-subject", server.DefaultMaxWatchesPerSubject, "most watch streams one subject may have open; more are answered 429")
	fs.DurationVar(&o.watch.MaxDuration, "watch-max-duration", server.DefaultMaxWatchDuration, "longest a watch stream lasts (less up to a tenth, at random) before its client resumes, so that streams rebalance across replicas")
	fs.DurationVar(&o.clusterTTL, "cluster-ttl", lease.DefaultClusterTTL, "how long a cluster counts as healthy after its agent's last heartbeat (GET /v1alpha1/clusters), and how long its registration keeps its id from another cluster; agents heartbeat every --cluster-heartbeat-interval (default 10 s), so keep it a few of those")
	fs.IntVar(&o.historyTerms, "history-terms", lease.DefaultHistoryTerms, fmt.Sprintf("ended terms of each lease kept for GET .../history, the oldest dropped on each write that ends a term (0: none recorded; at most %d, and %d with --store kubernetes)", maxHistoryTerms, kubernetes.MaxHistoryTerms))
	flags.Version(fs, &o.showVersion)
}

func (o *options) admins() []string {
	var out []string
	for s := range strings.SplitSeq(o.adminSubjects, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// checkLimits refuses a bound that is not positive: none of them may be off.
func (o *options) checkLimits() error {
	l := o.limits
	if l.ReadHeaderTimeout <= 0 || l.BodyReadTimeout <= 0 || l.IdleTimeout <= 0 || l.MaxHeaderBytes <= 0 {
		return usageError("--read-header-timeout, --body-read-timeout, --idle-timeout and --max-header-bytes must be positive")
	}
	if w := o.watch; w.MaxWatches <= 0 || w.MaxWatchesPerSubject <= 0 || w.MaxDuration <= 0 {
		return usageError("--max-watches, --max-watches-per-subject and --watch-max-duration must be positive")
	}
	if o.clusterTTL < time.Second {
		return usageError("--cluster-ttl must be at least 1s, got %s", o.clusterTTL)
	}
	if o.historyTerms < 0 || o.historyTerms > maxHistoryTerms {
		return usageError("--history-terms must be between 0 and %d, got %d", maxHistoryTerms, o.historyTerms)
	}
	if o.store == "kubernetes" && o.historyTerms > kubernetes.MaxHistoryTerms {
		return usageError("--history-terms must be at most %d with --store kubernetes (the terms live in an annotation of each Lease), got %d", kubernetes.MaxHistoryTerms, o.historyTerms)
	}
	return nil
}

// maxHistoryTerms bounds --history-terms: a history is read whole.
const maxHistoryTerms = 1000

// serviceHistoryTerms is --history-terms as lease.Options has it (negative:
// none).
func (o *options) serviceHistoryTerms() int {
	if o.historyTerms == 0 {
		return -1
	}
	return o.historyTerms
}

func usageError(format string, args ...any) error {
	return fmt.Errorf("invalid flags: "+format, args...)
}
