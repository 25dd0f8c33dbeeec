package fleet

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

func TestKubeconfigFiles(t *testing.T) {
	cases := map[string]struct {
		files []string
		want  map[multicluster.ClusterName]string
	}{
		"one cluster per kubeconfig, tokens and others left alone": {
			files: []string{"east.kubeconfig", "east.token", "west.yaml", "north.yml", "README.md"},
			want:  map[multicluster.ClusterName]string{"east": "east.kubeconfig", "west": "west.yaml", "north": "north.yml"},
		},
		"hidden files are being written": {
			files: []string{".east.kubeconfig", "west.kubeconfig"},
			want:  map[multicluster.ClusterName]string{"west": "west.kubeconfig"},
		},
		"two files for one cluster: the first in name order": {
			files: []string{"east.yaml", "east.kubeconfig"},
			want:  map[multicluster.ClusterName]string{"east": "east.kubeconfig"},
		},
		"no name": {
			files: []string{".kubeconfig"},
			want:  map[multicluster.ClusterName]string{},
		},
		"empty folder": {want: map[multicluster.ClusterName]string{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Mkdir(filepath.Join(dir, "sub.kubeconfig"), 0o755); err != nil {
				t.Fatal(err)
			}
			got, err := KubeconfigFiles(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := map[multicluster.ClusterName]string{}
			for c, f := range tc.want {
				want[c] = filepath.Join(dir, f)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("KubeconfigFiles (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := KubeconfigFiles(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("KubeconfigFiles of a missing folder: no error")
	}
}
