package fleet

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/multicluster-runtime/pkg/clusters"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// KubeconfigExtensions are the file name extensions KubeconfigDir reads as
// kubeconfigs; every other file (a cluster's .token, say) is left alone.
var KubeconfigExtensions = []string{".kubeconfig", ".yaml", ".yml"}

// DefaultDirPollInterval is how often KubeconfigDir looks at its folder.
const DefaultDirPollInterval = 2 * time.Second

var (
	_ multicluster.Provider         = (*KubeconfigDir)(nil)
	_ multicluster.ProviderRunnable = (*KubeconfigDir)(nil)
)

// KubeconfigDir is a multicluster-runtime provider of the clusters whose
// kubeconfigs are the files of a folder: the cluster's name is the file's
// name without its extension. It looks at the folder every Interval: a new
// file engages its cluster, a removed one disengages it, a changed one
// replaces it. A file that cannot be read or whose cluster cannot be engaged
// is tried again at the next look.
type KubeconfigDir struct {
	clusters.Clusters[cluster.Cluster]
	// Dir is the folder.
	Dir string
	// Interval between looks (DefaultDirPollInterval).
	Interval time.Duration
	// ClusterOptions configure each cluster (scheme, cache).
	ClusterOptions []cluster.Option
	// ConfigureREST, when set, adjusts each cluster's client configuration
	// (its rate limits) before the cluster is made.
	ConfigureREST func(*rest.Config)
	Log           logr.Logger
	// BeforeLeave, when set, is called when a cluster's file is gone and
	// before the cluster is disengaged, while its client, cache and
	// controllers still run: fleet mode hands the cluster's leases over in
	// it. Clusters that leave at one look are handed over concurrently. It
	// must return by itself (bound it); the folder is not looked at
	// meanwhile. A file that merely changed replaces its cluster without it.
	BeforeLeave func(ctx context.Context, name multicluster.ClusterName)

	// engaged maps a cluster name to the digest of the kubeconfig it was
	// engaged with.
	engaged map[multicluster.ClusterName][sha256.Size]byte
}

// NewKubeconfigDir returns a provider of the clusters of dir.
func NewKubeconfigDir(dir string, log logr.Logger, opts ...cluster.Option) *KubeconfigDir {
	p := &KubeconfigDir{Clusters: clusters.New[cluster.Cluster](), Dir: dir, ClusterOptions: opts, Log: log}
	p.ErrorHandler = log.Error
	return p
}

// Start looks at the folder until ctx ends, engaging clusters with aware.
func (p *KubeconfigDir) Start(ctx context.Context, aware multicluster.Aware) error {
	p.engaged = map[multicluster.ClusterName][sha256.Size]byte{}
	interval := p.Interval
	if interval <= 0 {
		interval = DefaultDirPollInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := p.sync(ctx, aware); err != nil {
			p.Log.Error(err, "read the fleet kubeconfig folder", "dir", p.Dir)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sync makes the engaged clusters those of the folder's files.
func (p *KubeconfigDir) sync(ctx context.Context, aware multicluster.Aware) error {
	files, err := KubeconfigFiles(p.Dir)
	if err != nil {
		return err
	}
	// Gone from the folder, or stopped on its own: a cluster that stopped is
	// engaged anew at this look if its file is still there. Clusters whose
	// file is gone leave together: their BeforeLeave calls run at once.
	var gone []multicluster.ClusterName
	var leaving sync.WaitGroup
	names := p.ClusterNames()
	for name := range p.engaged {
		_, present := files[name]
		running := slices.Contains(names, name)
		if present && running {
			continue
		}
		if !present {
			p.Log.Info("cluster left the fleet folder", "cluster", name)
		}
		if !present && running && p.BeforeLeave != nil {
			leaving.Go(func() { p.BeforeLeave(ctx, name) })
		}
		gone = append(gone, name)
	}
	leaving.Wait()
	for _, name := range gone {
		p.Remove(name)
		delete(p.engaged, name)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		path := files[name]
		data, err := os.ReadFile(path)
		if err != nil {
			p.Log.Error(err, "read kubeconfig", "cluster", name, "path", path)
			continue
		}
		digest := sha256.Sum256(data)
		if old, ok := p.engaged[name]; ok && old == digest {
			continue
		}
		if err := p.engage(ctx, aware, name, data); err != nil {
			p.Log.Error(err, "engage cluster; trying again at the next look", "cluster", name, "path", path)
			continue
		}
		p.engaged[name] = digest
		p.Log.Info("cluster engaged from the fleet folder", "cluster", name, "path", path)
	}
	return nil
}

func (p *KubeconfigDir) engage(ctx context.Context, aware multicluster.Aware, name multicluster.ClusterName, kubeconfig []byte) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	if p.ConfigureREST != nil {
		p.ConfigureREST(cfg)
	}
	cl, err := cluster.New(cfg, p.ClusterOptions...)
	if err != nil {
		return fmt.Errorf("create cluster: %w", err)
	}
	// A changed file replaces the cluster: disengage the old one first.
	if _, ok := p.engaged[name]; ok {
		p.Remove(name)
		delete(p.engaged, name)
	}
	return p.Add(ctx, name, cl, aware)
}

// KubeconfigFiles maps each cluster name of dir to its kubeconfig file.
// Hidden files are skipped (editors and atomic writers use them), and of
// two files that name the same cluster the first in name order wins.
func KubeconfigFiles(dir string) (map[multicluster.ClusterName]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	out := map[multicluster.ClusterName]string{}
	for _, e := range entries {
		file := e.Name()
		ext := filepath.Ext(file)
		if e.IsDir() || strings.HasPrefix(file, ".") || !slices.Contains(KubeconfigExtensions, ext) {
			continue
		}
		name := multicluster.ClusterName(strings.TrimSuffix(file, ext))
		if _, dup := out[name]; dup || name == "" {
			continue
		}
		out[name] = filepath.Join(dir, file)
	}
	return out, nil
}
