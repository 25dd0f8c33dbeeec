package kubeenv

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSplitList(t *testing.T) {
	cases := map[string]struct {
		in   string
		want []string
	}{
		"unset":   {in: "", want: nil},
		"one":     {in: "a.kubeconfig", want: []string{"a.kubeconfig"}},
		"several": {in: "a.kubeconfig,/tmp/b.yaml", want: []string{"a.kubeconfig", "/tmp/b.yaml"}},
		"blanks":  {in: " a , ,b ,", want: []string{"a", "b"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, splitList(tc.in)); diff != "" {
				t.Errorf("splitList(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestClusterName(t *testing.T) {
	cases := map[string]struct {
		path, want string
	}{
		"kubeconfig extension": {path: "/tmp/kind-east.kubeconfig", want: "kind-east"},
		"yaml extension":       {path: "west.yaml", want: "west"},
		"no extension":         {path: "/home/me/.kube/config", want: "config"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := clusterName(tc.path); got != tc.want {
				t.Errorf("clusterName(%q) = %q, want %q", tc.path, got, tc.want)
			}
		})
	}
}

func TestNodeNotReady(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	cases := map[string]struct {
		conditions []corev1.NodeCondition
		taints     []corev1.Taint
		want       string
	}{
		"ready": {conditions: []corev1.NodeCondition{ready}, want: ""},
		"ready with an unrelated taint": {
			conditions: []corev1.NodeCondition{ready},
			taints:     []corev1.Taint{{Key: "example.com/dedicated", Effect: corev1.TaintEffectNoSchedule}},
			want:       "",
		},
		"no conditions yet": {want: "node n to be Ready"},
		"not ready": {
			conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}},
			want:       "node n to be Ready",
		},
		"ready, still tainted not-ready": {
			conditions: []corev1.NodeCondition{ready},
			taints:     []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}},
			want:       "node n to lose taint node.kubernetes.io/not-ready",
		},
		"ready, tainted unreachable": {
			conditions: []corev1.NodeCondition{ready},
			taints:     []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}},
			want:       "node n to lose taint node.kubernetes.io/unreachable",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			node := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "n"},
				Spec:       corev1.NodeSpec{Taints: tc.taints},
				Status:     corev1.NodeStatus{Conditions: tc.conditions},
			}
			if got := nodeNotReady(node); got != tc.want {
				t.Errorf("nodeNotReady = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseVmRSS(t *testing.T) {
	cases := map[string]struct {
		status  string
		want    uint64
		wantErr bool
	}{
		"present": {status: "Name:\tetcd\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n", want: 12345 * 1024},
		"missing": {status: "Name:\tetcd\nThreads:\t9\n", wantErr: true},
		"garbled": {status: "VmRSS:\t12x kB\n", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseVmRSS([]byte(tc.status))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseVmRSS = %d, %v; want %d, error %t", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
