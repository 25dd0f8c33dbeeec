package kubeenv_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/poll"
)

// waitTimeout bounds every wait for a cluster to act; they take seconds.
const waitTimeout = time.Minute

// TestClusters runs three clusters, as the end-to-end suites do, and checks what those
// suites rely on.
func TestClusters(t *testing.T) {
	before := children(t)
	begin := time.Now()
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 3, Nodes: 2})
	ready := time.Since(begin)
	rss, err := env.ResidentMemory()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d clusters ready in %s; resident memory %d MiB", len(env.Clusters), ready.Round(time.Millisecond), rss>>20)

	t.Run("every cluster runs a Deployment on its kwok nodes", func(t *testing.T) {
		for _, c := range env.Clusters {
			t.Run(c.Name, func(t *testing.T) {
				t.Parallel()
				runDeployment(t, c, "web")
			})
		}
	})
	t.Run("a gated Pod waits for its gate", func(t *testing.T) {
		testSchedulingGate(t, env.Clusters[0])
	})
	t.Run("a test acts as another user", func(t *testing.T) {
		testImpersonation(t, env.Clusters[1])
	})
	t.Run("one cluster stops and starts on its data", func(t *testing.T) {
		testClusterLoss(t, env.Clusters[2], env.Clusters[0])
	})
	t.Run("existing clusters are used through their kubeconfigs", func(t *testing.T) {
		testExternal(t, env)
	})
	t.Run("no process is left behind", func(t *testing.T) {
		for _, c := range env.Clusters {
			kubeenv.RequireManaged(t, c)
		}
		running := children(t)
		if got, want := len(running)-len(before), 5*len(env.Clusters); got != want {
			t.Errorf("%d processes run for %d clusters, want %d", got, len(env.Clusters), want)
		}
		if err := env.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(before, children(t)); diff != "" {
			t.Errorf("child processes after Stop (-before +after):\n%s", diff)
		}
	})
}

// runDeployment runs a Deployment of three replicas in c and waits until all are
// available on c's nodes.
func runDeployment(t *testing.T, c *kubeenv.Cluster, name string) {
	ctx := t.Context()
	cs := clientset(t, c.RESTConfig())
	dep := builders.Deployment("", name).Replicas(3).Obj()
	if _, err := cs.AppsV1().Deployments(metav1.NamespaceDefault).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment: %v", err)
	}
	poll.ForCondition(t, waitTimeout, "the Deployment's Pods to be available", func(ctx context.Context) (bool, error) {
		got, err := cs.AppsV1().Deployments(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		return err == nil && got.Status.AvailableReplicas == 3, err
	})
	pods, err := cs.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if pod.Status.Phase != corev1.PodRunning || !strings.HasPrefix(pod.Spec.NodeName, c.Name+"-node-") {
			t.Errorf("Pod %s is %s on node %q, want Running on a node of %s", pod.Name, pod.Status.Phase, pod.Spec.NodeName, c.Name)
		}
	}
}

// testSchedulingGate checks that a gated Pod stays Pending while an ungated one is
// scheduled and runs, and runs once its gate is removed.
func testSchedulingGate(t *testing.T, c *kubeenv.Cluster) {
	ctx := t.Context()
	pods := clientset(t, c.RESTConfig()).CoreV1().Pods(metav1.NamespaceDefault)
	gated := builders.Pod("", "gated").Obj()
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
	for _, p := range []*corev1.Pod{gated, builders.Pod("", "ungated").Obj()} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Pod: %v", err)
		}
	}
	poll.ForCondition(t, waitTimeout, "the ungated Pod to run", podRunning(pods, "ungated"))

	got, err := pods.Get(ctx, "gated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodPending || got.Spec.NodeName != "" || scheduledReason(got) != corev1.PodReasonSchedulingGated {
		t.Fatalf("gated Pod is %s on node %q with PodScheduled reason %q, want Pending, unbound, %s",
			got.Status.Phase, got.Spec.NodeName, scheduledReason(got), corev1.PodReasonSchedulingGated)
	}

	got.Spec.SchedulingGates = nil
	if _, err := pods.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("remove the scheduling gate: %v", err)
	}
	poll.ForCondition(t, waitTimeout, "the formerly gated Pod to run", podRunning(pods, "gated"))
}

// testImpersonation checks that the API server sees the user and groups of ConfigAs and
// WriteKubeconfigAs, and authorizes that user's requests, not the administrator's.
func testImpersonation(t *testing.T, c *kubeenv.Cluster) {
	path := filepath.Join(t.TempDir(), "alice.kubeconfig")
	if err := c.WriteKubeconfigAs(path, "alice", "team-a"); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		config func(t *testing.T) *rest.Config
	}{
		"ConfigAs": {config: func(*testing.T) *rest.Config { return c.ConfigAs("alice", "team-a") }},
		"WriteKubeconfigAs": {config: func(t *testing.T) *rest.Config {
			cfg, err := clientcmd.BuildConfigFromFlags("", path)
			if err != nil {
				t.Fatal(err)
			}
			return cfg
		}},
	}
	want := authenticationv1.UserInfo{Username: "alice", Groups: []string{"team-a", "system:authenticated"}}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cs := clientset(t, tc.config(t))
			review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, review.Status.UserInfo); diff != "" {
				t.Errorf("user (-want +got):\n%s", diff)
			}
			_, err = cs.CoreV1().Secrets(metav1.NamespaceSystem).List(t.Context(), metav1.ListOptions{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("alice lists Secrets: %v, want Forbidden", err)
			}
		})
	}
}

// testClusterLoss stops lost, checks that other still works, and starts lost again: its
// objects are back and its old clients work again.
func testClusterLoss(t *testing.T, lost, other *kubeenv.Cluster) {
	kubeenv.RequireManaged(t, lost)
	ctx := t.Context()
	configMaps := clientset(t, lost.RESTConfig()).CoreV1().ConfigMaps(metav1.NamespaceDefault)
	keep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept"}, Data: map[string]string{"k": "v"}}
	if _, err := configMaps.Create(ctx, keep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	begin := time.Now()
	if err := lost.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s stopped in %s", lost.Name, time.Since(begin).Round(time.Millisecond))
	if _, err := configMaps.Get(ctx, "kept", metav1.GetOptions{}); err == nil {
		t.Fatalf("%s answers after Stop", lost.Name)
	}
	runDeployment(t, other, "while-"+lost.Name+"-is-down")

	begin = time.Now()
	if err := lost.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s started again in %s", lost.Name, time.Since(begin).Round(time.Millisecond))
	got, err := configMaps.Get(ctx, "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get ConfigMap after restart: %v", err)
	}
	if diff := cmp.Diff(keep.Data, got.Data); diff != "" {
		t.Errorf("ConfigMap after restart (-want +got):\n%s", diff)
	}
	runDeployment(t, lost, "after-restart")
}

// testExternal points BERTH_TEST_KUBECONFIGS at env's kubeconfigs, as one would at kind
// clusters, and checks that Start uses those clusters and cannot stop them.
func testExternal(t *testing.T, env *kubeenv.Env) {
	var paths []string
	for _, c := range env.Clusters {
		paths = append(paths, c.KubeconfigPath)
	}
	t.Setenv(kubeenv.ExternalKubeconfigsEnv, strings.Join(paths, ","))
	external := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 2})

	var names []string
	for _, c := range external.Clusters {
		names = append(names, c.Name)
		if err := c.Stop(t.Context()); err == nil || c.Managed() {
			t.Errorf("%s: Stop = %v, Managed = %t; want ErrNotManaged, false", c.Name, err, c.Managed())
		}
	}
	if diff := cmp.Diff([]string{env.Clusters[0].Name, env.Clusters[1].Name}, names); diff != "" {
		t.Errorf("external clusters (-want +got):\n%s", diff)
	}
	runDeployment(t, external.Clusters[1], "external")
}

// TestEnvtestUsesTheBinaries starts controller-runtime's envtest from BinDir, as the
// integration suites do.
func TestEnvtestUsesTheBinaries(t *testing.T) {
	dir, err := kubeenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest from %s (run `make tools`): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	version, err := clientset(t, cfg).Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("envtest runs kube-apiserver %s", version.GitVersion)
}

func podRunning(pods interface {
	Get(context.Context, string, metav1.GetOptions) (*corev1.Pod, error)
}, name string) wait.ConditionWithContextFunc {
	return func(ctx context.Context) (bool, error) {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning, err
	}
}

func scheduledReason(pod *corev1.Pod) string {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return cond.Reason
		}
	}
	return ""
}

func clientset(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// children returns the IDs of this process's child processes, from /proc.
func children(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// stat is "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(self) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}
