package admission

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
)

// What admission puts into the Pods of a BerthLease with spec.podFencing Exec: an init
// container that copies berth-fence from Berth's image into a shared emptyDir, and every
// other container's command wrapped in it (berth-fence exec -- <command>), with the
// projected service account token and the Pod's term annotations it confirms the lease
// with (docs/fencing.md).
const (
	// FenceInitContainer installs berth-fence into the FenceBinVolume.
	FenceInitContainer = "berth-fence-install"
	// FenceBinVolume is the emptyDir berth-fence is copied into, mounted read-only at
	// FenceBinDir in every wrapped container.
	FenceBinVolume = "berth-fence-bin"
	FenceBinDir    = "/berth/bin"
	// FenceBinary is the wrapper every wrapped container's command starts with.
	FenceBinary = FenceBinDir + "/berth-fence"
	// FenceImageBinary is where berth-fence lives in Berth's agent image.
	FenceImageBinary = "/usr/local/bin/berth-fence"
	// FenceVolume is the projected volume of the token and the term, at FenceDir.
	FenceVolume = "berth-fence"
	FenceDir    = "/var/run/berth/fence"
	// FenceTokenExpirationSeconds is the projected token's life; the kubelet renews it
	// at 80% of it.
	FenceTokenExpirationSeconds = 600
)

// The environment of a wrapped container that berth-fence reads (and removes from its
// child's). The end-to-end suites rewrite the file paths, as podrun rewrites mounts.
const (
	EnvLeaseAPIURL      = "BERTH_LEASE_API_URL"
	EnvLeaseAPICA       = "BERTH_LEASE_API_CA"
	EnvLeaseNamespace   = "BERTH_LEASE_NAMESPACE"
	EnvLeaseName        = "BERTH_LEASE_NAME"
	EnvFenceTokenFile   = "BERTH_FENCE_TOKEN_FILE"
	EnvFenceHolderFile  = "BERTH_FENCE_HOLDER_FILE"
	EnvFenceFencingFile = "BERTH_FENCE_FENCING_TOKEN_FILE"
)

// FenceConfig is what the agent tells admission for fenced Pods.
type FenceConfig struct {
	// Image holds berth-fence at FenceImageBinary: the agent's own image. Empty: this
	// agent cannot fence Pods, and refuses those of BerthLeases that ask it to.
	Image string
	// LeaseAPIURL is the lease API as the Pods reach it.
	LeaseAPIURL string
	// LeaseAPICA is the PEM bundle that verifies the lease API's certificate (empty: the
	// system's roots where the workload's image has them).
	LeaseAPICA string
}

// fence is the injection for the Pods of one fenced lease.
type fence struct {
	cfg FenceConfig
	key leaseapi.Key
}

func (f fence) volumes() []corev1.Volume {
	annotation := func(path, key string) corev1.DownwardAPIVolumeFile {
		return corev1.DownwardAPIVolumeFile{Path: path, FieldRef: &corev1.ObjectFieldSelector{
			APIVersion: "v1", FieldPath: fmt.Sprintf("metadata.annotations['%s']", key)}}
	}
	return []corev1.Volume{
		{Name: FenceBinVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: FenceVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
					Audience: leaseapi.ConfirmAudience(f.key), ExpirationSeconds: ptr.To[int64](FenceTokenExpirationSeconds), Path: "token"}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
					annotation("holder", berthv1alpha1.HolderAnnotation),
					annotation("fencing-token", berthv1alpha1.FencingTokenAnnotation),
				}}},
			},
			DefaultMode: ptr.To[int32](0o444),
		}}},
	}
}

func (f fence) initContainer() corev1.Container {
	return corev1.Container{
		Name:         FenceInitContainer,
		Image:        f.cfg.Image,
		Command:      []string{FenceImageBinary, "install", FenceBinDir},
		VolumeMounts: []corev1.VolumeMount{{Name: FenceBinVolume, MountPath: FenceBinDir}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		// What Pod Security's restricted profile asks of a container; the user it runs as
		// is the Pod's (or the image's, 65532), so that it fits the Pod's own settings.
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			ReadOnlyRootFilesystem:   ptr.To(true),
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// leaseEnv is the environment that decides which lease berth-fence confirms, and with
// which credential and term.
func (f fence) leaseEnv() []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: EnvLeaseNamespace, Value: f.key.Namespace},
		{Name: EnvLeaseName, Value: f.key.Name},
		{Name: EnvFenceTokenFile, Value: FenceDir + "/token"},
		{Name: EnvFenceHolderFile, Value: FenceDir + "/holder"},
		{Name: EnvFenceFencingFile, Value: FenceDir + "/fencing-token"},
	}
}

// env is a wrapped container's whole environment for berth-fence: where the lease API is,
// and leaseEnv.
func (f fence) env() []corev1.EnvVar {
	env := []corev1.EnvVar{{Name: EnvLeaseAPIURL, Value: f.cfg.LeaseAPIURL}}
	if f.cfg.LeaseAPICA != "" {
		env = append(env, corev1.EnvVar{Name: EnvLeaseAPICA, Value: f.cfg.LeaseAPICA})
	}
	return append(env, f.leaseEnv()...)
}

func (f fence) mounts() []corev1.VolumeMount {
	return []corev1.VolumeMount{
		{Name: FenceBinVolume, MountPath: FenceBinDir, ReadOnly: true},
		{Name: FenceVolume, MountPath: FenceDir, ReadOnly: true},
	}
}

// wrapped reports whether c's command is berth-fence's.
func wrapped(c *corev1.Container) bool {
	return len(c.Command) > 3 && c.Command[0] == FenceBinary && c.Command[1] == "exec" && c.Command[2] == "--"
}

// workloadContainers are the containers berth-fence wraps: every container and init
// container but its own installer.
func workloadContainers(pod *corev1.Pod) []*corev1.Container {
	var cs []*corev1.Container
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name != FenceInitContainer {
			cs = append(cs, &pod.Spec.InitContainers[i])
		}
	}
	for i := range pod.Spec.Containers {
		cs = append(cs, &pod.Spec.Containers[i])
	}
	return cs
}

// inject wraps pod's containers in berth-fence and reports whether it changed anything.
// A container already wrapped is left as it is, so that a reinvocation after another
// webhook added a container wraps only that one. A container without a command is left
// unwrapped: its image's entrypoint cannot be read here, and validation refuses the Pod,
// saying so.
func (f fence) inject(pod *corev1.Pod) bool {
	changed := false
	for _, v := range f.volumes() {
		if !slices.ContainsFunc(pod.Spec.Volumes, func(have corev1.Volume) bool { return have.Name == v.Name }) {
			pod.Spec.Volumes = append(pod.Spec.Volumes, v)
			changed = true
		}
	}
	if !slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == FenceInitContainer }) {
		pod.Spec.InitContainers = append([]corev1.Container{f.initContainer()}, pod.Spec.InitContainers...)
		changed = true
	}
	for _, c := range workloadContainers(pod) {
		if wrapped(c) || len(c.Command) == 0 {
			continue
		}
		c.Command = append([]string{FenceBinary, "exec", "--"}, c.Command...)
		c.Env = append(slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return strings.HasPrefix(e.Name, "BERTH_") }), f.env()...)
		c.VolumeMounts = append(slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == FenceBinDir || m.MountPath == FenceDir
		}), f.mounts()...)
		changed = true
	}
	return changed
}

// problems lists how pod falls short of the injection: each a sentence for a denial.
// It checks what decides which lease berth-fence confirms and with what credential, so a
// Pod cannot run unfenced, or fenced by another lease, because a later webhook or a
// template changed it. Where the lease API is, and the image berth-fence came from, are
// left to the Pod: a wrong one only keeps its workload from starting. So f needs only
// its key, and validate-only installations (Pod templates that carry the injection
// themselves) are judged the same.
func (f fence) problems(pod *corev1.Pod) []string {
	var out []string
	for _, want := range f.volumes() {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == want.Name })
		if i < 0 || !equality.Semantic.DeepEqual(pod.Spec.Volumes[i].VolumeSource, want.VolumeSource) {
			out = append(out, fmt.Sprintf("volume %s is not the one admission injects", want.Name))
		}
	}
	if i := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == FenceInitContainer }); i != 0 {
		out = append(out, fmt.Sprintf("init container %s must come first, to install berth-fence", FenceInitContainer))
	}
	wantEnv := f.leaseEnv()
	for _, c := range workloadContainers(pod) {
		switch {
		case len(c.Command) == 0:
			out = append(out, fmt.Sprintf(
				"container %s sets no command: spec.podFencing Exec wraps each container's command in berth-fence, and the image's entrypoint cannot be read at admission; name it in the Pod template (command: [...], args unchanged)", c.Name))
			continue
		case !wrapped(c):
			out = append(out, fmt.Sprintf("container %s does not run under berth-fence (command %s exec -- ...)", c.Name, FenceBinary))
			continue
		}
		for _, e := range wantEnv {
			if i := slices.IndexFunc(c.Env, func(have corev1.EnvVar) bool { return have.Name == e.Name }); i < 0 || c.Env[i] != e {
				out = append(out, fmt.Sprintf("container %s: environment variable %s is not the one admission injects", c.Name, e.Name))
			}
		}
		for _, m := range f.mounts() {
			if !slices.Contains(c.VolumeMounts, m) {
				out = append(out, fmt.Sprintf("container %s does not mount volume %s read-only at %s", c.Name, m.Name, m.MountPath))
			}
		}
	}
	return out
}
