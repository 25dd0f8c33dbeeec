package localfleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berthfleet/berth/admission"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/charts"
	"github.com/berthfleet/berth/test/poll"
)

// Every agent (per cluster, or fleet mode's for each cluster) acts as the
// service account user the deploy/ manifests name, with no more rights than
// deploy/rbac gives it, and a per-cluster agent serves the admission webhooks
// registered in its cluster: the fleet runs Berth as a cluster would, and
// proves that those manifests are enough.
var agentGroups = []string{"system:serviceaccounts", "system:serviceaccounts:berth-system"}

// grantAgentAccess creates deploy/rbac's ClusterRole and its Role in the
// agent's namespace, binds both to the agent's user, and writes the
// kubeconfig the agent runs with.
func (m *Member) grantAgentAccess(ctx context.Context) error {
	objs, err := agentRBAC()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := m.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: create %s %s: %w", m.Name, obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	return m.Cluster.WriteKubeconfigAs(m.agentKubeconfig(), admission.DefaultOperatorUser, agentGroups...)
}

// agentRBAC reads deploy/rbac/role.yaml (a ClusterRole, and a Role in the
// agent's namespace) and returns what installs it for the agent's user:
// the namespace, the roles and their bindings.
func agentRBAC() ([]ctrlclient.Object, error) {
	data, err := os.ReadFile(filepath.Join(charts.RepoDir(), "deploy", "rbac", "role.yaml"))
	if err != nil {
		return nil, err
	}
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: admission.DefaultOperatorUser}}
	var objs []ctrlclient.Object
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("read deploy/rbac/role.yaml: %w", err)
		}
		switch meta.Kind {
		case "ClusterRole":
			role := &rbacv1.ClusterRole{}
			if err := yaml.UnmarshalStrict([]byte(doc), role); err != nil {
				return nil, fmt.Errorf("read deploy/rbac/role.yaml: %w", err)
			}
			objs = append(objs, role, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: role.Name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
				Subjects:   subjects,
			})
		case "Role":
			role := &rbacv1.Role{}
			if err := yaml.UnmarshalStrict([]byte(doc), role); err != nil {
				return nil, fmt.Errorf("read deploy/rbac/role.yaml: %w", err)
			}
			objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: role.Namespace}}, role, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: role.Namespace, Name: role.Name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
				Subjects:   subjects,
			})
		case "":
		default:
			return nil, fmt.Errorf("deploy/rbac/role.yaml: unexpected kind %q", meta.Kind)
		}
	}
	return objs, nil
}

func (m *Member) agentKubeconfig() string { return filepath.Join(m.dir, "berth-agent.kubeconfig") }

// registerAdmission registers the agent's webhooks (mutating and
// validating, failing closed) and the ValidatingAdmissionPolicy. Until the
// agent serves them, creating a managed Pod fails; awaitAdmission waits for
// that before the workload is applied.
func (m *Member) registerAdmission(ctx context.Context) error {
	addr := fmt.Sprintf("127.0.0.1:%d", m.webhookPort)
	objs, err := admission.Manifests(admission.ManifestOptions{URL: "https://" + addr, CABundle: m.webhookCA, Mutate: true, TimeoutSeconds: 5})
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := m.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: register admission %s: %w", m.Name, obj.GetName(), err)
		}
	}
	return nil
}

// AwaitAdmission waits until the API server sends managed Pods through the
// agent's webhook: a dry-run managed Pod comes back gated. Until then a
// managed Pod could be created ungated, so the Deployment must wait.
func (m *Member) AwaitAdmission(ctx context.Context) error {
	w := m.fleet.opts.Workload
	var last error
	_, err := poll.Until(ctx, 60*time.Second, "admission in effect", func(ctx context.Context) (bool, error) {
		p := builders.Pod(w.Namespace, "admission-probe").ManagedBy(w.Name).Obj()
		p.Spec.Containers[0].Command = []string{WorkloadCommand} // as the workload's, which a fenced lease needs
		if last = m.Client.Create(ctx, p, ctrlclient.DryRunAll); last != nil {
			return false, nil
		}
		if !slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == reconciler.SchedulingGate }) {
			last = errors.New("a managed Pod is admitted without the scheduling gate")
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s: admission is not in effect: %w (last: %v)", m.Name, err, last)
	}
	return nil
}
