package history

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
)

// stopsAfterFirstRead is a cluster that deletes its Pods right after it is
// first read: as if it stopped them while the sweep read the next cluster.
type stopsAfterFirstRead struct {
	ctrlclient.Client
	reads int
}

func (c *stopsAfterFirstRead) List(ctx context.Context, list ctrlclient.ObjectList, opts ...ctrlclient.ListOption) error {
	err := c.Client.List(ctx, list, opts...)
	c.reads++
	if c.reads == 1 {
		if err := c.DeleteAllOf(ctx, &corev1.Pod{}, ctrlclient.InNamespace("payments")); err != nil {
			return err
		}
	}
	return err
}

func ungatedPod(uid string) *corev1.Pod {
	return builders.Pod("payments", "exporter-"+uid).UID(types.UID(uid)).ManagedBy("exporter").Phase(corev1.PodRunning).Obj()
}

func TestSweepConfirmsOverlapsAcrossReads(t *testing.T) {
	cases := map[string]struct {
		a    ctrlclient.Reader
		want map[string]int
	}{
		"the earlier cluster stopped between the reads: no overlap": {
			a:    &stopsAfterFirstRead{Client: fake.NewClientBuilder().WithObjects(ungatedPod("a1")).Build()},
			want: map[string]int{"a": 0, "b": 1},
		},
		"both kept their Pods: an overlap": {
			a:    fake.NewClientBuilder().WithObjects(ungatedPod("a1")).Build(),
			want: map[string]int{"a": 1, "b": 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &Recorder{namespace: "payments", lease: "exporter", clusters: map[string]ctrlclient.Reader{
				"a": tc.a,
				"b": fake.NewClientBuilder().WithObjects(ungatedPod("b1")).Build(),
			}}
			s, ok := r.sweep(t.Context())
			if !ok {
				t.Fatal("sweep failed")
			}
			for c, n := range tc.want {
				if s.Ungated[c] != n {
					t.Errorf("cluster %s: %d ungated, want %d (sweep %+v)", c, s.Ungated[c], n, s)
				}
			}
		})
	}
}

// A second BerthLease sharing the first's lease name runs the same
// workload: its Pods count with the first's, and only when asked for.
func TestSweepCountsPodsOfBerthLeasesSharingALease(t *testing.T) {
	renamed := ungatedPod("b2")
	renamed.Labels[reconciler.ManagedLease] = "exporter-v2"
	clusters := map[string]ctrlclient.Reader{
		"a": fake.NewClientBuilder().WithObjects(ungatedPod("a1")).Build(),
		"b": fake.NewClientBuilder().WithObjects(renamed).Build(),
	}
	cases := map[string]struct {
		others []string
		want   map[string]int
	}{
		"only the first BerthLease": {want: map[string]int{"a": 1, "b": 0}},
		"both":                      {others: []string{"exporter-v2"}, want: map[string]int{"a": 1, "b": 1}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &Recorder{namespace: "payments", lease: "exporter", others: tc.others, clusters: clusters}
			s, ok := r.sweep(t.Context())
			if !ok {
				t.Fatal("sweep failed")
			}
			for c, n := range tc.want {
				if s.Ungated[c] != n {
					t.Errorf("cluster %s: %d ungated, want %d (sweep %+v)", c, s.Ungated[c], n, s)
				}
			}
		})
	}
}
