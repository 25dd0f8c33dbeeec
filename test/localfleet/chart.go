package localfleet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/test/charts"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/podrun"
)

// With Options.Helm each cluster gets Berth as a user installs it: the berth-agent chart,
// installed with helm into namespace berth-system (enforcing the restricted Pod Security
// profile), with its CRD, RBAC, webhook Service and registrations, policies and
// agent-managed webhook certificates. The agent process then runs as the chart's
// Deployment would run it (test/podrun): as the chart's ServiceAccount with a token from
// the TokenRequest API, with the Deployment's own arguments, and reached by the API server
// through the chart's webhook Service.

// agentNamespace is where the chart is installed.
const agentNamespace = "berth-system"

// installAgentChart installs (or upgrades) the berth-agent chart in the member's cluster.
// The ports a kubelet would give the Pod are free ports of this machine: the webhook
// Service's port equals the agent's, as the API server dials the Service's port.
func (m *Member) installAgentChart(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
	}}}
	if err := m.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%s: create namespace %s: %w", m.Name, agentNamespace, err)
	}
	token, err := os.ReadFile(m.fleet.LeaseAPI.TokenFiles[m.Name])
	if err != nil {
		return err
	}
	// None of the Pod's ports may be another's: the chart refuses a Pod that names
	// one twice (and a port found earlier may be found again once it was closed).
	metricsPort, err := m.metricsPort()
	if err != nil {
		return err
	}
	ports, err := freeport.PortsExcept(2, m.webhookPort, metricsPort)
	if err != nil {
		return err
	}
	if metricsPort == 0 {
		metricsPort = ports[1]
	}
	probePort := ports[0]
	values := charts.Values{
		"clusterId=" + m.Name,
		"leaseApi.url=http://" + m.Proxy.Addr,
		"leaseApi.token.value=" + strings.TrimSpace(string(token)),
		fmt.Sprintf("webhook.port=%d", m.webhookPort),
		fmt.Sprintf("webhook.service.port=%d", m.webhookPort),
		fmt.Sprintf("webhook.timeoutSeconds=%d", 5),
		fmt.Sprintf("metrics.port=%d", metricsPort),
		fmt.Sprintf("healthProbePort=%d", probePort),
		"clusterHeartbeatInterval=" + m.fleet.opts.Workload.ClusterHeartbeat.String(),
		"logging.format=text",
	}
	if err := charts.Install(ctx, m.Cluster.KubeconfigPath, charts.Agent, charts.Agent, agentNamespace, values); err != nil {
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	m.chartValues = values
	return nil
}

// metricsPort is the port of the member's /metrics, or 0 when the fleet serves none (the
// chart always serves metrics, on a free port then).
func (m *Member) metricsPort() (int, error) {
	if _, port, err := net.SplitHostPort(m.metricsAddr); err == nil {
		return strconv.Atoi(port)
	}
	return 0, nil
}

// startChartAgent runs the chart's agent Deployment as a local process (test/podrun), as
// clusterID (the chart's own unless another id simulates a misconfigured agent).
func (m *Member) startChartAgent(ctx context.Context, clusterID string) error {
	d := &appsv1.Deployment{}
	if err := m.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: agentNamespace, Name: charts.Agent}, d); err != nil {
		return fmt.Errorf("%s: read the chart's Deployment: %w", m.Name, err)
	}
	extra := append(append([]string{}, m.fleet.opts.AgentArgs...), m.fleet.opts.MemberAgentArgs[m.Name]...)
	if clusterID != m.Name {
		extra = append(extra, "--cluster-id="+clusterID)
	}
	p, err := podrun.Start(ctx, m.Cluster.RESTConfig(), podrun.Pod{Namespace: agentNamespace, Template: d.Spec.Template}, podrun.Options{
		BinDir:    m.fleet.opts.BinDir,
		Dir:       filepath.Join(m.dir, "agent-pod"),
		ExtraArgs: extra,
	})
	if err != nil {
		return fmt.Errorf("%s: run the chart's agent: %w", m.Name, err)
	}
	m.Agent = p
	return nil
}

// UpgradeAgentChart runs the chart's upgrade with the same values again, as a GitOps sync
// or `helm upgrade` does, and with more values if given.
func (m *Member) UpgradeAgentChart(ctx context.Context, more ...string) error {
	if m.chartValues == nil {
		return fmt.Errorf("%s: the chart is not installed", m.Name)
	}
	return charts.Install(ctx, m.Cluster.KubeconfigPath, charts.Agent, charts.Agent, agentNamespace, append(slices.Clone(m.chartValues), more...))
}
