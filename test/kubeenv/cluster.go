package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berthfleet/berth/test/pki"
)

// ErrNotManaged is returned by Stop and Start of a cluster that kubeenv did not start (one
// named by BERTH_TEST_KUBECONFIGS): it cannot stop such a cluster.
var ErrNotManaged = errors.New("cluster not started by kubeenv")

// Cluster is one Kubernetes cluster of an Env. Its methods are safe for concurrent use.
type Cluster struct {
	// Name is the cluster's name: cluster-1, cluster-2, ... for the clusters kubeenv runs,
	// the kubeconfig file's name without its extension for the others. It is also the name
	// of the kubeconfig's cluster and context.
	Name string
	// KubeconfigPath is a kubeconfig file for a cluster administrator.
	KubeconfigPath string

	config *rest.Config
	client kubernetes.Interface // the administrator's
	log    logr.Logger
	plane  *controlPlane // nil when kubeenv did not start the cluster

	mu sync.Mutex // serialises Start and Stop
}

// RESTConfig returns a new copy of the cluster administrator's client configuration.
func (c *Cluster) RESTConfig() *rest.Config {
	return rest.CopyConfig(c.config)
}

// ConfigAs returns a client configuration that acts as user, member of groups, through
// impersonation by the administrator: the API server authorizes and admits its requests
// as that user's (RBAC, admission webhooks and policies see user and groups, plus
// system:authenticated).
func (c *Cluster) ConfigAs(user string, groups ...string) *rest.Config {
	cfg := c.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// WriteKubeconfigAs writes to path a kubeconfig that acts as user, member of groups, as
// ConfigAs does: for processes that a test runs as a given user (an agent, kubectl).
func (c *Cluster) WriteKubeconfigAs(path, user string, groups ...string) error {
	cfg, err := clientcmd.LoadFromFile(c.KubeconfigPath)
	if err != nil {
		return fmt.Errorf("load kubeconfig of %s: %w", c.Name, err)
	}
	as, err := impersonating(cfg, user, groups)
	if err != nil {
		return fmt.Errorf("kubeconfig of %s as %s: %w", c.Name, user, err)
	}
	if err := clientcmd.WriteToFile(*as, path); err != nil {
		return fmt.Errorf("write kubeconfig of %s as %s: %w", c.Name, user, err)
	}
	return nil
}

// Managed reports whether kubeenv started the cluster, and so can stop and start it.
func (c *Cluster) Managed() bool { return c.plane != nil }

// Stop stops every process of the cluster (SIGTERM, then SIGKILL after a few seconds or
// once ctx is done), as if the cluster were lost; its data stays for Start. Stopping a
// stopped cluster does nothing.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.plane == nil {
		return fmt.Errorf("stop %s: %w", c.Name, ErrNotManaged)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plane.stop(ctx) {
		c.log.Info("cluster stopped")
	}
	return nil
}

// Start starts the cluster's processes and waits until it is ready (see Env). After Stop
// it starts the cluster again on its data, at the same address and with the same
// credentials, so clients made before Stop work again.
func (c *Cluster) Start(ctx context.Context) error {
	if c.plane == nil {
		return fmt.Errorf("start %s: %w", c.Name, ErrNotManaged)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	begin := time.Now()
	if err := c.plane.start(ctx, c.client); err != nil {
		_ = c.plane.stop(context.Background())
		return fmt.Errorf("start %s: %w", c.Name, err)
	}
	if err := c.waitReady(ctx); err != nil {
		_ = c.plane.stop(context.Background())
		return fmt.Errorf("start %s: %w", c.Name, err)
	}
	c.log.Info("cluster ready", "elapsed", time.Since(begin).Round(time.Millisecond), "kubeconfig", c.KubeconfigPath)
	return nil
}

// newCluster returns a cluster reached through the kubeconfig file at path.
func newCluster(name, kubeconfigPath string, log logr.Logger, plane *controlPlane) (*Cluster, error) {
	config, err := restConfig(kubeconfigPath)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", name, err)
	}
	return &Cluster{
		Name: name, KubeconfigPath: kubeconfigPath,
		config: config, client: client, log: log.WithValues("cluster", name), plane: plane,
	}, nil
}

// newManagedCluster lays out a cluster that kubeenv runs: it writes its certificates and
// kubeconfigs, but starts nothing.
func newManagedCluster(name string, opts Options, p ports) (*Cluster, error) {
	l := layout{dir: filepath.Join(opts.WorkDir, name)}
	for _, dir := range []string{filepath.Dir(l.pki("ca.crt")), filepath.Dir(l.log("etcd"))} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	kubeconfigPath := filepath.Join(opts.WorkDir, name+".kubeconfig")
	if err := writeCredentials(name, l, p, kubeconfigPath); err != nil {
		return nil, fmt.Errorf("write credentials of %s: %w", name, err)
	}
	plane := &controlPlane{name: name, layout: l, ports: p, binDir: opts.BinDir, nodes: opts.Nodes}
	c, err := newCluster(name, kubeconfigPath, opts.Log, plane)
	if err != nil {
		return nil, err
	}
	plane.log = c.log
	return c, nil
}

// writeCredentials writes a cluster's CA, the API server's serving and service account
// keys, and a kubeconfig for each identity (the administrator's at adminKubeconfig).
func writeCredentials(name string, l layout, p ports, adminKubeconfig string) error {
	ca, err := pki.NewAuthority(name)
	if err != nil {
		return err
	}
	serving, err := ca.ServingCert("kube-apiserver", "127.0.0.1", "localhost", serviceIP,
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	if err != nil {
		return err
	}
	saKey, saPub, err := pki.SigningKeys()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		l.pki("ca.crt"): ca.CertPEM, l.pki("apiserver.crt"): serving.Cert, l.pki("apiserver.key"): serving.Key,
		l.pki("sa.key"): saKey, l.pki("sa.pub"): saPub,
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", p.apiserver)
	for _, id := range identities {
		creds, err := ca.ClientCert(id.user, id.groups...)
		if err != nil {
			return err
		}
		path := l.kubeconfig(id)
		if id.file == adminIdentity.file {
			path = adminKubeconfig
		}
		if err := clientcmd.WriteToFile(*kubeconfig(name, server, ca.CertPEM, id.user, creds), path); err != nil {
			return fmt.Errorf("write kubeconfig %s: %w", path, err)
		}
	}
	return nil
}

// Signal sends sig to the cluster's component process (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler or kwok): SIGSTOP and SIGCONT freeze
// and thaw it, e.g. kwok to play kubelets that cannot report Pods gone.
func (c *Cluster) Signal(component string, sig syscall.Signal) error {
	if c.plane == nil {
		return fmt.Errorf("cluster %s: not started by kubeenv", c.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, proc := range c.plane.procs {
		if proc.Name == component && !proc.Exited() {
			return syscall.Kill(proc.Pid(), sig)
		}
	}
	return fmt.Errorf("cluster %s: no running %s", c.Name, component)
}

// LogFile is the log file of the cluster's component process (as named for Signal), or ""
// for a cluster kubeenv did not start.
func (c *Cluster) LogFile(component string) string {
	if c.plane == nil {
		return ""
	}
	return c.plane.layout.log(component)
}
