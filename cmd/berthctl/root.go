package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/cmd/internal/logging"
	"github.com/berthfleet/berth/leaseapi/client"
)

// Environment variables that stand in for the connection flags; a flag wins.
const (
	envServer    = "BERTH_SERVER"
	envTokenFile = "BERTH_TOKEN_FILE"
	envCAFile    = "BERTH_CA_FILE"

	defaultServer = "http://127.0.0.1:8443"
)

// streams is what a run of berthctl reads from and writes to.
type streams struct {
	out, err io.Writer
	getenv   func(string) string
	clock    clock.PassiveClock // nil: the real clock
}

// run executes one berthctl command line.
func run(ctx context.Context, args []string, s streams) error {
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	root := newRootCommand(s)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// connection is the resolved configuration of the lease API connection.
type connection struct {
	server         string
	serverExplicit bool // set by --server or BERTH_SERVER rather than defaulted
	tokenFile      string
	caFile         string
	clientCert     string
	clientKey      string
}

// globalOptions are the flags every command shares.
type globalOptions struct {
	streams
	server, tokenFile, caFile string
	clientCert, clientKey     string
	timeout                   time.Duration
	flags                     *pflag.FlagSet
	// logs log what the client does (its retries at -v 1) on stderr.
	logs *logging.Options
}

func (o *globalOptions) bind(fs *pflag.FlagSet) {
	o.flags = fs
	fs.StringVar(&o.server, "server", "", "URL of the lease API (env "+envServer+"; default "+defaultServer+")")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (env "+envTokenFile+")")
	fs.StringVar(&o.caFile, "ca-file", "", "CA bundle (PEM) that verifies the server's certificate (env "+envCAFile+")")
	fs.StringVar(&o.clientCert, "client-cert", "", "client certificate (PEM) for mutual TLS")
	fs.StringVar(&o.clientKey, "client-key", "", "key (PEM) of --client-cert")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole command, retries included")
	o.logs = logging.NewOptions(logging.FormatText)
	o.logs.AddFlags(fs)
}

// resolveConnection decides the connection settings: a flag given on the
// command line wins over its environment variable, which wins over the default.
func resolveConnection(flags *pflag.FlagSet, o *globalOptions, getenv func(string) string) (connection, error) {
	pick := func(flag, value, env string) (string, bool) {
		if flags.Changed(flag) {
			return value, true
		}
		if v := getenv(env); v != "" {
			return v, true
		}
		return "", false
	}
	c := connection{clientCert: o.clientCert, clientKey: o.clientKey}
	c.server, c.serverExplicit = pick("server", o.server, envServer)
	if !c.serverExplicit {
		c.server = defaultServer
	}
	c.tokenFile, _ = pick("token-file", o.tokenFile, envTokenFile)
	c.caFile, _ = pick("ca-file", o.caFile, envCAFile)
	if c.server == "" {
		return c, usageErrorf("--server is empty")
	}
	if (c.clientCert == "") != (c.clientKey == "") {
		return c, usageErrorf("--client-cert and --client-key go together")
	}
	if o.timeout <= 0 {
		return c, usageErrorf("--timeout must be positive, got %s", o.timeout)
	}
	return c, nil
}

// connect resolves the connection and builds a client. A configuration the
// client refuses (bad URL, unreadable token or CA file) is a usage error.
func (o *globalOptions) connect() (*client.Client, connection, error) {
	conn, err := resolveConnection(o.flags, o, o.getenv)
	if err != nil {
		return nil, conn, err
	}
	log, err := o.logs.New(o.err)
	if err != nil {
		return nil, conn, &usageError{err: err}
	}
	c, err := client.New(client.Config{
		URL:            conn.server,
		TokenFile:      conn.tokenFile,
		CAFile:         conn.caFile,
		ClientCertFile: conn.clientCert,
		ClientKeyFile:  conn.clientKey,
		Log:            log,
	})
	if err != nil {
		return nil, conn, &usageError{err: err}
	}
	return c, conn, nil
}

// withTimeout bounds a command by --timeout.
func (o *globalOptions) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, o.timeout)
}

func newRootCommand(s streams) *cobra.Command {
	o := &globalOptions{streams: s}
	root := &cobra.Command{
		Use:   "berthctl",
		Short: "berthctl inspects and administers Berth's lease API",
		Long: `berthctl inspects and administers Berth's lease API: leases, their holders and
fencing tokens, and the fleet's clusters.

The server, token file and CA come from --server, --token-file and --ca-file, or
else from ` + envServer + `, ` + envTokenFile + ` and ` + envCAFile + `; a flag wins.
The server defaults to ` + defaultServer + `.

Output is an aligned table; -o wide adds columns, -o json and -o yaml print the
lease API's wire types. Errors go to stderr as one line starting "berthctl: ".

` + exitCodesHelp,
		SilenceErrors:     true,
		SilenceUsage:      true,
		Args:              cobra.ArbitraryArgs,
		RunE:              groupRun,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.Version = linkedVersion()
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.SetOut(s.out)
	root.SetErr(s.err)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	o.bind(root.PersistentFlags())

	leases := &cobra.Command{
		Use:   "leases",
		Short: "List, show, release and move leases, and show their history",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun,
	}
	leases.AddCommand(newLeasesListCommand(o), newLeasesGetCommand(o), newLeasesReleaseCommand(o), newLeasesMoveCommand(o), newLeasesHistoryCommand(o))
	clusters := &cobra.Command{
		Use:   "clusters",
		Short: "List the fleet's clusters",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun,
	}
	clusters.AddCommand(newClustersListCommand(o))
	root.AddCommand(leases, clusters, newCordonCommand(o, true), newCordonCommand(o, false), newVersionCommand(o))
	return root
}

// groupRun is the action of a command that only groups others: alone it
// prints help; with an argument it names a subcommand that does not exist.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return cmd.Help()
}

// exactArgs is cobra.ExactArgs whose failure is a usage error naming the
// arguments wanted.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usageErrorf("%s wants %d argument(s) %v, got %d", cmd.CommandPath(), len(names), names, len(args))
		}
		return nil
	}
}

// noArgs refuses positional arguments.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}
