// Package localfleet runs a whole Berth fleet on this machine: local
// clusters (test/kubeenv), berth-leaseapi, and one berth-agent per cluster as
// real processes (or, with Options.NoAgents and StartFleetAgent, one
// fleet-mode berth-agent for all of them), with the same BerthLease and
// managed Deployment applied to every cluster as GitOps would. The
// end-to-end suites, `make demo` and `make bench-scale` (thousands of
// BerthLeases of its own, no Deployment) use it; it knows nothing of
// testing.T.
//
// Each per-cluster agent runs as the service account user of deploy/, with
// only deploy/rbac's rights, and serves the admission webhooks registered in
// its cluster (with the ValidatingAdmissionPolicy), so the Deployment's Pod
// template names only the BerthLease and admission stamps the gate and UID.
// A fleet-mode agent serves no webhooks: then the template carries the gate
// and the UID itself (validate-only installations do the same).
package localfleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/poll"
	"github.com/berthfleet/berth/test/process"
)

// AdminSubject is the lease API administrator of a fleet.
const AdminSubject = "ops"

// Options says what fleet to run.
type Options struct {
	// Clusters is the number of clusters (default 3).
	Clusters int
	// BinDir holds berth-leaseapi and berth-agent.
	BinDir string
	// AgentBinary is the per-cluster agents' program instead of BinDir's
	// berth-agent: another build, to compare releases on the same fleet.
	AgentBinary string
	// WorkDir holds everything the fleet writes.
	WorkDir string
	// Workload is what every cluster runs under one BerthLease.
	Workload Workload
	// NoAgents starts no agent per cluster (StartFleetAgent starts one for
	// all of them).
	NoAgents bool
	// NoWorkload applies neither the Workload's BerthLease nor its
	// Deployment: the caller brings its own objects (the scale benchmark's
	// thousands of BerthLeases without Pods).
	NoWorkload bool
	// DeferAgents leaves the per-cluster agents to StartAgents, so that a
	// caller can put objects in place before any agent runs.
	DeferAgents bool
	// AgentArgs are appended to every berth-agent's command line (per
	// cluster and fleet mode), after the fleet's own flags, so that they
	// can also override them.
	AgentArgs []string
	// MemberAgentArgs are appended, after AgentArgs, to the command line of
	// the per-cluster agent of the cluster each key names ("cluster-1"):
	// its --cluster-labels, say.
	MemberAgentArgs map[string][]string
	// LeaseAPIArgs are appended to berth-leaseapi's command line, after the
	// fleet's own flags (--cluster-ttl, say).
	LeaseAPIArgs []string
	// Helm installs Berth in every cluster with the berth-agent chart and runs each
	// agent as the chart's Deployment would (chart.go), instead of applying deploy/'s
	// CRD, RBAC and admission by hand. Not with NoAgents.
	Helm bool
	// Metrics serves the lease API's and every per-cluster agent's /metrics on free
	// loopback ports (LeaseAPI.MetricsURL, Member.MetricsURL); without it
	// they serve none.
	Metrics bool
	Log     logr.Logger
}

// Fleet is a running fleet.
type Fleet struct {
	Env      *kubeenv.Env
	LeaseAPI *LeaseAPI
	Members  []*Member
	opts     Options
	// fleetAgent is the fleet-mode agent, if one was started.
	fleetAgent *FleetAgent
}

// Start runs the clusters, the lease API, applies the workload everywhere
// and starts one agent per cluster (unless Options.DeferAgents). On error
// everything started is stopped.
func Start(ctx context.Context, opts Options) (f *Fleet, err error) {
	if opts.Clusters == 0 {
		opts.Clusters = 3
	}
	opts.Workload = opts.Workload.withDefaults()
	if opts.Helm && opts.NoAgents {
		return nil, errors.New("localfleet: Helm installs an agent per cluster; NoAgents starts none")
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	f = &Fleet{opts: opts}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Stop(context.Background()))
		}
	}()
	if f.Env, err = kubeenv.Start(ctx, kubeenv.Options{Clusters: opts.Clusters, WorkDir: filepath.Join(opts.WorkDir, "clusters"), Log: opts.Log}); err != nil {
		return f, err
	}
	var ids []string
	for _, c := range f.Env.Clusters {
		ids = append(ids, c.Name)
	}
	if err := writeServiceAccountKeys(ctx, f.Env.Clusters, filepath.Join(opts.WorkDir, "leaseapi", serviceAccountKeysDir)); err != nil {
		return f, err
	}
	if f.LeaseAPI, err = StartLeaseAPI(ctx, opts.BinDir, filepath.Join(opts.WorkDir, "leaseapi"), ids, opts.Metrics, opts.LeaseAPIArgs...); err != nil {
		return f, err
	}
	for _, c := range f.Env.Clusters {
		m, err := newMember(ctx, c, f, filepath.Join(opts.WorkDir, c.Name))
		if err != nil {
			return f, err
		}
		f.Members = append(f.Members, m)
	}
	if opts.DeferAgents {
		return f, nil
	}
	return f, f.StartAgents(ctx)
}

// StartAgents starts one agent per cluster (none with Options.NoAgents),
// registers the admission they serve, and applies the workload everywhere
// (unless Options.NoWorkload). Start calls it, unless Options.DeferAgents
// leaves it to the caller.
func (f *Fleet) StartAgents(ctx context.Context) error {
	if !f.opts.NoAgents {
		for _, m := range f.Members {
			if err := m.StartAgent(m.Name); err != nil {
				return err
			}
		}
		for _, m := range f.Members {
			if f.opts.Helm {
				continue // the chart registered it
			}
			if err := m.registerAdmission(ctx); err != nil {
				return err
			}
		}
	}
	if f.opts.NoWorkload {
		return nil
	}
	for _, m := range f.Members {
		if err := m.ApplyWorkload(ctx); err != nil {
			return err
		}
	}
	return nil
}

// admission reports whether the fleet's clusters run Berth's admission: they
// do when each has its own agent to serve it.
func (f *Fleet) admission() bool { return !f.opts.NoAgents }

// Member returns the member named name.
func (f *Fleet) Member(name string) *Member {
	for _, m := range f.Members {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// SetSpec changes the spec of the workload's BerthLease in every cluster,
// as a GitOps tool applying a new revision would.
func (f *Fleet) SetSpec(ctx context.Context, change func(*berthv1alpha1.BerthLeaseSpec)) error {
	for _, m := range f.Members {
		if err := m.SetSpec(ctx, change); err != nil {
			return err
		}
	}
	return nil
}

// Readers gives the history recorder a client per cluster.
func (f *Fleet) Readers() map[string]ctrlclient.Reader {
	out := map[string]ctrlclient.Reader{}
	for _, m := range f.Members {
		out[m.Name] = m.Client
	}
	return out
}

// Stop ends every process of the fleet.
func (f *Fleet) Stop(ctx context.Context) error {
	var errs []error
	for _, m := range f.Members {
		m.stop()
	}
	if f.fleetAgent != nil {
		f.fleetAgent.Kill()
	}
	if f.LeaseAPI != nil {
		f.LeaseAPI.Kill()
	}
	if f.Env != nil {
		errs = append(errs, f.Env.Stop(ctx))
	}
	return errors.Join(errs...)
}

// LeaseAPI is a running berth-leaseapi with a token per cluster and one for
// the administrator.
type LeaseAPI struct {
	*process.Process
	URL   string
	Admin *leaseclient.Client
	// MetricsURL is the server's /metrics, empty when it serves none.
	MetricsURL string
	// TokenFiles maps a subject to the file with its token.
	TokenFiles map[string]string
	binDir     string
	dir        string
	tokenFile  string
	addr       string
	// metricsAddr is where /metrics is served, empty for none.
	metricsAddr string
	// args are appended to the server's command line at every start.
	args []string
}

// StartLeaseAPI runs berth-leaseapi on a free loopback port with a token for
// each subject and for AdminSubject, with metrics on another free port when
// metrics is set, and with args appended to its command line (at every
// start).
func StartLeaseAPI(ctx context.Context, binDir, dir string, subjects []string, metrics bool, args ...string) (*LeaseAPI, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tokens := map[string]string{AdminSubject: AdminSubject + "-token"}
	for _, s := range subjects {
		tokens[s] = s + "-token"
	}
	api := &LeaseAPI{binDir: binDir, dir: dir, args: args}
	var err error
	if api.tokenFile, api.TokenFiles, err = leaseapitest.WriteTokens(dir, tokens); err != nil {
		return nil, err
	}
	ports, err := freeport.Ports(2) // the API's and its metrics', distinct
	if err != nil {
		return nil, err
	}
	api.addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	api.URL = "http://" + api.addr
	if metrics {
		api.metricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
		api.MetricsURL = "http://" + api.metricsAddr + "/metrics"
	}
	if api.Admin, err = leaseclient.New(leaseclient.Config{URL: api.URL, TokenFile: api.TokenFiles[AdminSubject], Timeout: 2 * time.Second}); err != nil {
		return nil, err
	}
	return api, api.Start(ctx)
}

// serviceAccountKeysDir is the folder of the lease API's dir with the
// fleet's clusters' service account keys, as --service-account-keys-dir
// reads them.
const serviceAccountKeysDir = "service-account-keys"

// writeServiceAccountKeys writes each cluster's service account signing keys,
// as its API server publishes them (/openid/v1/jwks), to <dir>/<cluster>.json,
// so that the lease API accepts its Pods' projected tokens (berth-fence).
func writeServiceAccountKeys(ctx context.Context, clusters []*kubeenv.Cluster, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range clusters {
		cs, err := kubernetes.NewForConfig(c.RESTConfig())
		if err != nil {
			return err
		}
		jwks, err := cs.CoreV1().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%s: read the service account keys: %w", c.Name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, c.Name+".json"), jwks, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Start runs (or runs again, on the same store) the server and waits until
// it is ready.
func (a *LeaseAPI) Start(ctx context.Context) error {
	args := []string{"--listen", a.addr, "--metrics-listen", a.metricsAddr, "--sqlite-path", filepath.Join(a.dir, "leases.db"),
		"--token-file", a.tokenFile, "--admin-subjects", AdminSubject}
	if keys := filepath.Join(a.dir, serviceAccountKeysDir); dirExists(keys) {
		args = append(args, "--service-account-keys-dir", keys)
	}
	args = append(args, a.args...)
	p, err := process.Start("berth-leaseapi", filepath.Join(a.binDir, "berth-leaseapi"), filepath.Join(a.dir, fmt.Sprintf("berth-leaseapi-%d.log", time.Now().UnixNano())), args...)
	if err != nil {
		return err
	}
	a.Process = p
	_, err = poll.Until(ctx, 20*time.Second, "berth-leaseapi ready", func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return a.Admin.Ready(rctx) == nil, nil
	})
	return err
}

func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
