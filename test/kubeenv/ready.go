package kubeenv

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// registerNodes creates the cluster's kwok nodes, <cluster>-node-1 and on, unless they
// exist. A node name tells which cluster ran a Pod.
func registerNodes(ctx context.Context, cs kubernetes.Interface, cluster string, n int) error {
	for i := 1; i <= n; i++ {
		node := kwokNode(fmt.Sprintf("%s-node-%d", cluster, i))
		_, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("register node %s: %w", node.Name, err)
		}
	}
	return nil
}

func kwokNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			corev1.LabelHostname:   name,
			corev1.LabelOSStable:   "linux",
			corev1.LabelArchStable: "amd64",
			"type":                 "kwok",
		},
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
	}}
}

// waitReady waits until the cluster is ready (see Env) or one of its processes exits.
func (c *Cluster) waitReady(ctx context.Context) error {
	var why string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if c.plane != nil {
			if err := c.plane.exited(); err != nil {
				return false, err
			}
		}
		why = notReady(ctx, c.client)
		return why == "", nil
	})
	if err != nil {
		return fmt.Errorf("wait until ready: %w (waiting for %s)", err, why)
	}
	return nil
}

// notReady says what the cluster still lacks to be ready, or "" when it is ready: the API
// server answers, there are nodes, every node is Ready and free of the taints that keep
// Pods off a node that is not (yet) ready, and the default ServiceAccount exists (Pods
// are refused without it).
func notReady(ctx context.Context, cs kubernetes.Interface) string {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("the API server (%v)", err)
	}
	if len(nodes.Items) == 0 {
		return "nodes"
	}
	for i := range nodes.Items {
		if why := nodeNotReady(&nodes.Items[i]); why != "" {
			return why
		}
	}
	_, err = cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("the default ServiceAccount (%v)", err)
	}
	return ""
}

func nodeNotReady(node *corev1.Node) string {
	ready := false
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			ready = cond.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		return fmt.Sprintf("node %s to be Ready", node.Name)
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == corev1.TaintNodeNotReady || taint.Key == corev1.TaintNodeUnreachable {
			return fmt.Sprintf("node %s to lose taint %s", node.Name, taint.Key)
		}
	}
	return ""
}
