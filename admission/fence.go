package admission

import (
	"fmt"
	"path"
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
	FenceVolume = berthv1alpha1.FenceVolume
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

// env is a wrapped container's whole environment for berth-fence: where the lease API is
// and the CA that verifies it, and leaseEnv. The CA is set even when it is empty (the
// system's roots): a variable the container names wins over envFrom in the kubelet, so
// no ConfigMap or Secret the Pod imports can supply another.
func (f fence) env() []corev1.EnvVar {
	return append([]corev1.EnvVar{
		{Name: EnvLeaseAPIURL, Value: f.cfg.LeaseAPIURL},
		{Name: EnvLeaseAPICA, Value: f.cfg.LeaseAPICA},
	}, f.leaseEnv()...)
}

// mounts are a wrapped container's mounts of the fence's volumes.
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

// onceCommand starts the command of an exec probe or lifecycle hook: berth-fence asks
// the lease API once and runs it under the Pod's term, or exits at once when the term is
// not confirmed. They run workload code beside the container's main process, where
// berth-fence's own deadline does not reach, and must answer within their own timeouts.
var onceCommand = []string{FenceBinary, "exec", "--once", "--"}

// execActions are c's exec probes and lifecycle hooks.
func execActions(c *corev1.Container) []*corev1.ExecAction {
	var out []*corev1.ExecAction
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p != nil && p.Exec != nil {
			out = append(out, p.Exec)
		}
	}
	if l := c.Lifecycle; l != nil {
		for _, h := range []*corev1.LifecycleHandler{l.PostStart, l.PreStop} {
			if h != nil && h.Exec != nil {
				out = append(out, h.Exec)
			}
		}
	}
	return out
}

// wrappedOnce reports whether an exec probe's or hook's command runs under berth-fence.
func wrappedOnce(a *corev1.ExecAction) bool {
	return len(a.Command) > len(onceCommand) && slices.Equal(a.Command[:len(onceCommand)], onceCommand)
}

// installer is the Pod's berth-fence installer: its first init container, when that has
// the installer's name; nil otherwise.
func installer(pod *corev1.Pod) *corev1.Container {
	if len(pod.Spec.InitContainers) > 0 && pod.Spec.InitContainers[0].Name == FenceInitContainer {
		return &pod.Spec.InitContainers[0]
	}
	return nil
}

// workloadContainers are the containers berth-fence wraps: every container and init
// container but its own installer. An init container named like the installer anywhere
// but first is a workload container like any other.
func workloadContainers(pod *corev1.Pod) []*corev1.Container {
	var cs []*corev1.Container
	inst := installer(pod)
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c != inst {
			cs = append(cs, c)
		}
	}
	for i := range pod.Spec.Containers {
		cs = append(cs, &pod.Spec.Containers[i])
	}
	return cs
}

// inFenceDir reports whether p is at or under FenceBinDir or FenceDir, compared as the
// kubelet mounts it: cleaned and rooted, so that a trailing slash or a "/./" changes
// nothing.
//
// A path above them counts too (/berth, /var/run, /): a volume mounted there could hold
// a symbolic link in place of a fence directory, sending the fence's own mount elsewhere
// for a later mount of the Pod to cover.
func inFenceDir(p string) bool {
	p = path.Clean("/" + p)
	for _, dir := range []string{FenceBinDir, FenceDir} {
		if p == dir || strings.HasPrefix(p, dir+"/") || p == "/" || strings.HasPrefix(dir, p+"/") {
			return true
		}
	}
	return false
}

func isFenceVolume(name string) bool { return name == FenceBinVolume || name == FenceVolume }

// inject puts the fence into pod and reports whether it changed anything. It replaces
// what it owns wherever the Pod already has it (its volumes, its installer, and the BERTH_
// environment and fence mounts of each wrapped container, even one wrapped already), so
// that no Pod template or earlier webhook can supply a look-alike; and it is idempotent,
// so that a reinvocation after another webhook added a container wraps only that one. A
// container without a command is left unwrapped: its image's entrypoint cannot be read
// here, and validation refuses the Pod, saying so.
func (f fence) inject(pod *corev1.Pod) bool {
	before := pod.DeepCopy()
	f.injectVolumes(pod)
	f.injectInstaller(pod)
	for _, c := range workloadContainers(pod) {
		f.wrap(c)
	}
	return !equality.Semantic.DeepEqual(before, pod)
}

func (f fence) injectVolumes(pod *corev1.Pod) {
	for _, v := range f.volumes() {
		if i := slices.IndexFunc(pod.Spec.Volumes, func(have corev1.Volume) bool { return have.Name == v.Name }); i >= 0 {
			pod.Spec.Volumes[i] = v
		} else {
			pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		}
	}
}

// injectInstaller puts the installer first among the init containers. An init container
// of that name the Pod already has is kept only when validation accepts it as the
// installer (another webhook may have set its resources or security context); any other
// is replaced, because an installer of another image or command installs another
// berth-fence.
func (f fence) injectInstaller(pod *corev1.Pod) {
	inst := f.initContainer()
	if i := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == FenceInitContainer }); i >= 0 {
		if len(f.installerDiffs(&pod.Spec.InitContainers[i])) == 0 {
			inst = pod.Spec.InitContainers[i]
		}
		pod.Spec.InitContainers = slices.Delete(pod.Spec.InitContainers, i, i+1)
	}
	pod.Spec.InitContainers = append([]corev1.Container{inst}, pod.Spec.InitContainers...)
}

// wrap runs c under berth-fence with exactly berth-fence's environment and mounts: every
// BERTH_ variable c had is dropped (berth-fence sets its child's own), and so is every
// mount of the fence's volumes or at its two directories.
func (f fence) wrap(c *corev1.Container) {
	if len(c.Command) == 0 {
		return
	}
	if !wrapped(c) {
		c.Command = append([]string{FenceBinary, "exec", "--"}, c.Command...)
	}
	for _, a := range execActions(c) {
		if len(a.Command) > 0 && !wrappedOnce(a) {
			a.Command = append(slices.Clone(onceCommand), a.Command...)
		}
	}
	c.Env = append(slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return strings.HasPrefix(e.Name, "BERTH_") }), f.env()...)
	c.VolumeMounts = append(slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		p := path.Clean("/" + m.MountPath)
		return isFenceVolume(m.Name) || p == FenceBinDir || p == FenceDir
	}), f.mounts()...)
}

// problems lists how pod falls short of the injection: each a sentence for a denial.
// Everything that decides which berth-fence runs, which lease API it asks and how it
// trusts it, which lease it confirms and with what credential and term, and whether it
// can stop all of its workload, is checked against what inject puts in with this agent's
// FenceConfig: a Pod template, or a webhook before or after Berth's, cannot supply any
// of it. Validate-only installations need the same FenceConfig.
func (f fence) problems(pod *corev1.Pod) []string {
	out := processProblems(pod)
	out = append(out, f.volumeProblems(pod)...)
	out = append(out, f.installerProblems(pod)...)
	for _, c := range workloadContainers(pod) {
		out = append(out, f.wrapProblems(c)...)
		out = append(out, mountProblems(c, f.mounts())...)
	}
	if inst := installer(pod); inst != nil {
		out = append(out, mountProblems(inst, f.initContainer().VolumeMounts)...)
	}
	return out
}

// processProblems: berth-fence stops its workload by signalling the processes of its own
// PID namespace, as its container's PID 1. In a PID namespace shared with the Pod's other
// containers, or the node's, it is not PID 1, and a process the workload leaves behind
// (a daemon, an orphan reparented to the pause container) outlives the fence.
func processProblems(pod *corev1.Pod) []string {
	var out []string
	if ptr.Deref(pod.Spec.ShareProcessNamespace, false) {
		out = append(out, "spec.shareProcessNamespace is true: berth-fence must be its container's PID 1, so that no process of the workload outlives it")
	}
	if pod.Spec.HostPID {
		out = append(out, "spec.hostPID is true: berth-fence must be its container's PID 1, so that no process of the workload outlives it")
	}
	return out
}

func (f fence) volumeProblems(pod *corev1.Pod) []string {
	var out []string
	for _, want := range f.volumes() {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == want.Name })
		if i < 0 || !equality.Semantic.DeepEqual(pod.Spec.Volumes[i].VolumeSource, want.VolumeSource) {
			out = append(out, fmt.Sprintf("volume %s is not the one admission injects", want.Name))
		}
	}
	return out
}

func (f fence) installerProblems(pod *corev1.Pod) []string {
	inst := installer(pod)
	if inst == nil {
		return []string{fmt.Sprintf("init container %s must come first, to install berth-fence", FenceInitContainer)}
	}
	if diffs := f.installerDiffs(inst); len(diffs) > 0 {
		return []string{fmt.Sprintf(
			"init container %s differs from the one admission injects in its %s: only the agent's image %s installs berth-fence, by its own command, into volume %s",
			FenceInitContainer, strings.Join(diffs, ", "), f.cfg.Image, FenceBinVolume)}
	}
	return nil
}

// installerDiffs names what in c differs from the installer inject makes, but for what
// other webhooks may well set and what does not change the binary it installs: resources,
// security context, image pull policy, termination message. Its mounts must be exactly
// its one: a ConfigMap's key mounted at /usr/local/bin/berth-fence would install that.
// (The API server's ServiceAccount admission adds its token's mount to the installer on
// reinvocation; the reinvoked webhook replaces the installer again, without it.)
func (f fence) installerDiffs(c *corev1.Container) []string {
	want := f.initContainer()
	var diffs []string
	for _, field := range []struct {
		name string
		same bool
	}{
		{"image", c.Image == want.Image},
		{"command", slices.Equal(c.Command, want.Command)},
		{"args", len(c.Args) == 0},
		{"workingDir", c.WorkingDir == ""},
		{"env", len(c.Env) == 0 && len(c.EnvFrom) == 0},
		{"volumeMounts", equality.Semantic.DeepEqual(c.VolumeMounts, want.VolumeMounts)},
		{"volumeDevices", len(c.VolumeDevices) == 0},
		{"restartPolicy", c.RestartPolicy == nil},
	} {
		if !field.same {
			diffs = append(diffs, field.name)
		}
	}
	// Anything else (probes, lifecycle hooks, ports) the installer has no use for.
	rest := c.DeepCopy()
	rest.Name, rest.Image, rest.Command, rest.Args, rest.WorkingDir = want.Name, want.Image, want.Command, want.Args, want.WorkingDir
	rest.Env, rest.EnvFrom, rest.VolumeMounts, rest.VolumeDevices, rest.RestartPolicy = want.Env, want.EnvFrom, want.VolumeMounts, want.VolumeDevices, want.RestartPolicy
	rest.Resources, rest.ResizePolicy, rest.SecurityContext, rest.ImagePullPolicy = want.Resources, want.ResizePolicy, want.SecurityContext, want.ImagePullPolicy
	rest.TerminationMessagePath, rest.TerminationMessagePolicy = want.TerminationMessagePath, want.TerminationMessagePolicy
	if !equality.Semantic.DeepEqual(*rest, want) {
		diffs = append(diffs, "other fields")
	}
	return diffs
}

// wrapProblems says how a workload container falls short of running under berth-fence
// with exactly the environment and mounts inject gives it.
func (f fence) wrapProblems(c *corev1.Container) []string {
	switch {
	case len(c.Command) == 0:
		return []string{fmt.Sprintf(
			"container %s sets no command: spec.podFencing Exec wraps each container's command in berth-fence, and the image's entrypoint cannot be read at admission; name it in the Pod template (command: [...], args unchanged)", c.Name)}
	case !wrapped(c):
		return []string{fmt.Sprintf("container %s does not run under berth-fence (command %s exec -- ...)", c.Name, FenceBinary)}
	}
	var out []string
	for _, a := range execActions(c) {
		if !wrappedOnce(a) {
			out = append(out, fmt.Sprintf("container %s: an exec probe or lifecycle hook (command %q) does not run under berth-fence (command %s)",
				c.Name, a.Command, strings.Join(onceCommand, " ")))
		}
	}
	want := f.env()
	for _, e := range want {
		// The kubelet takes the last of several entries of one name; the only safe
		// number is one.
		switch n := countEnv(c.Env, e.Name); {
		case n > 1:
			out = append(out, fmt.Sprintf("container %s: environment variable %s is set %d times, want once, as admission injects it", c.Name, e.Name, n))
		case n == 0 || c.Env[slices.IndexFunc(c.Env, func(have corev1.EnvVar) bool { return have.Name == e.Name })] != e:
			out = append(out, fmt.Sprintf("container %s: environment variable %s is not the one admission injects", c.Name, e.Name))
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, fenceEnvPrefix) && !slices.ContainsFunc(want, func(w corev1.EnvVar) bool { return w.Name == e.Name }) {
			out = append(out, fmt.Sprintf("container %s: environment variable %s configures berth-fence, and admission does not set it", c.Name, e.Name))
		}
	}
	for _, m := range f.mounts() {
		if !slices.Contains(c.VolumeMounts, m) {
			out = append(out, fmt.Sprintf("container %s does not mount volume %s read-only at %s", c.Name, m.Name, m.MountPath))
		}
	}
	return out
}

// fenceEnvPrefix starts the variables that configure berth-fence alone (fence.EnvFencePrefix).
const fenceEnvPrefix = "BERTH_FENCE_"

func countEnv(env []corev1.EnvVar, name string) int {
	n := 0
	for _, e := range env {
		if e.Name == name {
			n++
		}
	}
	return n
}

// mountProblems refuses every mount or device of c that reaches berth-fence's files but
// those in allowed: a volume mounted at or under FenceBinDir or FenceDir (a ConfigMap's
// key at /berth/bin/berth-fence would replace the binary, one at
// /var/run/berth/fence/holder the term), or a fence volume mounted anywhere else (a
// writable mount of berth-fence-bin would let a container rewrite the binary that a
// container restarted later runs).
func mountProblems(c *corev1.Container, allowed []corev1.VolumeMount) []string {
	var out []string
	for _, m := range c.VolumeMounts {
		if (isFenceVolume(m.Name) || inFenceDir(m.MountPath)) && !slices.Contains(allowed, m) {
			out = append(out, fmt.Sprintf(
				"container %s mounts volume %s at %s: only admission mounts berth-fence's volumes, and nothing else may be mounted at, above or under %s or %s",
				c.Name, m.Name, m.MountPath, FenceBinDir, FenceDir))
		}
	}
	for _, d := range c.VolumeDevices {
		if inFenceDir(d.DevicePath) {
			out = append(out, fmt.Sprintf("container %s puts device %s at %s, under berth-fence's directories", c.Name, d.Name, d.DevicePath))
		}
	}
	return out
}

// fencedPod reports whether pod was made with berth-fence in it: it has the fence's
// projected volume or its installer. Only such a Pod of a fenced BerthLease is admitted,
// so the Pod itself says so, without a lookup of its BerthLease.
func fencedPod(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == FenceVolume }) ||
		slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == FenceInitContainer })
}

// fenceChanges are the changes from old, a fenced Pod, to pod that would let code run
// outside berth-fence, which nobody may make, the Berth agent included:
//   - ephemeral containers added (kubectl debug, through pods/ephemeralcontainers): they
//     come after admission wrapped the Pod and are never wrapped;
//   - another installer image: the API server lets a container's image change, and the
//     installer of a restarted Pod would install what that image holds;
//   - a container's command or args, or the fence's volumes, changed: immutable in the
//     API today, and refused here so that a relaxation there does not open a hole.
//
// A wrapped container's image may change: it still runs under /berth/bin/berth-fence.
func fenceChanges(old, pod *corev1.Pod) []violation {
	if !fencedPod(old) {
		return nil
	}
	var what []string
	if !equality.Semantic.DeepEqual(old.Spec.EphemeralContainers, pod.Spec.EphemeralContainers) {
		what = append(what, "adding ephemeral containers is refused: they would run outside berth-fence")
	}
	olds, news := namedContainers(old), namedContainers(pod)
	if o, n := olds[FenceInitContainer], news[FenceInitContainer]; o != nil && (n == nil || n.Image != o.Image) {
		what = append(what, fmt.Sprintf("the image of init container %s may not change: it installs berth-fence", FenceInitContainer))
	}
	for name, o := range olds {
		if n := news[name]; n == nil || !slices.Equal(n.Command, o.Command) || !slices.Equal(n.Args, o.Args) {
			what = append(what, fmt.Sprintf("the command and args of container %s may not change: they run under berth-fence", name))
		}
	}
	for _, name := range []string{FenceBinVolume, FenceVolume} {
		o, n := namedVolume(old, name), namedVolume(pod, name)
		if o != nil && (n == nil || !equality.Semantic.DeepEqual(o, n)) {
			what = append(what, fmt.Sprintf("volume %s may not change or go", name))
		}
	}
	slices.Sort(what)
	vs := make([]violation, len(what))
	for i, w := range what {
		vs[i] = violation{ReasonNotFenced, "berth-fence guards this Pod (its BerthLease asks spec.podFencing Exec), for everyone, the Berth agent too: " + w}
	}
	return vs
}

// namedContainers are pod's containers and init containers by name.
func namedContainers(pod *corev1.Pod) map[string]*corev1.Container {
	cs := map[string]*corev1.Container{}
	for i := range pod.Spec.InitContainers {
		cs[pod.Spec.InitContainers[i].Name] = &pod.Spec.InitContainers[i]
	}
	for i := range pod.Spec.Containers {
		cs[pod.Spec.Containers[i].Name] = &pod.Spec.Containers[i]
	}
	return cs
}

func namedVolume(pod *corev1.Pod, name string) *corev1.Volume {
	if i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name }); i >= 0 {
		return &pod.Spec.Volumes[i]
	}
	return nil
}
