package kubeenv

import (
	"fmt"
	"path/filepath"
	"strings"
)

// The address ranges inside every cluster, shared by all clusters. Pod addresses are
// virtual (nothing routes them). Service addresses are loopback ones: the API server calls
// a webhook Service at its ClusterIP and Service port, which on this machine reaches a
// process listening on that port on every address, as the agent's webhook server does.
// So a test gives a chart's webhook Service the port of the agent it runs, and the API
// server reaches that agent through the chart's own Service (test/podrun).
const (
	serviceCIDR = "127.96.0.0/16"
	serviceIP   = "127.96.0.1" // the kubernetes Service; must be in the API server's certificate
	podCIDR     = "10.244.0.0/16"
)

// controllers are the kube-controller-manager controllers a cluster runs: those Berth's
// workloads and tests touch, and the housekeeping that keeps a cluster usable (namespaces,
// service accounts, node lifecycle, garbage collection). Cloud, storage, networking and
// certificate controllers are left out to save CPU.
var controllers = []string{
	"clusterrole-aggregation-controller",
	"cronjob-controller",
	"daemonset-controller",
	"deployment-controller",
	"disruption-controller",
	"garbage-collector-controller",
	"job-controller",
	"namespace-controller",
	"node-lifecycle-controller",
	"pod-garbage-collector-controller",
	"replicaset-controller",
	"root-ca-certificate-publisher-controller",
	"serviceaccount-controller",
	"statefulset-controller",
	"taint-eviction-controller",
	"ttl-after-finished-controller",
	"validatingadmissionpolicy-status-controller",
}

// ports are the TCP ports a cluster listens on, all on 127.0.0.1. They are chosen once so
// that a restarted cluster is where its kubeconfig says.
type ports struct {
	etcdClient, etcdPeer, apiserver int
}

// layout names the files in a cluster's directory.
type layout struct {
	dir string
}

func (l layout) pki(name string) string        { return filepath.Join(l.dir, "pki", name) }
func (l layout) kubeconfig(id identity) string { return filepath.Join(l.dir, id.file+".kubeconfig") }
func (l layout) log(component string) string   { return filepath.Join(l.dir, "logs", component+".log") }
func (l layout) etcdData() string              { return filepath.Join(l.dir, "etcd") }

// identity is who a component (or the cluster's administrator) is to the API server: the
// subject of its client certificate.
type identity struct {
	file   string // the kubeconfig file's name in the cluster's directory
	user   string
	groups []string
}

var (
	// adminIdentity is the user of the cluster's kubeconfig, a cluster administrator.
	adminIdentity             = identity{file: "admin", user: "kubernetes-admin", groups: []string{"system:masters"}}
	controllerManagerIdentity = identity{file: "kube-controller-manager", user: "system:kube-controller-manager"}
	schedulerIdentity         = identity{file: "kube-scheduler", user: "system:kube-scheduler"}
	// kwokIdentity plays every kubelet, so it may do what all of them together may.
	kwokIdentity = identity{file: "kwok", user: "kwok", groups: []string{"system:masters"}}
	identities   = []identity{adminIdentity, controllerManagerIdentity, schedulerIdentity, kwokIdentity}
)

// component is one process of a cluster: the binary and its arguments.
type component struct {
	name string
	args []string
}

// etcd is a single-member etcd that skips fsync: test data need not survive a power cut,
// and fsync is what makes etcd slow on shared disks. Killed processes lose nothing.
func etcd(name string, l layout, p ports) component {
	client := fmt.Sprintf("http://127.0.0.1:%d", p.etcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", p.etcdPeer)
	return component{name: "etcd", args: []string{
		"--name=" + name,
		"--data-dir=" + l.etcdData(),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=" + name + "=" + peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
	}}
}

// kubeAPIServer serves TLS with client certificates and RBAC, as a real cluster does; it
// keeps the default admission plugins, which Berth's admission tests rely on.
func kubeAPIServer(l layout, p ports) component {
	return component{name: "kube-apiserver", args: []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", p.etcdClient),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", p.apiserver),
		"--tls-cert-file=" + l.pki("apiserver.crt"),
		"--tls-private-key-file=" + l.pki("apiserver.key"),
		"--client-ca-file=" + l.pki("ca.crt"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + l.pki("sa.pub"),
		"--service-account-signing-key-file=" + l.pki("sa.key"),
		"--service-cluster-ip-range=" + serviceCIDR,
		// The kubernetes Service cannot point at a loopback address; nothing here needs it.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}}
}

// kubeControllerManager runs each controller under its own service account, as kubeadm
// clusters do, so that admission sees the same users as in production.
func kubeControllerManager(l layout) component {
	return component{name: "kube-controller-manager", args: []string{
		"--kubeconfig=" + l.kubeconfig(controllerManagerIdentity),
		"--controllers=" + strings.Join(controllers, ","),
		"--use-service-account-credentials=true",
		"--root-ca-file=" + l.pki("ca.crt"),
		"--leader-elect=false",
		"--secure-port=0",
		"--kube-api-qps=100",
		"--kube-api-burst=200",
		"--profiling=false",
	}}
}

func kubeScheduler(l layout) component {
	return component{name: "kube-scheduler", args: []string{
		"--kubeconfig=" + l.kubeconfig(schedulerIdentity),
		"--leader-elect=false",
		"--secure-port=0",
	}}
}

// kwok plays the kubelet of every node: it keeps nodes Ready and moves bound Pods to
// Running, finished Jobs to Succeeded and deleted Pods out of the API.
func kwok(l layout, binDir string) component {
	return component{name: "kwok", args: []string{
		"--kubeconfig=" + l.kubeconfig(kwokIdentity),
		"--config=" + filepath.Join(binDir, kwokStagesFile),
		"--manage-all-nodes=true",
		"--cidr=" + podCIDR,
		"--node-ip=127.0.0.1",
	}}
}
