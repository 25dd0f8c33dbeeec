package admission

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
)

var (
	fencedLease = BerthLeaseRef{Found: true, UID: testUID, LeaseName: "exporter-lease", PodFencing: true}
	testFence   = FenceConfig{Image: "ghcr.io/berthfleet/berth-agent:v0.1.0", LeaseAPIURL: "https://leases.example:8443", LeaseAPICA: "-----BEGIN CERTIFICATE-----\n"}
)

// workloadPod is a managed Pod as a Deployment makes it: two containers and an init
// container, each naming its command.
func workloadPod(opts ...podOpt) *corev1.Pod {
	return managedPod(append([]podOpt{func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "exporter", Command: []string{"/migrate"}}}
		p.Spec.Containers = []corev1.Container{
			{Name: "main", Image: "exporter", Command: []string{"/exporter"}, Args: []string{"--once=false"},
				Env: []corev1.EnvVar{{Name: "LOG", Value: "debug"}, {Name: EnvLeaseName, Value: "forged"}}},
			{Name: "sidecar", Image: "proxy", Command: []string{"/proxy", "-v"},
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/health"}}}},
				Lifecycle: &corev1.Lifecycle{
					PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/warm-up"}}},
					PreStop:   &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain"}},
				}},
		}
	}}, opts...)...)
}

// fenced is pod as the mutating webhook leaves it.
func fenced(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := Fence("payments", pod, fencedLease, testFence); err != nil {
		t.Fatal(err)
	}
	return pod
}

func TestFenceInjects(t *testing.T) {
	pod := fenced(t, workloadPod())

	if got := pod.Spec.InitContainers[0]; got.Name != FenceInitContainer || got.Image != testFence.Image ||
		!slices.Equal(got.Command, []string{FenceImageBinary, "install", FenceBinDir}) {
		t.Errorf("first init container = %s %s %v, want the installer from the agent's image", got.Name, got.Image, got.Command)
	}
	wantCommands := map[string][]string{
		"migrate": {FenceBinary, "exec", "--", "/migrate"},
		"main":    {FenceBinary, "exec", "--", "/exporter"},
		"sidecar": {FenceBinary, "exec", "--", "/proxy", "-v"},
	}
	for _, c := range workloadContainers(pod) {
		if diff := cmp.Diff(wantCommands[c.Name], c.Command); diff != "" {
			t.Errorf("container %s command (-want +got):\n%s", c.Name, diff)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			if _, twice := env[e.Name]; twice {
				t.Errorf("container %s: %s set twice", c.Name, e.Name)
			}
			env[e.Name] = e.Value
		}
		if env[EnvLeaseName] != "exporter-lease" || env[EnvLeaseNamespace] != "payments" || env[EnvLeaseAPIURL] != testFence.LeaseAPIURL || env[EnvLeaseAPICA] != testFence.LeaseAPICA {
			t.Errorf("container %s: environment %v does not name lease payments/exporter-lease at %s", c.Name, env, testFence.LeaseAPIURL)
		}
	}
	// Exec probes and hooks run workload code beside the main process: each asks once.
	sidecar := pod.Spec.Containers[1]
	for what, got := range map[string][]string{
		"liveness probe": sidecar.LivenessProbe.Exec.Command, "postStart hook": sidecar.Lifecycle.PostStart.Exec.Command,
	} {
		if want := []string{FenceBinary, "exec", "--once", "--", got[len(got)-1]}; !slices.Equal(got, want) {
			t.Errorf("sidecar's %s command %q, want %q", what, got, want)
		}
	}
	if sidecar.Lifecycle.PreStop.HTTPGet == nil {
		t.Errorf("sidecar's HTTP preStop hook changed: %+v", sidecar.Lifecycle.PreStop)
	}
	if main := pod.Spec.Containers[0]; !slices.Equal(main.Args, []string{"--once=false"}) || main.Env[0].Value != "debug" {
		t.Errorf("main container's own args and environment changed: %v %v", main.Args, main.Env)
	}
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == FenceVolume })
	if i < 0 || pod.Spec.Volumes[i].Projected.Sources[0].ServiceAccountToken.Audience != leaseapi.ConfirmAudience(leaseapi.Key{Namespace: "payments", Name: "exporter-lease"}) {
		t.Errorf("no projected token for this lease's audience in %v", pod.Spec.Volumes)
	}

	// The API server calls the webhook again after another webhook changed the Pod: what
	// is wrapped stays as it is, and only the new container is wrapped.
	again := pod.DeepCopy()
	if changed, _ := Fence("payments", again, fencedLease, testFence); changed {
		t.Errorf("a second call changed the Pod:\n%s", cmp.Diff(pod, again))
	}
	again.Spec.Containers = append(again.Spec.Containers, corev1.Container{Name: "mesh", Image: "mesh", Command: []string{"/mesh"}})
	if changed, _ := Fence("payments", again, fencedLease, testFence); !changed || !wrapped(&again.Spec.Containers[2]) {
		t.Errorf("a container added by another webhook was not wrapped: %v", again.Spec.Containers[2].Command)
	}
	if d := DecideCreate("payments", again, fencedLease, testFence); !d.Allowed {
		t.Errorf("the wrapped Pod was denied: %s", d.Message)
	}
}

func TestFenceLeavesOthers(t *testing.T) {
	for name, lease := range map[string]BerthLeaseRef{
		"not fenced":     found,
		"lease missing":  {},
		"fenced unfound": {PodFencing: true},
	} {
		pod := workloadPod()
		if changed, err := Fence("payments", pod, lease, testFence); changed || err != nil {
			t.Errorf("%s: Fence changed %v, err %v", name, changed, err)
		}
	}
	if _, err := Fence("payments", workloadPod(), fencedLease, FenceConfig{}); err == nil || !strings.Contains(err.Error(), "--fence-image") {
		t.Errorf("an agent without --fence-image: err = %v, want one naming the flag", err)
	}
}

func TestDecideCreateFenced(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		lease      BerthLeaseRef
		cfg        *FenceConfig // the validating agent's; nil: testFence, as the Pod was fenced with
		denied     string       // a part of the denial; empty: allowed
		wantReason Reason       // the denial's reason; empty: ReasonNotFenced
	}{
		{name: "wrapped", pod: fenced(t, workloadPod()), lease: fencedLease},
		{name: "not fenced: nothing asked", pod: workloadPod(), lease: found},
		{name: "never wrapped", pod: workloadPod(), lease: fencedLease, denied: "does not run under berth-fence"},
		{name: "no command", pod: fenced(t, workloadPod(func(p *corev1.Pod) { p.Spec.Containers[1].Command = nil })), lease: fencedLease,
			denied: "container sidecar sets no command"},
		{name: "container added unwrapped", pod: func() *corev1.Pod {
			p := fenced(t, workloadPod())
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "late", Command: []string{"/late"}})
			return p
		}(), lease: fencedLease, denied: "container late does not run under berth-fence"},
		{name: "another lease's name", pod: func() *corev1.Pod {
			p := fenced(t, workloadPod())
			setEnv(&p.Spec.Containers[0], EnvLeaseName, "other")
			return p
		}(), lease: fencedLease, denied: "environment variable " + EnvLeaseName},
		{name: "another audience", pod: func() *corev1.Pod {
			p := fenced(t, workloadPod())
			for _, v := range p.Spec.Volumes {
				if v.Name == FenceVolume {
					v.Projected.Sources[0].ServiceAccountToken.Audience = "berth-leaseapi/payments/other"
				}
			}
			return p
		}(), lease: fencedLease, denied: "volume " + FenceVolume},
		{name: "installer not first", pod: func() *corev1.Pod {
			p := fenced(t, workloadPod())
			slices.Reverse(p.Spec.InitContainers)
			return p
		}(), lease: fencedLease, denied: "must come first"},
		{name: "mount dropped", pod: func() *corev1.Pod {
			p := fenced(t, workloadPod())
			p.Spec.Containers[0].VolumeMounts = nil
			return p
		}(), lease: fencedLease, denied: "does not mount volume " + FenceBinVolume},

		// The installer must be exactly admission's: another image or command installs
		// another berth-fence (one that runs its child unconfirmed), a sidecar keeps
		// running beside the workload.
		{name: "installer of another image", pod: fencedWith(t, func(p *corev1.Pod) { p.Spec.InitContainers[0].Image = "registry.example/fake-fence" }),
			lease: fencedLease, denied: "init container berth-fence-install differs from the one admission injects in its image"},
		{name: "installer as a sidecar", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.InitContainers[0].RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		}), lease: fencedLease, denied: "in its restartPolicy"},
		{name: "installer with another command", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.InitContainers[0].Command = []string{"/bin/sh", "-c", "cp /fake /berth/bin/berth-fence"}
		}), lease: fencedLease, denied: "in its command"},
		{name: "installer with args, environment and a working directory", pod: fencedWith(t, func(p *corev1.Pod) {
			inst := &p.Spec.InitContainers[0]
			inst.Args, inst.WorkingDir = []string{"/tmp"}, "/tmp"
			inst.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}
		}), lease: fencedLease, denied: "in its args, workingDir, env"},
		{name: "installer with a second mount", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.InitContainers[0].VolumeMounts = append(p.Spec.InitContainers[0].VolumeMounts, corev1.VolumeMount{Name: "tools", MountPath: "/tools"})
		}), lease: fencedLease, denied: "in its volumeMounts"},
		{name: "installer with a lifecycle hook", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.InitContainers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/x"}}}}
		}), lease: fencedLease, denied: "in its other fields"},
		{name: "installer adjusted by another webhook", pod: fencedWith(t, func(p *corev1.Pod) {
			inst := &p.Spec.InitContainers[0]
			inst.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("100m")
			inst.ImagePullPolicy, inst.TerminationMessagePath = corev1.PullAlways, "/dev/termination-log"
			inst.SecurityContext.RunAsNonRoot = ptr.To(true)
		}), lease: fencedLease},

		// Nothing may be mounted over berth-fence's files, nor its volumes elsewhere.
		{name: "ConfigMap key over the binary", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: FenceBinary, SubPath: "berth-fence"})
		}), lease: fencedLease, denied: "container main mounts volume fake at /berth/bin/berth-fence"},
		{name: "ConfigMap key over the holder, path not clean", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: "/var/run/berth/./fence//holder", SubPath: "holder"})
		}), lease: fencedLease, denied: "container sidecar mounts volume fake at /var/run/berth/./fence//holder"},
		{name: "another volume at the binary's directory, trailing slash", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.InitContainers[1].VolumeMounts = append(p.Spec.InitContainers[1].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: FenceBinDir + "/"})
		}), lease: fencedLease, denied: "container migrate mounts volume fake at /berth/bin/"},
		{name: "a volume above the binary's directory (a symbolic link in it could move the fence's mount)", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: "/berth"})
		}), lease: fencedLease, denied: "container main mounts volume fake at /berth:"},
		{name: "a volume above the token's directory", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: "/var/run/"})
		}), lease: fencedLease, denied: "container sidecar mounts volume fake at /var/run/"},
		{name: "a volume at the root", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: "/"})
		}), lease: fencedLease, denied: "container sidecar mounts volume fake at /:"},
		{name: "a volume beside the token's directory", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: "/var/run/berth-other"})
		}), lease: fencedLease},
		{name: "binary's volume writable elsewhere", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, corev1.VolumeMount{Name: FenceBinVolume, MountPath: "/tmp/bin"})
		}), lease: fencedLease, denied: "container sidecar mounts volume berth-fence-bin at /tmp/bin"},
		{name: "token's volume elsewhere", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: FenceVolume, MountPath: "/token", ReadOnly: true})
		}), lease: fencedLease, denied: "container main mounts volume berth-fence at /token"},
		{name: "installer mounts over the binary", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.InitContainers[0].VolumeMounts = append(p.Spec.InitContainers[0].VolumeMounts, corev1.VolumeMount{Name: "fake", MountPath: FenceBinary, SubPath: "berth-fence"})
		}), lease: fencedLease, denied: "container berth-fence-install mounts volume fake at /berth/bin/berth-fence"},
		{name: "block device over the binary", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "disk", DevicePath: FenceBinary}}
		}), lease: fencedLease, denied: "container main puts device disk at /berth/bin/berth-fence"},

		// The environment berth-fence reads is exactly admission's: the kubelet takes the
		// last of duplicates, and the lease API's URL and CA decide who confirms.
		{name: "lease API URL repeated", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: EnvLeaseAPIURL, Value: "https://always-confirms.example"})
		}), lease: fencedLease, denied: "container main: environment variable BERTH_LEASE_API_URL is set 2 times"},
		{name: "lease API URL changed", pod: fencedWith(t, func(p *corev1.Pod) { setEnv(&p.Spec.Containers[1], EnvLeaseAPIURL, "https://always-confirms.example") }),
			lease: fencedLease, denied: "container sidecar: environment variable BERTH_LEASE_API_URL is not the one admission injects"},
		{name: "lease API CA changed", pod: fencedWith(t, func(p *corev1.Pod) {
			setEnv(&p.Spec.InitContainers[1], EnvLeaseAPICA, "-----BEGIN CERTIFICATE-----\nfake")
		}),
			lease: fencedLease, denied: "container migrate: environment variable BERTH_LEASE_API_CA is not the one admission injects"},
		{name: "lease API CA dropped, for envFrom to supply", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = slices.DeleteFunc(p.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == EnvLeaseAPICA })
		}), lease: fencedLease, denied: "environment variable BERTH_LEASE_API_CA is not the one admission injects"},
		{name: "token file from a field", pod: fencedWith(t, func(p *corev1.Pod) {
			for i, e := range p.Spec.Containers[0].Env {
				if e.Name == EnvFenceTokenFile {
					p.Spec.Containers[0].Env[i] = corev1.EnvVar{Name: e.Name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}
				}
			}
		}), lease: fencedLease, denied: "environment variable BERTH_FENCE_TOKEN_FILE is not the one"},
		{name: "another berth-fence variable", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "BERTH_FENCE_SKIP", Value: "1"})
		}), lease: fencedLease, denied: "environment variable BERTH_FENCE_SKIP configures berth-fence"},
		{name: "fenced by an agent configured otherwise", pod: fenced(t, workloadPod()), lease: fencedLease,
			cfg: &FenceConfig{Image: testFence.Image, LeaseAPIURL: "https://leases.other:8443"}, denied: "BERTH_LEASE_API_URL is not the one"},
		{name: "validating agent without a fence image", pod: fenced(t, workloadPod()), lease: fencedLease,
			cfg: &FenceConfig{}, denied: "runs without --fence-image", wantReason: ReasonFenceUnavailable},

		// Exec probes and hooks run in the container beside berth-fence's child.
		{name: "an exec probe added unwrapped", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/exporter", "--run"}}}}
		}), lease: fencedLease, denied: "container main: an exec probe or lifecycle hook"},
		{name: "a postStart hook unwrapped", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].Lifecycle.PostStart.Exec.Command = []string{"/warm-up"}
		}), lease: fencedLease, denied: "container sidecar: an exec probe or lifecycle hook"},
		{name: "a hook wrapped without --once", pod: fencedWith(t, func(p *corev1.Pod) {
			p.Spec.Containers[1].Lifecycle.PostStart.Exec.Command = []string{FenceBinary, "exec", "--", "/warm-up"}
		}), lease: fencedLease, denied: "container sidecar: an exec probe or lifecycle hook"},

		// berth-fence must be its container's PID 1.
		{name: "shared process namespace", pod: fencedWith(t, func(p *corev1.Pod) { p.Spec.ShareProcessNamespace = ptr.To(true) }),
			lease: fencedLease, denied: "spec.shareProcessNamespace is true"},
		{name: "host PID namespace", pod: fencedWith(t, func(p *corev1.Pod) { p.Spec.HostPID = true }),
			lease: fencedLease, denied: "spec.hostPID is true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, wantReason := testFence, tc.wantReason
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			if wantReason == "" {
				wantReason = ReasonNotFenced
			}
			d := DecideCreate("payments", tc.pod, tc.lease, cfg)
			switch {
			case tc.denied == "" && !d.Allowed:
				t.Errorf("denied: %s", d.Message)
			case tc.denied != "" && (d.Allowed || d.Reason != wantReason || !strings.Contains(d.Message, tc.denied)):
				t.Errorf("decision %+v, want a %s denial saying %q", d, wantReason, tc.denied)
			}
		})
	}
}

// fencedWith is a workload Pod as the mutating webhook leaves it, then changed by change
// (by a later webhook, or a template that carries the injection itself).
func fencedWith(t *testing.T, change func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p := fenced(t, workloadPod())
	change(p)
	return p
}

// TestFenceReplacesLookAlikes checks that the mutating webhook replaces what a Pod brings
// in place of its own: the Pod comes out with exactly admission's installer, volumes,
// environment and mounts, is admitted, and a second call changes nothing.
func TestFenceReplacesLookAlikes(t *testing.T) {
	fakeInstaller := corev1.Container{Name: FenceInitContainer, Image: "registry.example/fake-fence",
		Command: []string{"/bin/sh", "-c", "echo 'exec \"$@\"' > /berth/bin/berth-fence"}, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		VolumeMounts: []corev1.VolumeMount{{Name: FenceBinVolume, MountPath: FenceBinDir}}}
	preWrapped := func(p *corev1.Pod) {
		main := &p.Spec.Containers[0]
		main.Command = []string{FenceBinary, "exec", "--", "/exporter"}
		main.Env = append(main.Env,
			corev1.EnvVar{Name: EnvLeaseAPIURL, Value: "https://leases.example:8443"},
			corev1.EnvVar{Name: EnvLeaseAPIURL, Value: "https://always-confirms.example"},
			corev1.EnvVar{Name: EnvFenceTokenFile, Value: "/fake/token"},
			corev1.EnvVar{Name: "BERTH_FENCE_SKIP", Value: "1"})
		main.VolumeMounts = append(main.VolumeMounts,
			corev1.VolumeMount{Name: "fake", MountPath: FenceBinDir + "/"},
			corev1.VolumeMount{Name: FenceVolume, MountPath: "/token"})
	}
	cases := map[string]struct {
		pod *corev1.Pod
	}{
		"look-alike installer first, a sidecar of another image": {pod: workloadPod(func(p *corev1.Pod) {
			p.Spec.InitContainers = append([]corev1.Container{fakeInstaller}, p.Spec.InitContainers...)
		})},
		"look-alike installer last": {pod: workloadPod(func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, fakeInstaller)
		})},
		"genuine installer last": {pod: workloadPod(func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, (fence{cfg: testFence}).initContainer())
		})},
		"container wrapped already, pointing at another lease API": {pod: workloadPod(preWrapped)},
		"look-alike volumes": {pod: workloadPod(func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes,
				corev1.Volume{Name: FenceBinVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "fake"}}}},
				corev1.Volume{Name: FenceVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		})},
	}
	f := fence{cfg: testFence, key: leaseapi.Key{Namespace: "payments", Name: fencedLease.LeaseName}}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pod := fenced(t, tc.pod)
			if diff := cmp.Diff(f.initContainer(), pod.Spec.InitContainers[0]); diff != "" {
				t.Errorf("first init container (-want injected +got):\n%s", diff)
			}
			if n := slices.IndexFunc(pod.Spec.InitContainers[1:], func(c corev1.Container) bool { return c.Name == FenceInitContainer }); n >= 0 {
				t.Errorf("a second %s is left: %+v", FenceInitContainer, pod.Spec.InitContainers[1+n])
			}
			for _, want := range f.volumes() {
				if diff := cmp.Diff(&want, namedVolume(pod, want.Name)); diff != "" {
					t.Errorf("volume %s (-want +got):\n%s", want.Name, diff)
				}
			}
			for _, c := range workloadContainers(pod) {
				var berth []corev1.EnvVar
				for _, e := range c.Env {
					if strings.HasPrefix(e.Name, "BERTH_") {
						berth = append(berth, e)
					}
				}
				if diff := cmp.Diff(f.env(), berth); diff != "" {
					t.Errorf("container %s: BERTH_ environment (-want +got):\n%s", c.Name, diff)
				}
				var fenceMounts []corev1.VolumeMount
				for _, m := range c.VolumeMounts {
					if isFenceVolume(m.Name) || inFenceDir(m.MountPath) {
						fenceMounts = append(fenceMounts, m)
					}
				}
				if diff := cmp.Diff(f.mounts(), fenceMounts); diff != "" {
					t.Errorf("container %s: mounts of the fence (-want +got):\n%s", c.Name, diff)
				}
			}
			if d := DecideCreate("payments", pod, fencedLease, testFence); !d.Allowed {
				t.Errorf("denied: %s", d.Message)
			}
			again := pod.DeepCopy()
			if changed, _ := Fence("payments", again, fencedLease, testFence); changed {
				t.Errorf("a second call changed the Pod:\n%s", cmp.Diff(pod, again))
			}
		})
	}
}

// An installer another webhook adjusted (resources, pull policy) is kept as it is.
func TestFenceKeepsAdjustedInstaller(t *testing.T) {
	pod := fenced(t, workloadPod())
	pod.Spec.InitContainers[0].ImagePullPolicy = corev1.PullAlways
	pod.Spec.InitContainers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("50m")
	if changed, _ := Fence("payments", pod, fencedLease, testFence); changed {
		t.Errorf("Fence replaced an installer another webhook adjusted: %+v", pod.Spec.InitContainers[0])
	}
}

func TestDecideUpdateFenced(t *testing.T) {
	debug := func(p *corev1.Pod) {
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox", Command: []string{"/exporter"}}})
	}
	ungate := func(p *corev1.Pod) {
		p.Spec.SchedulingGates = nil
		p.Annotations = map[string]string{berthv1alpha1.FencingTokenAnnotation: "1", berthv1alpha1.HolderAnnotation: "cluster-1"}
	}
	cases := map[string]struct {
		old        *corev1.Pod
		change     func(*corev1.Pod)
		user       string
		want       Decision
		wantDenial string
	}{
		"the agent ungates a fenced Pod": {change: ungate, user: testAgent, want: Decision{Allowed: true, Reason: ReasonOperator}},
		"a workload container's image changes": {
			change: func(p *corev1.Pod) { p.Spec.Containers[0].Image = "exporter:2" }, user: "alice",
			want: Decision{Allowed: true, Reason: ReasonValid}},
		"ephemeral container added": {change: debug, user: "alice", want: Decision{Reason: ReasonNotFenced},
			wantDenial: "adding ephemeral containers is refused"},
		"ephemeral container added by the agent": {change: debug, user: testAgent, want: Decision{Reason: ReasonNotFenced},
			wantDenial: "the Berth agent too: adding ephemeral containers"},
		"the agent ungates and adds an ephemeral container": {
			change: func(p *corev1.Pod) { ungate(p); debug(p) }, user: testAgent, want: Decision{Reason: ReasonNotFenced},
			wantDenial: "adding ephemeral containers"},
		"installer's image changed": {
			change: func(p *corev1.Pod) { p.Spec.InitContainers[0].Image = "registry.example/fake-fence" }, user: testAgent,
			want: Decision{Reason: ReasonNotFenced}, wantDenial: "the image of init container berth-fence-install may not change"},
		"a command unwrapped": {
			change: func(p *corev1.Pod) { p.Spec.Containers[1].Command = []string{"/proxy", "-v"} }, user: "alice",
			want: Decision{Reason: ReasonNotFenced}, wantDenial: "the command and args of container sidecar may not change"},
		"fence volume removed": {
			change: func(p *corev1.Pod) {
				p.Spec.Volumes = slices.DeleteFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == FenceVolume })
			}, user: "alice", want: Decision{Reason: ReasonNotFenced}, wantDenial: "volume berth-fence may not change or go"},
		"an unfenced managed Pod is debugged": {old: workloadPod(), change: debug, user: "alice", want: Decision{Allowed: true, Reason: ReasonValid}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			old := tc.old
			if old == nil {
				old = fenced(t, workloadPod())
			}
			pod := old.DeepCopy()
			tc.change(pod)
			got := DecideUpdate("payments", old, pod, tc.user, testAgent)
			var msgs []string
			if tc.wantDenial != "" {
				msgs = []string{tc.wantDenial}
			}
			checkDecision(t, got, tc.want, msgs)
		})
	}
}

func setEnv(c *corev1.Container, name, value string) {
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i].Value = value
		}
	}
}

// A Pod made before its BerthLease waits unfenced and unstamped; the agent recycles it
// once the BerthLease exists, and the new one is fenced.
func TestDecideCreateAwaitingIsNotFenced(t *testing.T) {
	pod := newPod(withLabel(berthv1alpha1.ManagedLeaseLabel, "exporter"), withGate(berthv1alpha1.LeaseHeldSchedulingGate), ownedBy("ReplicaSet"))
	if d := DecideCreate("payments", pod, BerthLeaseRef{Found: true, UID: testUID, JustMade: true, LeaseName: "exporter", PodFencing: true}, testFence); !d.Allowed || d.Reason != ReasonAwaitingLease {
		t.Errorf("decision %+v, want allowed awaiting its lease", d)
	}
}
