// Command sandbox runs the local clusters of Berth's tests (test/kubeenv) for a person to
// use: it starts them, writes <workdir>/<cluster>.kubeconfig, prints a line per cluster
// once all are ready, and runs until SIGINT or SIGTERM, which stop every process it started.
//
//	go run ./test/sandbox --clusters 3 --workdir /tmp/berth
//	kubectl --kubeconfig /tmp/berth/cluster-1.kubeconfig get nodes
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/berthfleet/berth/test/kubeenv"
)

func main() {
	opts := kubeenv.Options{}
	flag.IntVar(&opts.Clusters, "clusters", 3, "number of clusters")
	flag.IntVar(&opts.Nodes, "nodes", 2, "number of kwok nodes per cluster")
	flag.StringVar(&opts.WorkDir, "workdir", "", "directory for kubeconfigs, data and logs (default: a new temporary directory)")
	flag.StringVar(&opts.BinDir, "bin-dir", "", "directory of the binaries `make tools` builds (default: $KUBEBUILDER_ASSETS or bin/k8s)")
	verbosity := flag.Int("v", 0, "log verbosity (1 logs every process)")
	flag.Parse()
	opts.Log = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: *verbosity})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

// run starts the clusters, reports them and keeps them until ctx is done.
func run(ctx context.Context, opts kubeenv.Options) error {
	if opts.WorkDir == "" {
		dir, err := os.MkdirTemp("", "berth-sandbox-")
		if err != nil {
			return fmt.Errorf("create work directory: %w", err)
		}
		opts.WorkDir = dir
	}
	begin := time.Now()
	env, err := kubeenv.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer stopAll(env, opts.Log)
	report(env, time.Since(begin))
	<-ctx.Done()
	return nil
}

func report(env *kubeenv.Env, elapsed time.Duration) {
	for _, c := range env.Clusters {
		fmt.Printf("%s ready: export KUBECONFIG=%s\n", c.Name, c.KubeconfigPath)
	}
	rss, err := env.ResidentMemory()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
	}
	fmt.Printf("all %d ready in %s, %d MiB resident; Ctrl-C stops them\n",
		len(env.Clusters), elapsed.Round(time.Millisecond), rss>>20)
}

func stopAll(env *kubeenv.Env, log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := env.Stop(ctx); err != nil {
		log.Error(err, "stop clusters")
	}
}
