package charts

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	leaseclient "github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/pki"
	"github.com/berthfleet/berth/test/podrun"
	"github.com/berthfleet/berth/test/poll"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	binaries.Main(m, "berth-leaseapi")
}

// restricted labels a namespace to enforce the restricted Pod Security profile: the API
// server then refuses any Pod of the charts that breaks it.
var restricted = map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}

// TestInstall installs the plain manifests of deploy/install on one real cluster and both
// charts with helm on another: every object is accepted, the Pods they make are admitted
// under the restricted profile, and the lease API runs as the chart runs it (the
// Kubernetes store, as the chart's ServiceAccount with only the chart's rights).
func TestInstall(t *testing.T) {
	if _, err := HelmBinary(); err != nil {
		t.Fatal(err)
	}
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 2})
	plain, helm := env.Clusters[0], env.Clusters[1]

	t.Run("plain manifests", func(t *testing.T) {
		t.Parallel()
		cl := client(t, plain)
		for _, dir := range []string{"agent", "leaseapi"} {
			kubectl(t, plain, "apply", "-k", filepath.Join(RepoDir(), "deploy", "install", dir))
		}
		waitPods(t, cl, "berth-system", "berth-agent", 2)
		s := &appsv1.StatefulSet{}
		if err := cl.Get(t.Context(), ctrlclient.ObjectKey{Namespace: "berth-system", Name: "berth-leaseapi"}, s); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("lease API chart on each store", func(t *testing.T) {
		t.Parallel()
		cl := client(t, helm)
		for ns, values := range map[string]Values{
			"leases-sqlite":   nil,
			"leases-postgres": {"store.type=postgres", "store.postgres.dsnSecret.name=pg"},
		} {
			createNamespace(t, cl, ns)
			install(t, helm, LeaseAPI, ns, append(with(leaseAPIRequired), values...))
		}
		waitPods(t, cl, "leases-postgres", "berth-leaseapi", 2)
	})

	t.Run("lease API chart on Kubernetes Leases, run as its account", func(t *testing.T) {
		t.Parallel()
		cl := client(t, helm)
		const ns = "leases-kubernetes"
		createNamespace(t, cl, ns)
		ca, err := pki.NewAuthority("leaseapi")
		if err != nil {
			t.Fatal(err)
		}
		serving, err := ca.ServingCert("berth-leaseapi", "127.0.0.1", "berth-leaseapi."+ns+".svc")
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		_, tokenFiles, err := leaseapitest.WriteTokens(dir, map[string]string{"east": "east-token", "ops": "ops-token"})
		if err != nil {
			t.Fatal(err)
		}
		tokens, err := os.ReadFile(filepath.Join(dir, "tokens"))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*corev1.Secret{
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leaseapi-tls"}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": serving.Cert, "tls.key": serving.Key}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leaseapi-tokens"}, Data: map[string][]byte{"tokens": tokens}},
		} {
			if err := cl.Create(t.Context(), s); err != nil {
				t.Fatal(err)
			}
		}
		install(t, helm, LeaseAPI, ns, with(leaseAPIRequired, "store.type=kubernetes", "auth.adminSubjects={ops}"))
		waitPods(t, cl, ns, "berth-leaseapi", 2)

		d := &appsv1.Deployment{}
		if err := cl.Get(t.Context(), ctrlclient.ObjectKey{Namespace: ns, Name: "berth-leaseapi"}, d); err != nil {
			t.Fatal(err)
		}
		port, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		metricsPort, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		// The chart listens on :8443; this machine's port is a free one.
		p, err := podrun.Start(t.Context(), helm.RESTConfig(), podrun.Pod{Namespace: ns, Template: d.Spec.Template}, podrun.Options{
			BinDir: binaries.Dir, Dir: filepath.Join(t.TempDir(), "pod"),
			ExtraArgs: []string{fmt.Sprintf("--listen=127.0.0.1:%d", port), fmt.Sprintf("--metrics-listen=127.0.0.1:%d", metricsPort)},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		caFile := filepath.Join(dir, "ca.crt")
		if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		east, err := leaseclient.New(leaseclient.Config{URL: fmt.Sprintf("https://127.0.0.1:%d", port), TokenFile: tokenFiles["east"], CAFile: caFile, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var notReady error
		if _, err := poll.Until(t.Context(), 30*time.Second, "the chart's lease API is ready", func(ctx context.Context) (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			notReady = east.Ready(ctx)
			return notReady == nil, nil
		}); err != nil {
			t.Fatalf("%v (last: %v)\n%s", err, notReady, p.LogTail(20))
		}
		got, err := east.Acquire(t.Context(), "payments", "exporter", "east", 10*time.Second)
		if err != nil {
			t.Fatalf("acquire through the chart's lease API: %v\n%s", err, p.LogTail(20))
		}
		if !got.Acquired || got.Holder != "east" || got.FencingToken != 1 {
			t.Fatalf("acquire: %+v, want east with token 1", got)
		}
		leases := &coordinationv1.LeaseList{}
		if err := cl.List(t.Context(), leases, ctrlclient.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(leases.Items) == 0 {
			t.Errorf("no Lease object in %s: the store did not write where the chart gave it rights", ns)
		}
	})
}

func client(t *testing.T, c *kubeenv.Cluster) ctrlclient.Client {
	t.Helper()
	cl, err := ctrlclient.New(c.RESTConfig(), ctrlclient.Options{Scheme: builders.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func createNamespace(t *testing.T, cl ctrlclient.Client, name string) {
	t.Helper()
	if err := cl.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: restricted}}); err != nil {
		t.Fatal(err)
	}
}

func install(t *testing.T, c *kubeenv.Cluster, chart, namespace string, values Values) {
	t.Helper()
	if err := Install(t.Context(), c.KubeconfigPath, chart, chart, namespace, values); err != nil {
		t.Fatal(err)
	}
}

func kubectl(t *testing.T, c *kubeenv.Cluster, args ...string) {
	t.Helper()
	bin, err := kubeenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", c.KubeconfigPath}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
}

// waitPods waits until the workload's controller has made n Pods: the API server admitted
// them under the namespace's Pod Security profile.
func waitPods(t *testing.T, cl ctrlclient.Client, namespace, name string, n int) {
	t.Helper()
	var last string
	_, err := poll.Until(t.Context(), 60*time.Second, fmt.Sprintf("%d Pods of %s/%s", n, namespace, name), func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := cl.List(ctx, pods, ctrlclient.InNamespace(namespace), ctrlclient.MatchingLabels{"app.kubernetes.io/name": name}); err != nil {
			return false, nil
		}
		events := &corev1.EventList{}
		if err := cl.List(ctx, events, ctrlclient.InNamespace(namespace)); err == nil {
			for _, e := range events.Items {
				if e.Reason == "FailedCreate" {
					last = e.Message
				}
			}
		}
		return len(pods.Items) >= n, nil
	})
	if err != nil {
		t.Fatalf("%v (last refusal: %s)", err, last)
	}
}
