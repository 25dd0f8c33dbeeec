package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/berthfleet/berth/admission"
	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/kubeenv"
	"github.com/berthfleet/berth/test/poll"
)

// The names deploy/ uses, which the generated RBAC names.
const (
	testNamespace = "berth-system"
	testSecret    = "berth-agent-webhook-tls"
	testService   = "berth-agent-webhook"
	testInterval  = time.Minute
)

// replica is one agent replica's Rotator, with its own clock and certificate folder.
type replica struct {
	name  string
	rot   *Rotator
	clock *clocktesting.FakeClock
	dir   string
}

// TestRotator runs two replicas' Rotators, as the agent's user with the RBAC that
// deploy/rbac/role.yaml grants, against one real API server: they race to make the
// Secret from nothing, a deleted or garbled Secret is made anew and reaches the other
// replica within one Interval, the webhook configurations trust every CA a replica may
// still serve, controller-runtime's webhook server serves each new certificate without a
// restart, and both replicas renew an expiring certificate into one Secret.
func TestRotator(t *testing.T) {
	ctx := t.Context()
	admin, agent := startAPIServer(t)
	installAgentRBAC(ctx, t, admin)
	installConfigurations(ctx, t, admin)

	start := time.Now()
	a, b := newReplica(t, "a", agent, start), newReplica(t, "b", agent, start)

	// Both replicas start at once on an empty namespace: one Secret, the same files.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range []*replica{a, b} {
		wg.Go(func() { errs[i] = r.rot.Sync(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	first := getSecret(ctx, t, admin)
	if first.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret type %s, want %s", first.Type, corev1.SecretTypeTLS)
	}
	if d := Decide(a.clock.Now(), first.Data, DNSNames(testService, testNamespace), Policy{}); d.Changes() {
		t.Errorf("the Secret both made is not usable: %+v", d)
	}
	for _, r := range []*replica{a, b} {
		r.checkFiles(t, first.Data)
		if err := r.rot.Checker(nil); err != nil {
			t.Errorf("replica %s: readiness after a sync: %v", r.name, err)
		}
	}
	if got := caBundles(ctx, t, admin); !bytes.Equal(got, first.Data[KeyCABundle]) {
		t.Errorf("the configurations' caBundle is not the Secret's ca.crt:\n%s", got)
	}

	// Replica b's webhook server serves the files; an API server client that trusts the
	// configurations' caBundle accepts it under the Service's name.
	addr := serveWebhooks(t, b.dir)
	b.checkServed(t, addr, caBundles(ctx, t, admin), first.Data[KeyCert])

	// Start both loops. A deleted Secret is made anew (a new CA) by replica a; the
	// configurations trust both CAs, so b, still serving the old certificate until its
	// next sync, stays trusted; one Interval later b serves the new one.
	for _, r := range []*replica{a, b} {
		r.run(ctx, t)
	}
	if err := admin.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := a.rot.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	second := getSecret(ctx, t, admin)
	if second.UID == first.UID || bytes.Equal(second.Data[KeyCAKey], first.Data[KeyCAKey]) {
		t.Fatal("the deleted Secret was not made anew with a new CA")
	}
	a.checkFiles(t, second.Data)
	bundle := caBundles(ctx, t, admin)
	if n := len(ParseBundle(bundle)); n != 2 || !bytes.HasPrefix(bundle, second.Data[KeyCABundle]) {
		t.Errorf("after the CA changed, the caBundle has %d CAs, want the new then the old:\n%s", n, bundle)
	}
	b.checkServed(t, addr, bundle, first.Data[KeyCert])
	b.tick(t)
	poll.For(t, 30*time.Second, "replica b writes the new Secret's files", func() bool { return b.filesEqual(second.Data) })
	b.checkServed(t, addr, bundle, second.Data[KeyCert])

	// A Secret garbled by someone is repaired by whichever replica looks next, and both
	// follow.
	second.Data[KeyCert], second.Data[KeyCABundle] = []byte("garbage"), []byte("garbage")
	if err := admin.Update(ctx, second); err != nil {
		t.Fatal(err)
	}
	b.tick(t)
	var third *corev1.Secret
	poll.For(t, 30*time.Second, "replica b repairs the garbled Secret", func() bool {
		third = getSecret(ctx, t, admin)
		return !Decide(b.clock.Now(), third.Data, DNSNames(testService, testNamespace), Policy{}).Changes() && b.filesEqual(third.Data)
	})
	a.tick(t)
	poll.For(t, 30*time.Second, "replica a follows the repaired Secret", func() bool { return a.filesEqual(third.Data) })
	b.checkServed(t, addr, caBundles(ctx, t, admin), third.Data[KeyCert])

	// 250 days later the serving certificate is due: both replicas renew it at once,
	// into one Secret, from the same CA; the old CAs' overlap has ended.
	a.clock.Step(250 * 24 * time.Hour)
	b.clock.Step(250 * 24 * time.Hour)
	var fourth *corev1.Secret
	poll.For(t, 30*time.Second, "both replicas renew the serving certificate", func() bool {
		fourth = getSecret(ctx, t, admin)
		return !bytes.Equal(fourth.Data[KeyCert], third.Data[KeyCert]) && a.filesEqual(fourth.Data) && b.filesEqual(fourth.Data)
	})
	if !bytes.Equal(fourth.Data[KeyCAKey], third.Data[KeyCAKey]) {
		t.Error("renewing the serving certificate replaced the CA")
	}
	poll.For(t, 30*time.Second, "the caBundle drops the CAs whose overlap ended", func() bool {
		return bytes.Equal(caBundles(ctx, t, admin), fourth.Data[KeyCABundle])
	})
	if n := len(ParseBundle(fourth.Data[KeyCABundle])); n != 1 {
		t.Errorf("the Secret's ca.crt has %d CAs 250 days after the last CA change, want 1", n)
	}
	b.checkServed(t, addr, fourth.Data[KeyCABundle], fourth.Data[KeyCert])
}

// startAPIServer starts etcd and kube-apiserver (envtest, from bin/k8s) and returns
// an administrator's client and the agent's.
func startAPIServer(t *testing.T) (admin, agent ctrlclient.Client) {
	t.Helper()
	dir, err := kubeenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest (run `make tools` first): %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	agentCfg := rest.CopyConfig(cfg)
	agentCfg.Impersonate = rest.ImpersonationConfig{UserName: admission.DefaultOperatorUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + testNamespace, "system:authenticated"}}
	return newClient(t, cfg), newClient(t, agentCfg)
}

func newClient(t *testing.T, cfg *rest.Config) ctrlclient.Client {
	t.Helper()
	c, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installAgentRBAC grants the agent's user the roles of deploy/rbac/role.yaml, as
// generated from the markers.
func installAgentRBAC(ctx context.Context, t *testing.T, admin ctrlclient.Client) {
	t.Helper()
	create(ctx, t, admin, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}})
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: admission.DefaultOperatorUser}}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		role := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &role.Object); err != nil {
			t.Fatalf("read deploy/rbac/role.yaml: %v", err)
		}
		if len(role.Object) == 0 {
			continue
		}
		create(ctx, t, admin, role)
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: role.GetKind(), Name: role.GetName()}
		meta := metav1.ObjectMeta{Namespace: role.GetNamespace(), Name: role.GetName()}
		if role.GetKind() == "ClusterRole" {
			create(ctx, t, admin, &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects})
		} else {
			create(ctx, t, admin, &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects})
		}
	}
}

// installConfigurations registers Berth's webhooks behind the Service, without a CA.
func installConfigurations(ctx context.Context, t *testing.T, admin ctrlclient.Client) {
	t.Helper()
	objs, err := admission.Manifests(admission.ManifestOptions{Mutate: true,
		Service: &admissionregistrationv1.ServiceReference{Namespace: testNamespace, Name: testService, Port: new(int32(443))}})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		switch obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration:
			create(ctx, t, admin, obj)
		}
	}
}

func create(ctx context.Context, t *testing.T, c ctrlclient.Client, obj ctrlclient.Object) {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("create %s %s: %v", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
}

func newReplica(t *testing.T, name string, c ctrlclient.Client, now time.Time) *replica {
	t.Helper()
	clk := clocktesting.NewFakeClock(now)
	dir := filepath.Join(t.TempDir(), "certs")
	rot, err := New(Options{Client: c, Namespace: testNamespace, SecretName: testSecret, ServiceName: testService,
		CertDir: dir, Interval: testInterval, Clock: clk, Log: testr.New(t).WithValues("replica", name)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rot.Checker(nil); err == nil {
		t.Errorf("replica %s: ready before its first sync", name)
	}
	return &replica{name: name, rot: rot, clock: clk, dir: dir}
}

// run starts the replica's loop until the test ends, and waits until it sleeps.
func (r *replica) run(ctx context.Context, t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.rot.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica %s: Start: %v", r.name, err)
		}
	})
	poll.For(t, 30*time.Second, "replica "+r.name+" waits for its next sync", r.clock.HasWaiters)
}

// tick lets one Interval (and its most jitter) pass on the replica's clock, once its
// loop sleeps.
func (r *replica) tick(t *testing.T) {
	t.Helper()
	poll.For(t, 30*time.Second, "replica "+r.name+" waits for its next sync", r.clock.HasWaiters)
	r.clock.Step(testInterval + testInterval/10 + time.Second)
}

func (r *replica) filesEqual(data map[string][]byte) bool {
	for _, key := range []string{KeyCert, KeyKey, KeyCABundle} {
		got, err := os.ReadFile(filepath.Join(r.dir, key))
		if err != nil || !bytes.Equal(got, data[key]) {
			return false
		}
	}
	return true
}

func (r *replica) checkFiles(t *testing.T, data map[string][]byte) {
	t.Helper()
	if !r.filesEqual(data) {
		t.Errorf("replica %s: the files in %s are not the Secret's", r.name, r.dir)
	}
	if _, err := os.ReadFile(filepath.Join(r.dir, KeyCAKey)); err == nil {
		t.Errorf("replica %s: the CA key was written into %s", r.name, r.dir)
	}
}

// checkServed waits until the webhook server at addr serves certPEM, verified the way
// the API server verifies it: against bundle, for <svc>.<ns>.svc, at the replica's time.
func (r *replica) checkServed(t *testing.T, addr string, bundle, certPEM []byte) {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatalf("no CA in the caBundle:\n%s", bundle)
	}
	want, err := parseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: testService + "." + testNamespace + ".svc", Time: r.clock.Now, MinVersion: tls.VersionTLS12}
	var last error
	_, err = poll.Until(t.Context(), 30*time.Second, "the webhook server serves the certificate", func(ctx context.Context) (bool, error) {
		conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
		if last = err; err != nil {
			return false, nil
		}
		defer func() { _ = conn.Close() }()
		got := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
		if !got.Equal(want) {
			last = fmt.Errorf("served serial %s, want %s", got.SerialNumber, want.SerialNumber)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("replica %s: %v (last: %v)", r.name, err, last)
	}
}

// serveWebhooks starts controller-runtime's webhook server on dir's files until the test
// ends and returns its address.
func serveWebhooks(t *testing.T, dir string) string {
	t.Helper()
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	})
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func getSecret(ctx context.Context, t *testing.T, c ctrlclient.Client) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: testNamespace, Name: testSecret}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

// caBundles returns the caBundle every webhook of both configurations has, failing the
// test when they differ.
func caBundles(ctx context.Context, t *testing.T, c ctrlclient.Client) []byte {
	t.Helper()
	m, v := &admissionregistrationv1.MutatingWebhookConfiguration{}, &admissionregistrationv1.ValidatingWebhookConfiguration{}
	key := types.NamespacedName{Name: admission.WebhookConfigurationName}
	if err := errors.Join(c.Get(ctx, key, m), c.Get(ctx, key, v)); err != nil {
		t.Fatal(err)
	}
	var bundles [][]byte
	for _, w := range m.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, w := range v.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, b := range bundles[1:] {
		if !bytes.Equal(b, bundles[0]) {
			t.Fatalf("the webhooks' caBundles differ:\n%s\n%s", bundles[0], b)
		}
	}
	return bundles[0]
}
