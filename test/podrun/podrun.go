// Package podrun runs the container of a Pod template that a chart installed as a local
// process, the way a kubelet would run it, so that tests prove what a chart gives its
// workload without a container runtime:
//
//   - the process acts as the Pod's ServiceAccount, with a real token from the
//     TokenRequest API (so RBAC, admission and policies judge exactly the chart's account);
//   - Secret and ConfigMap volumes are written to local folders from the objects in the
//     cluster, emptyDirs are empty local folders;
//   - the container's arguments are kept, with each mount path rewritten to its folder,
//     and --kubeconfig appended (there is no in-cluster configuration here);
//   - the binary is the image's: <bin>/<last element of the image repository>.
//
// It does not run init containers, probes or environment variables from references; the
// charts it serves use none. kwok meanwhile "runs" the same Pods on its fake nodes; they
// do nothing, and the API server reaches this process through the chart's Services
// (test/kubeenv's loopback Service range).
package podrun

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/berthfleet/berth/test/process"
)

// Pod is what to run: a Pod template of a workload in Namespace.
type Pod struct {
	Namespace string
	Template  corev1.PodTemplateSpec
	// Container names the container to run; empty: the first.
	Container string
	// Claims name the volumes of a StatefulSet's volumeClaimTemplates: each is an empty
	// local folder, kept across runs in the same Options.Dir.
	Claims []string
}

// Options says where the run's files and binaries are.
type Options struct {
	// BinDir holds the binaries, named as their images.
	BinDir string
	// Dir receives the volumes, the kubeconfig and the log.
	Dir string
	// ExtraArgs are appended after the container's own arguments.
	ExtraArgs []string
}

// Start runs the Pod's container as a local process.
func Start(ctx context.Context, cfg *rest.Config, pod Pod, opts Options) (*process.Process, error) {
	c, err := container(pod)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(opts.Dir, "kubeconfig")
	if err := writeServiceAccountKubeconfig(ctx, cs, cfg, pod, kubeconfig); err != nil {
		return nil, err
	}
	mounts, err := mountVolumes(ctx, cs, pod, c, filepath.Join(opts.Dir, "volumes"))
	if err != nil {
		return nil, err
	}
	args := append(RewriteArgs(append(slices.Clone(c.Command[min(1, len(c.Command)):]), c.Args...), mounts), "--kubeconfig="+kubeconfig)
	args = append(args, opts.ExtraArgs...)
	name := Binary(c.Image)
	return process.Start(name, filepath.Join(opts.BinDir, name), filepath.Join(opts.Dir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano())), args...)
}

func container(pod Pod) (corev1.Container, error) {
	cs := pod.Template.Spec.Containers
	if len(cs) == 0 {
		return corev1.Container{}, fmt.Errorf("the Pod template has no container")
	}
	if pod.Container == "" {
		return cs[0], nil
	}
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == pod.Container })
	if i < 0 {
		return corev1.Container{}, fmt.Errorf("the Pod template has no container %q", pod.Container)
	}
	return cs[i], nil
}

// Binary is the binary an image runs: the last element of its repository, without tag
// or digest.
func Binary(image string) string {
	image, _, _ = strings.Cut(image, "@")
	name := image[strings.LastIndex(image, "/")+1:]
	name, _, _ = strings.Cut(name, ":")
	return name
}

// RewriteArgs replaces, in every argument, a mount path (and what follows it) by its local
// folder; longer mount paths first, so that nested mounts win.
func RewriteArgs(args []string, mounts map[string]string) []string {
	paths := make([]string, 0, len(mounts))
	for p := range mounts {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	out := make([]string, len(args))
	for i, a := range args {
		for _, p := range paths {
			if j := strings.Index(a, p); j >= 0 && (len(a) == j+len(p) || a[j+len(p)] == '/') {
				a = a[:j] + mounts[p] + a[j+len(p):]
				break
			}
		}
		out[i] = a
	}
	return out
}

// writeServiceAccountKubeconfig asks the TokenRequest API for a token of the Pod's
// ServiceAccount and writes a kubeconfig that uses it.
func writeServiceAccountKubeconfig(ctx context.Context, cs kubernetes.Interface, cfg *rest.Config, pod Pod, path string) error {
	sa := cmp.Or(pod.Template.Spec.ServiceAccountName, "default")
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](6 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of service account %s/%s: %w", pod.Namespace, sa, err)
	}
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			return err
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["pod"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: sa, Namespace: pod.Namespace}
	kc.CurrentContext = "pod"
	return clientcmd.WriteToFile(*kc, path)
}

// mountVolumes writes each volume the container mounts to a folder under dir and returns
// the folders by mount path.
func mountVolumes(ctx context.Context, cs kubernetes.Interface, pod Pod, c corev1.Container, dir string) (map[string]string, error) {
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if slices.Contains(pod.Claims, m.Name) {
			v, ok = corev1.Volume{Name: m.Name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}, true
		}
		if !ok {
			return nil, fmt.Errorf("mount %s: no volume %q", m.MountPath, m.Name)
		}
		local := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(local, 0o700); err != nil {
			return nil, err
		}
		files, err := volumeFiles(ctx, cs, pod.Namespace, v)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(local, name), data, 0o600); err != nil {
				return nil, err
			}
		}
		mounts[m.MountPath] = local
	}
	return mounts, nil
}

func volumeFiles(ctx context.Context, cs kubernetes.Interface, namespace string, v corev1.Volume) (map[string][]byte, error) {
	switch {
	case v.Secret != nil:
		s, err := cs.CoreV1().Secrets(namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return s.Data, nil
	case v.ConfigMap != nil:
		cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		files := map[string][]byte{}
		for k, s := range cm.Data {
			files[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			files[k] = b
		}
		return files, nil
	case v.EmptyDir != nil:
		return nil, nil
	default:
		return nil, fmt.Errorf("only Secret, ConfigMap and emptyDir volumes are run here")
	}
}
