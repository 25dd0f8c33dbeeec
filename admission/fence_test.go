package admission

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

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
			{Name: "sidecar", Image: "proxy", Command: []string{"/proxy", "-v"}},
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
	if d := DecideCreate("payments", again, fencedLease); !d.Allowed {
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
		name   string
		pod    *corev1.Pod
		lease  BerthLeaseRef
		denied string // a part of the denial; empty: allowed
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideCreate("payments", tc.pod, tc.lease)
			switch {
			case tc.denied == "" && !d.Allowed:
				t.Errorf("denied: %s", d.Message)
			case tc.denied != "" && (d.Allowed || d.Reason != ReasonNotFenced || !strings.Contains(d.Message, tc.denied)):
				t.Errorf("decision %+v, want a %s denial saying %q", d, ReasonNotFenced, tc.denied)
			}
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
	if d := DecideCreate("payments", pod, BerthLeaseRef{Found: true, UID: testUID, JustMade: true, LeaseName: "exporter", PodFencing: true}); !d.Allowed || d.Reason != ReasonAwaitingLease {
		t.Errorf("decision %+v, want allowed awaiting its lease", d)
	}
}
