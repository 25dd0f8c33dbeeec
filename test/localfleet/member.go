package localfleet

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/charts"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/pki"
	"github.com/berthfleet/berth/test/process"
)

// Workload is the BerthLease and managed Deployment every cluster gets.
type Workload struct {
	Namespace, Name  string
	Replicas         int32
	TTLSeconds       int32
	HeartbeatSeconds int32
	// ClusterHeartbeat is the agents' --cluster-heartbeat-interval.
	ClusterHeartbeat time.Duration
	// PodFencing is the BerthLease's spec.podFencing; with Exec the Pod
	// template names its command (WorkloadCommand), which admission wraps.
	PodFencing berthv1alpha1.PodFencing
	// Placement and Failover are the BerthLease's spec.placement and
	// spec.failover.
	Placement *berthv1alpha1.Placement
	Failover  *berthv1alpha1.Failover
}

// WorkloadCommand is the command of the workload's container.
const WorkloadCommand = "/usr/local/bin/exporter"

// FenceImage is the image the per-cluster agents name for berth-fence
// (--fence-image). Nothing pulls it: test/fencerun runs the local binary.
const FenceImage = "ghcr.io/berthfleet/berth-agent:dev"

func (w Workload) withDefaults() Workload {
	if w.Namespace == "" {
		w.Namespace = "payments"
	}
	if w.Name == "" {
		w.Name = "exporter"
	}
	if w.Replicas == 0 {
		w.Replicas = 2
	}
	if w.TTLSeconds == 0 {
		w.TTLSeconds = 6
	}
	if w.HeartbeatSeconds == 0 {
		w.HeartbeatSeconds = 2
	}
	if w.ClusterHeartbeat == 0 {
		w.ClusterHeartbeat = time.Second
	}
	return w
}

// Member is one cluster of the fleet with its agent.
type Member struct {
	Name    string
	Cluster *kubeenv.Cluster
	Client  ctrlclient.Client
	Agent   *process.Process
	// Proxy sits between the agent and the lease API, so that a test can
	// cut this cluster off.
	Proxy *Proxy
	dir   string
	fleet *Fleet
	// webhookPort is where the member's agent serves admission, the same
	// across restarts, as its registrations say.
	webhookPort int
	// standbyWebhookPort is where its standby replicas serve admission (StartStandby).
	standbyWebhookPort int
	// webhookCA is the CA bundle that trusts the agent's serving certificate.
	webhookCA []byte
	// MetricsURL is the agent's /metrics (the same across restarts), empty
	// unless Options.Metrics.
	MetricsURL string
	// metricsAddr is where the agent serves /metrics ("0": nowhere).
	metricsAddr string
	// chartValues are the berth-agent chart's values (Options.Helm), once installed.
	chartValues charts.Values
}

func newMember(ctx context.Context, c *kubeenv.Cluster, f *Fleet, dir string) (*Member, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := c.RESTConfig()
	if !f.opts.Helm { // the chart brings the CRD
		if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{crdDir()}, Scheme: builders.Scheme}); err != nil {
			return nil, fmt.Errorf("%s: install CRDs: %w", c.Name, err)
		}
	}
	cl, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: builders.Scheme})
	if err != nil {
		return nil, err
	}
	proxy, err := StartProxy(f.LeaseAPI.addr)
	if err != nil {
		return nil, err
	}
	m := &Member{Name: c.Name, Cluster: c, Client: cl, Proxy: proxy, dir: dir, fleet: f, metricsAddr: "0"}
	if f.opts.Metrics {
		port, err := freeport.Port()
		if err != nil {
			return nil, err
		}
		m.metricsAddr = fmt.Sprintf("127.0.0.1:%d", port)
		m.MetricsURL = "http://" + m.metricsAddr + "/metrics"
	}
	metricsPort, err := m.metricsPort()
	if err != nil {
		return nil, err
	}
	if f.opts.Helm {
		if m.webhookPort, err = onePortExcept(metricsPort); err != nil {
			return nil, err
		}
		return m, m.installAgentChart(ctx)
	}
	if err := m.grantAgentAccess(ctx); err != nil {
		return nil, err
	}
	if !f.admission() {
		return m, nil
	}
	if m.webhookPort, err = onePortExcept(metricsPort); err != nil {
		return nil, err
	}
	m.webhookCA, err = pki.WriteServing(m.certDir(), "berth-agent", "127.0.0.1", "localhost")
	return m, err
}

// onePortExcept is a free port other than taken (0 stands for none).
func onePortExcept(taken int) (int, error) {
	ports, err := freeport.PortsExcept(1, taken)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// crdDir is deploy/crd of this module, wherever the caller runs from.
func crdDir() string { return filepath.Join(charts.RepoDir(), "deploy", "crd") }

func (m *Member) certDir() string { return filepath.Join(m.dir, "webhook-certs") }

// ApplyWorkload creates the namespace, the BerthLease and the Deployment.
func (m *Member) ApplyWorkload(ctx context.Context) error {
	w := m.fleet.opts.Workload
	if err := m.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%s: create namespace: %w", m.Name, err)
	}
	bl := builders.BerthLease(w.Namespace, w.Name).TTL(w.TTLSeconds).Heartbeat(w.HeartbeatSeconds).PodFencing(w.PodFencing).
		Placement(w.Placement.DeepCopy()).Failover(w.Failover.DeepCopy()).Obj()
	if err := m.Client.Create(ctx, bl); err != nil {
		return fmt.Errorf("%s: create BerthLease: %w", m.Name, err)
	}
	deploy := builders.Deployment(w.Namespace, w.Name).ManagedBy(w.Name).Replicas(w.Replicas).Command(WorkloadCommand)
	if m.fleet.admission() {
		// Admission stamps each Pod with the gate and the BerthLease's UID.
		if err := m.AwaitAdmission(ctx); err != nil {
			return err
		}
	} else {
		// No admission (fleet mode): the template carries what admission
		// would stamp, and names the BerthLease's UID as it is now.
		deploy.ManagedUID(bl.UID).Gated()
	}
	err := m.Client.Create(ctx, deploy.Obj())
	if apierrors.IsAlreadyExists(err) {
		// Without admission, a BerthLease made anew has a new UID that the
		// template must name, as a GitOps tool re-rendering it would.
		err = m.Client.Patch(ctx, deploy.Obj(), ctrlclient.Merge)
	}
	if err != nil {
		return fmt.Errorf("%s: apply Deployment: %w", m.Name, err)
	}
	return nil
}

// Lease is the lease API's record of the workload's lease (a zero record
// when it cannot be read).
func (m *Member) Lease(ctx context.Context) leaseapi.Lease {
	w := m.fleet.opts.Workload
	l, _ := m.fleet.LeaseAPI.Admin.GetLease(ctx, w.Namespace, w.Name)
	return l
}

// BerthLease reads the member's BerthLease (empty if it cannot).
func (m *Member) BerthLease(ctx context.Context) berthv1alpha1.BerthLease {
	w := m.fleet.opts.Workload
	bl := berthv1alpha1.BerthLease{}
	_ = m.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: w.Namespace, Name: w.Name}, &bl)
	return bl
}

// SetSpec changes the spec of the workload's BerthLease in the member's
// cluster.
func (m *Member) SetSpec(ctx context.Context, change func(*berthv1alpha1.BerthLeaseSpec)) error {
	w := m.fleet.opts.Workload
	bl := berthv1alpha1.BerthLease{}
	if err := m.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: w.Namespace, Name: w.Name}, &bl); err != nil {
		return fmt.Errorf("%s: get BerthLease %s: %w", m.Name, w.Name, err)
	}
	patch := ctrlclient.MergeFrom(bl.DeepCopy())
	change(&bl.Spec)
	if err := m.Client.Patch(ctx, &bl, patch); err != nil {
		return fmt.Errorf("%s: patch the BerthLease's spec: %w", m.Name, err)
	}
	return nil
}

// StartAgent runs berth-agent for this cluster as clusterID (normally the
// member's own name; another id simulates a misconfigured agent).
func (m *Member) StartAgent(clusterID string) error {
	if m.fleet.opts.Helm {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return m.startChartAgent(ctx, clusterID)
	}
	p, err := m.StartAgentProcess(AgentProcess{ClusterID: clusterID})
	if err != nil {
		return err
	}
	m.Agent = p
	return nil
}

// AgentProcess says how StartAgentProcess runs one berth-agent process.
type AgentProcess struct {
	// ClusterID is its --cluster-id; the member's name when empty.
	ClusterID string
	// Unmanaged leaves out --managed-workloads (and with it admission and
	// berth-fence), as an agent run by hand or an older chart would.
	Unmanaged bool
	// WebhookPort is where it serves admission instead of the member's
	// port, which the registrations name: a second replica's own.
	WebhookPort int
	// Args are appended after the fleet's and the member's.
	Args []string
}

// StartAgentProcess runs one berth-agent process for this cluster, beside
// any other (the member's Agent is left as it is): a second replica, or an
// agent with other flags. The caller stops it.
func (m *Member) StartAgentProcess(a AgentProcess) (*process.Process, error) {
	clusterID := cmp.Or(a.ClusterID, m.Name)
	metrics := m.metricsAddr
	if a.WebhookPort != 0 {
		metrics = "0" // the member's address is its first replica's
	}
	api := m.fleet.LeaseAPI
	token, ok := api.TokenFiles[clusterID]
	if !ok {
		return nil, fmt.Errorf("no lease API token for %s", clusterID)
	}
	args := []string{
		"--cluster-id", clusterID,
		"--kubeconfig", m.agentKubeconfig(),
		"--lease-api-url", "http://" + m.Proxy.Addr,
		"--lease-api-token-file", token,
		"--metrics-bind-address", metrics,
		"--health-probe-bind-address", "0",
		"--cluster-heartbeat-interval", m.fleet.opts.Workload.ClusterHeartbeat.String(),
	}
	if !a.Unmanaged {
		args = append(args,
			"--managed-workloads",
			"--webhook-port", fmt.Sprint(cmp.Or(a.WebhookPort, m.webhookPort)),
			"--webhook-cert-dir", m.certDir(),
			"--fence-image", FenceImage,
		)
	}
	args = append(append(append(args, m.fleet.opts.AgentArgs...), m.fleet.opts.MemberAgentArgs[m.Name]...), a.Args...)
	bin := cmp.Or(m.fleet.opts.AgentBinary, filepath.Join(m.fleet.opts.BinDir, "berth-agent"))
	return process.Start("berth-agent", bin, filepath.Join(m.dir, fmt.Sprintf("berth-agent-%d.log", time.Now().UnixNano())), args...)
}

// StartStandby runs a second replica of the member's agent beside Agent (the
// fleet's agents, or args, must elect a leader): it serves admission at a port of
// its own, the same for every standby of this member. The caller stops it.
func (m *Member) StartStandby(args ...string) (*process.Process, error) {
	if m.standbyWebhookPort == 0 {
		port, err := onePortExcept(m.webhookPort)
		if err != nil {
			return nil, err
		}
		m.standbyWebhookPort = port
	}
	return m.StartAgentProcess(AgentProcess{WebhookPort: m.standbyWebhookPort, Args: args})
}

// StopAgent kills the member's agent, as a crash would.
func (m *Member) StopAgent() { m.Agent.Kill() }

func (m *Member) stop() {
	m.StopAgent()
	if m.Proxy != nil {
		m.Proxy.Close()
	}
}

// ElectionLease is the Lease in which the member's agent replicas elect their leader.
var ElectionLease = ctrlclient.ObjectKey{Namespace: "berth-system", Name: "berth-agent.berth.skaphos.io"}

// Leader returns which of procs (agent processes of this member, run with
// --leader-elect) leads the election now, or nil when none of them does: the
// election Lease names the identity each logs when it starts. An agent that
// does not log it (an older release) is the leader when it is the only live
// one of procs that has logged taking the election: a replica that loses it
// exits.
func (m *Member) Leader(ctx context.Context, procs ...*process.Process) *process.Process {
	l := &coordinationv1.Lease{}
	if err := m.Client.Get(ctx, ElectionLease, l); err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return nil
	}
	var elected []*process.Process
	for _, p := range procs {
		switch {
		case p == nil || p.Exited():
		case p.LogContains(*l.Spec.HolderIdentity):
			return p
		case p.LogContains("Successfully acquired lease"): // client-go's line
			elected = append(elected, p)
		}
	}
	if len(elected) == 1 {
		return elected[0]
	}
	return nil
}
