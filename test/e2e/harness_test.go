package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/kubeenv"
)

// The workload every cluster gets, and its timing: short, so that the suite
// is quick, and with the heartbeat at a third of the TTL.
const (
	workloadNS  = "payments"
	workload    = "exporter"
	replicas    = 2
	ttlSeconds  = 6
	hbSeconds   = 2
	adminToken  = "ops-token"
	adminName   = "ops"
	clusterBeat = time.Second
)

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = berthv1alpha1.AddToScheme(s)
	return s
}()

// binDir holds berth-leaseapi and berth-agent, built once for the suite.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/berthfleet/berth/cmd/berth-leaseapi", "github.com/berthfleet/berth/cmd/berth-agent")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a process the suite started; it is killed when the test ends.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, name, logPath string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("end of %s:\n%s", logPath, tail(logPath, 25))
		}
	})
	return p
}

func tail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *proc) logContains(s string) bool {
	b, _ := os.ReadFile(p.log)
	return strings.Contains(string(b), s)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// leaseAPI is a running berth-leaseapi with a token per cluster and an admin.
type leaseAPI struct {
	*proc
	url    string
	tokens map[string]string // subject -> token file
	admin  *client.Client
}

func startLeaseAPI(t *testing.T, dir string, subjects []string) *leaseAPI {
	t.Helper()
	tokens := map[string]string{}
	var lines strings.Builder
	for _, s := range append(append([]string(nil), subjects...), adminName) {
		token := s + "-token"
		sum := sha256.Sum256([]byte(token))
		fmt.Fprintf(&lines, "%s:%s\n", s, hex.EncodeToString(sum[:]))
		path := filepath.Join(dir, s+".token")
		if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		tokens[s] = path
	}
	tokenFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokenFile, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startProc(t, "berth-leaseapi", filepath.Join(dir, "berth-leaseapi.log"),
		"--listen", addr, "--metrics-listen", "", "--sqlite-path", filepath.Join(dir, "leases.db"),
		"--token-file", tokenFile, "--admin-subjects", adminName)
	api := &leaseAPI{proc: p, url: "http://" + addr, tokens: tokens}
	admin, err := client.New(client.Config{URL: api.url, Token: adminToken, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	api.admin = admin
	waitFor(t, 20*time.Second, "berth-leaseapi ready", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return admin.Ready(ctx) == nil
	})
	return api
}

// member is one cluster with its workload and agent.
type member struct {
	name    string
	cluster *kubeenv.Cluster
	client  ctrlclient.Client
	agent   *proc
	dir     string
}

// newMember installs the CRD and applies the workload to c.
func newMember(t *testing.T, c *kubeenv.Cluster, dir string) *member {
	t.Helper()
	cfg := c.RESTConfig()
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("..", "..", "deploy", "crd")}, Scheme: scheme}); err != nil {
		t.Fatalf("%s: install CRDs: %v", c.Name, err)
	}
	cl, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{name: c.Name, cluster: c, client: cl, dir: filepath.Join(dir, c.Name)}
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m.applyWorkload(t)
	return m
}

// applyWorkload creates the BerthLease and a Deployment of managed Pods.
// The Pod template carries the gate and the UID label, as admission would
// set them, so that this suite does not depend on webhooks.
func (m *member) applyWorkload(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if err := m.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workloadNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	bl := &berthv1alpha1.BerthLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: workloadNS, Name: workload},
		Spec:       berthv1alpha1.BerthLeaseSpec{TTLSeconds: ttlSeconds, HeartbeatIntervalSeconds: hbSeconds},
	}
	if err := m.client.Create(ctx, bl); err != nil {
		t.Fatalf("%s: create BerthLease: %v", m.name, err)
	}
	podLabels := map[string]string{"app": workload, reconciler.ManagedLease: workload, reconciler.ManagedUID: string(bl.UID)}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: workloadNS, Name: workload},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": workload}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					SchedulingGates: []corev1.PodSchedulingGate{{Name: reconciler.SchedulingGate}},
					Containers:      []corev1.Container{{Name: workload, Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
	if err := m.client.Create(ctx, deploy); err != nil {
		t.Fatalf("%s: create Deployment: %v", m.name, err)
	}
}

// startAgent runs berth-agent for the member's cluster as clusterID.
func (m *member) startAgent(t *testing.T, api *leaseAPI, clusterID string) {
	t.Helper()
	certDir := filepath.Join(m.dir, "webhook-certs")
	writeSelfSignedCert(t, certDir)
	token, ok := api.tokens[clusterID]
	if !ok {
		t.Fatalf("no lease API token for %s", clusterID)
	}
	m.agent = startProc(t, "berth-agent", filepath.Join(m.dir, fmt.Sprintf("berth-agent-%d.log", time.Now().UnixNano())),
		"--cluster-id", clusterID,
		"--kubeconfig", m.cluster.KubeconfigPath,
		"--lease-api-url", api.url,
		"--lease-api-token-file", token,
		"--managed-workloads",
		"--webhook-port", fmt.Sprint(freePort(t)),
		"--webhook-cert-dir", certDir,
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
		"--cluster-heartbeat-interval", clusterBeat.String(),
	)
}

func (m *member) berthLease(t *testing.T) berthv1alpha1.BerthLease {
	bl := berthv1alpha1.BerthLease{}
	_ = m.client.Get(t.Context(), ctrlclient.ObjectKey{Namespace: workloadNS, Name: workload}, &bl)
	return bl
}

func writeSelfSignedCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth-agent"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tls.crt", "CERTIFICATE", der)
	write("tls.key", "EC PRIVATE KEY", keyDER)
}

// waitFor polls cond until it holds, failing the test after timeout; it
// returns how long it took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}
