package main

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/berthfleet/berth/admission"
	"github.com/berthfleet/berth/admission/certs"
	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/fleet"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/reconciler"
)

func run(ctx context.Context, o options, log logr.Logger) error {
	if o.fleetKubeconfigDir != "" {
		return runFleet(ctx, o, log)
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	o.rateLimit(cfg)
	leases, err := newLeaseClient(o, o.leaseAPITokenFile, log)
	if err != nil {
		return err
	}
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	if o.webhookCertSecret != "" && o.webhookCertDir == "" {
		if o.webhookCertDir, err = os.MkdirTemp("", "berth-webhook-certs-"); err != nil {
			return fmt.Errorf("make a folder for the webhook certificates: %w", err)
		}
	}
	mgr, leading, err := newManager(cfg, scheme, o)
	if err != nil {
		return err
	}

	r := &reconciler.BerthLeaseReconciler{
		Log:                  log.WithName("berthlease").WithValues("cluster", o.clusterID),
		LeaseClient:          leases,
		ClusterIdentity:      o.clusterID,
		ManagedWorkloads:     o.managedWorkloads,
		OperatorNamespace:    o.operatorNamespace,
		ConcurrentReconciles: o.concurrentReconciles,
		LeadingUntil:         leading,
	}
	var (
		registrar *fleet.Registrar
		view      *fleet.View
	)
	if o.clusterID != "" {
		direct, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		registrar = &fleet.Registrar{ClusterID: o.clusterID, AgentVersion: version, Registry: leases, Labels: o.clusterLabels,
			Interval: o.heartbeatInterval, Log: log.WithName("fleet")}
		if err := registrar.RegisterFirst(ctx, direct); err != nil {
			return err
		}
		r.Membership = registrar.Membership
		if err := mgr.Add(registrar); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("registered", registrar.Checker); err != nil {
			return err
		}
		view = o.fleetView(leases, log)
		r.Fleet = view
		if err := mgr.Add(view); err != nil {
			return err
		}
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the BerthLease controller: %w", err)
	}
	if registrar != nil {
		// Set once the controller exists: SetupWithManager wires r.Wake.
		registrar.OnChange = func(ctx context.Context) { fleet.WakeAll(logr.NewContext(ctx, log), mgr.GetClient(), r.Wake) }
		view.OnChange = r.WakePlacement
	}
	if err := addProbes(mgr, leases); err != nil {
		return err
	}
	if o.managedWorkloads {
		if o.webhookCertSecret != "" {
			if err := setupWebhookCerts(ctx, cfg, scheme, mgr, o, log); err != nil {
				return err
			}
		}
		if err := setupAdmission(ctx, o, cfg, mgr, log); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	}
	log.Info("starting berth-agent", "version", version, "cluster", o.clusterID, "managedWorkloads", o.managedWorkloads, "leaseAPI", o.leaseAPIURL)
	return mgr.Start(ctx)
}

// fleetView is the agent's view of the fleet at the lease API, for
// spec.placement's failback (--fleet-view-interval).
func (o options) fleetView(leases fleet.ClusterLister, log logr.Logger) *fleet.View {
	return &fleet.View{Lister: leases, Interval: o.fleetViewInterval, Log: log.WithName("fleet-view")}
}

// probed is the part of a manager that takes health and readiness checks.
type probed interface {
	AddHealthzCheck(name string, check healthz.Checker) error
	AddReadyzCheck(name string, check healthz.Checker) error
}

// addProbes adds /healthz and the lease API's readiness to /readyz.
func addProbes(mgr probed, leases *leaseclient.Client) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("lease-api", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
		defer cancel()
		return leases.Ready(ctx)
	})
}

func newLeaseClient(o options, tokenFile string, log logr.Logger) (*leaseclient.Client, error) {
	leases, err := leaseclient.New(leaseclient.Config{URL: o.leaseAPIURL, TokenFile: tokenFile, CAFile: o.leaseAPICAFile, Log: log.WithName("leaseapi")})
	if err != nil {
		return nil, fmt.Errorf("lease API client: %w", err)
	}
	return leases, nil
}

// newScheme knows the built-in types and BerthLease.
func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := berthv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (or pass --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load --kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// rateLimit sets the client-side rate limit of --kube-api-qps and
// --kube-api-burst on a cluster's client configuration.
func (o options) rateLimit(cfg *rest.Config) {
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
}

// managedCache caches only the managed Pods and workloads (those that
// carry the managed label): the agent never needs the others.
func managedCache() (cache.Options, error) {
	managed, err := labels.Parse(reconciler.ManagedLease)
	if err != nil {
		return cache.Options{}, err
	}
	byObject := map[ctrlclient.Object]cache.ByObject{&corev1.Pod{}: {Label: managed}}
	for _, o := range reconciler.WorkloadKinds() {
		byObject[o] = cache.ByObject{Label: managed}
	}
	return cache.Options{ByObject: byObject}, nil
}

func newManager(cfg *rest.Config, scheme *runtime.Scheme, o options) (ctrl.Manager, func() time.Time, error) {
	cacheOpts, err := managedCache()
	if err != nil {
		return nil, nil, err
	}
	opts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.metricsBindAddress},
		HealthProbeBindAddress: o.healthProbeBindAddress,
		Cache:                  cacheOpts,
	}
	leading, err := o.elect(cfg, &opts, "berth-agent.berth.skaphos.io")
	if err != nil {
		return nil, nil, err
	}
	if o.managedWorkloads {
		opts.WebhookServer = webhook.NewServer(webhook.Options{Port: o.webhookPort, CertDir: o.webhookCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("create manager: %w", err)
	}
	return mgr, leading, nil
}

// election sets up the leader election among the agent's replicas, when asked for, on
// the lock named id in the operator namespace, and returns how long this process is
// certainly the leader (leadership.Until; nil without an election: it is alone). A
// replica that stops, whatever the reason, hands leadership over at once
// (LeaderElectionReleaseOnCancel): the reconciler acts only within that certainty, so
// no two replicas act at once.
func (o options) elect(cfg *rest.Config, opts *ctrl.Options, id string) (func() time.Time, error) {
	if !o.leaderElect {
		return nil, nil
	}
	l, err := newLeadership(cfg, o.operatorNamespace, id, o.election)
	if err != nil {
		return nil, err
	}
	e := o.election
	opts.LeaderElection = true
	opts.LeaderElectionResourceLockInterface = l
	opts.LeaderElectionReleaseOnCancel = true
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &e.LeaseDuration, &e.RenewDeadline, &e.RetryPeriod
	ctrl.Log.WithName("leader-election").Info("electing a leader among the agent's replicas", "lock", o.operatorNamespace+"/"+id, "identity", l.Identity(),
		"leaseDuration", e.LeaseDuration, "renewDeadline", e.RenewDeadline, "retryPeriod", e.RetryPeriod)
	return l.Until, nil
}

// setupAdmission serves the WorkloadAdmission webhooks. Only the agent's own
// identity may ungate managed Pods; it asks the API server who it is, so the
// name cannot drift from the credentials it really uses.
func setupAdmission(ctx context.Context, o options, cfg *rest.Config, mgr ctrl.Manager, log logr.Logger) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(rctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("learn the agent's own user name: %w", err)
	}
	user := review.Status.UserInfo.Username
	fence, err := o.fenceConfig()
	if err != nil {
		return err
	}
	log.Info("serving workload admission", "operatorUser", user, "fenceImage", fence.Image)
	return admission.SetupWorkloadAdmission(mgr, &admission.WorkloadAdmission{OperatorUser: user, Mutate: true, Fence: fence})
}

// fenceConfig is what admission puts into fenced Pods: berth-fence's image, and the lease
// API as the Pods reach it, with the CA bundle that verifies it.
func (o options) fenceConfig() (admission.FenceConfig, error) {
	cfg := admission.FenceConfig{Image: o.fenceImage, LeaseAPIURL: cmp.Or(o.fenceLeaseAPIURL, o.leaseAPIURL)}
	if o.fenceImage == "" || o.leaseAPICAFile == "" {
		return cfg, nil
	}
	ca, err := os.ReadFile(o.leaseAPICAFile)
	if err != nil {
		return cfg, fmt.Errorf("read --lease-api-ca-file for fenced Pods: %w", err)
	}
	cfg.LeaseAPICA = string(ca)
	return cfg, nil
}

// firstCertSyncTimeout bounds the agent's first sync of its webhook certificates,
// before the manager starts.
const firstCertSyncTimeout = 2 * time.Minute

// setupWebhookCerts runs the agent's own webhook certificates (--webhook-cert-secret):
// a first sync before the manager starts, because the webhook server does not start
// without the files, then a Rotator on every replica (no leader election), and a
// readiness check until the first sync.
func setupWebhookCerts(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, mgr ctrl.Manager, o options, log logr.Logger) error {
	direct, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	rot, err := certs.New(certs.Options{
		Client:      direct,
		Namespace:   o.operatorNamespace,
		SecretName:  o.webhookCertSecret,
		ServiceName: o.webhookService,
		CertDir:     o.webhookCertDir,
		Log:         log.WithName("webhook-certs"),
	})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, firstCertSyncTimeout)
	defer cancel()
	if err := rot.SyncFirst(sctx); err != nil {
		return err
	}
	if err := mgr.Add(rot); err != nil {
		return err
	}
	log.Info("managing the webhook certificates", "secret", o.operatorNamespace+"/"+o.webhookCertSecret, "service", o.webhookService, "dir", o.webhookCertDir)
	return mgr.AddReadyzCheck("webhook-certs", rot.Checker)
}

// noHostCluster is the local manager's configuration when fleet mode runs
// without --kubeconfig: nothing in fleet mode uses the local cluster
// (controllers engage only the folder's clusters, leader election is off),
// so it is never dialled.
var noHostCluster = &rest.Config{Host: "https://no-host-cluster.berth.invalid"}

// runFleet is fleet mode: one process serves every cluster whose kubeconfig
// is a file of --fleet-kubeconfig-dir, each under its own cluster id (the
// file name without extension) with its own reconciler, lease API token and
// registration (fleet.Members). Clusters join and leave as files come and go.
func runFleet(ctx context.Context, o options, log logr.Logger) error {
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	// The host cluster, when there is one, holds only leader election.
	host := noHostCluster
	if o.kubeconfig != "" {
		if host, err = restConfig(o.kubeconfig); err != nil {
			return err
		}
		o.rateLimit(host)
	}
	cacheOpts, err := managedCache()
	if err != nil {
		return err
	}
	dir := fleet.NewKubeconfigDir(o.fleetKubeconfigDir, log.WithName("fleet-dir"), func(co *cluster.Options) {
		co.Scheme = scheme
		co.Cache = cacheOpts
	})
	dir.ConfigureREST = o.rateLimit
	mopts := mcmanager.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.metricsBindAddress},
		HealthProbeBindAddress: o.healthProbeBindAddress,
	}
	leading, err := o.elect(host, &mopts, "berth-agent-fleet.berth.skaphos.io")
	if err != nil {
		return err
	}
	mgr, err := mcmanager.New(host, dir, mopts)
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	view := o.fleetView(nil, log) // it lists the fleet with the members' tokens (below)
	if err := mgr.GetLocalManager().Add(view); err != nil {
		return err
	}
	members := &fleet.Members{
		LeaseClient: func(id string) (fleet.LeaseClient, error) {
			leases, err := newLeaseClient(o, clusterTokenFile(o, id), log.WithValues("cluster", id))
			if err != nil {
				return nil, err
			}
			return leases, nil
		},
		ManagedWorkloads:     o.managedWorkloads,
		OperatorNamespace:    o.operatorNamespace,
		AgentVersion:         version,
		HeartbeatInterval:    o.heartbeatInterval,
		ConcurrentReconciles: o.concurrentReconciles,
		LeadingUntil:         leading,
		Labels:               func(id string) map[string]string { return clusterLabels(o, id, log) },
		Fleet:                view,
		Log:                  log,
	}
	view.Lister, view.OnChange = members, members.WakePlacement
	dir.BeforeLeave = members.Leave
	if err := members.SetupWithManager(mgr); err != nil {
		return err
	}
	// The shared token, for readiness only.
	shared, err := newLeaseClient(o, o.leaseAPITokenFile, log)
	if err != nil {
		return err
	}
	if err := addProbes(mgr, shared); err != nil {
		return err
	}
	if o.managedWorkloads {
		log.Info("fleet mode serves no admission webhooks: install them in each member cluster (docs/operations.md)")
	}
	log.Info("starting berth-agent in fleet mode", "version", version, "dir", o.fleetKubeconfigDir, "hostCluster", o.kubeconfig != "",
		"managedWorkloads", o.managedWorkloads, "leaseAPI", o.leaseAPIURL)
	return mgr.Start(ctx)
}

// clusterLabels are the labels a fleet-mode cluster registers:
// DIR/<cluster>.labels (key=value pairs separated by commas) when it
// exists, else --cluster-labels. A file that cannot be read or holds bad
// labels is logged and the cluster registers --cluster-labels.
func clusterLabels(o options, id string, log logr.Logger) map[string]string {
	path := filepath.Join(o.fleetKubeconfigDir, id+".labels")
	data, err := os.ReadFile(path)
	switch {
	case os.IsNotExist(err):
		return o.clusterLabels
	case err != nil:
		log.Error(err, "cannot read the cluster's labels; it registers --cluster-labels", "cluster", id)
		return o.clusterLabels
	}
	set, err := labels.ConvertSelectorToLabelsMap(strings.TrimSpace(string(data)))
	if err == nil {
		err = validateLabels(set)
	}
	if err != nil {
		log.Error(err, "bad labels; the cluster registers --cluster-labels", "cluster", id, "file", path)
		return o.clusterLabels
	}
	return set
}

// clusterTokenFile is the lease API token of a fleet-mode cluster:
// DIR/<cluster>.token when it exists, else --lease-api-token-file. The lease
// API lets a token act only for its own subject, so each cluster needs its own.
func clusterTokenFile(o options, id string) string {
	path := filepath.Join(o.fleetKubeconfigDir, id+".token")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	return o.leaseAPITokenFile
}
