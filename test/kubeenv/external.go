package kubeenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"
)

// ExternalKubeconfigsEnv names the environment variable that makes Start use clusters made
// some other way (kind, a cloud): a comma-separated list of kubeconfig files, one cluster
// each (its current context). Start takes the first Options.Clusters of them.
const ExternalKubeconfigsEnv = "BERTH_TEST_KUBECONFIGS"

func externalKubeconfigs() []string {
	return splitList(os.Getenv(ExternalKubeconfigsEnv))
}

// splitList splits a comma-separated list, dropping blanks around and between items.
func splitList(s string) []string {
	var items []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// clusterName names a cluster after its kubeconfig file: kind-east.kubeconfig is
// kind-east.
func clusterName(kubeconfigPath string) string {
	base := filepath.Base(kubeconfigPath)
	return strings.TrimSuffix(base, filepath.Ext(base))
}

// useExternal returns an Env of the first opts.Clusters clusters of paths, once each is
// ready.
func useExternal(ctx context.Context, opts Options, paths []string) (*Env, error) {
	if len(paths) < opts.Clusters {
		return nil, fmt.Errorf("%s names %d clusters, %d needed", ExternalKubeconfigsEnv, len(paths), opts.Clusters)
	}
	env := &Env{}
	seen := map[string]bool{}
	for _, path := range paths[:opts.Clusters] {
		name := clusterName(path)
		if seen[name] {
			return nil, fmt.Errorf("%s: two kubeconfig files are named %s", ExternalKubeconfigsEnv, name)
		}
		seen[name] = true
		c, err := newCluster(name, path, opts.Log, nil)
		if err != nil {
			return nil, err
		}
		env.Clusters = append(env.Clusters, c)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range env.Clusters {
		g.Go(func() error {
			if err := c.waitReady(gctx); err != nil {
				return fmt.Errorf("use %s: %w", c.Name, err)
			}
			c.log.Info("cluster ready", "kubeconfig", c.KubeconfigPath)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return env, nil
}
