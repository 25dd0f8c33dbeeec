package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/berthfleet/berth/test/freeport"
)

// Env is a set of independent clusters.
//
// A cluster is ready when its API server answers, all its nodes are Ready and free of the
// not-ready and unreachable taints, and the default ServiceAccount exists in the default
// namespace. New namespaces get their default ServiceAccount a moment after they are
// created; create Pods in them through a controller or retry.
type Env struct {
	Clusters []*Cluster
}

// Start runs opts.Clusters clusters in parallel and returns once all are ready. When
// BERTH_TEST_KUBECONFIGS is set it starts nothing and uses the clusters it names instead
// (see ExternalKubeconfigsEnv). On error it leaves nothing running.
func Start(ctx context.Context, opts Options) (*Env, error) {
	opts = opts.withDefaults()
	if paths := externalKubeconfigs(); len(paths) > 0 {
		return useExternal(ctx, opts, paths)
	}
	env, err := newEnv(opts)
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range env.Clusters {
		g.Go(func() error { return c.Start(gctx) })
	}
	if err := g.Wait(); err != nil {
		_ = env.Stop(context.Background())
		return nil, err
	}
	opts.Log.Info("clusters ready", "clusters", len(env.Clusters), "elapsed", time.Since(begin).Round(time.Millisecond))
	return env, nil
}

// newEnv lays out the clusters of a managed Env without starting them.
func newEnv(opts Options) (*Env, error) {
	if opts.WorkDir == "" {
		return nil, errors.New("start clusters: Options.WorkDir is empty")
	}
	if opts.BinDir == "" {
		dir, err := BinDir()
		if err != nil {
			return nil, err
		}
		opts.BinDir = dir
	}
	if err := checkBinaries(opts.BinDir); err != nil {
		return nil, err
	}
	free, err := freeport.Ports(3 * opts.Clusters)
	if err != nil {
		return nil, err
	}
	env := &Env{}
	for i := range opts.Clusters {
		p := ports{etcdClient: free[3*i], etcdPeer: free[3*i+1], apiserver: free[3*i+2]}
		c, err := newManagedCluster(fmt.Sprintf("cluster-%d", i+1), opts, p)
		if err != nil {
			return nil, err
		}
		env.Clusters = append(env.Clusters, c)
	}
	return env, nil
}

// Stop stops every cluster that kubeenv started and waits until all their processes are
// gone. Clusters it did not start are left alone.
func (e *Env) Stop(ctx context.Context) error {
	var g errgroup.Group
	for _, c := range e.Clusters {
		if c.Managed() {
			g.Go(func() error { return c.Stop(ctx) })
		}
	}
	return g.Wait()
}
