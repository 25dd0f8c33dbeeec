package kubernetes_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/kubernetes"
	"github.com/berthfleet/berth/leaseapi/store/storetest"
	"github.com/berthfleet/berth/test/kubeenv"
)

func TestConformance(t *testing.T) {
	env := kubeenv.StartForTest(t, kubeenv.Options{Clusters: 1, Nodes: 1})
	cfg := env.Clusters[0].RESTConfig()
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := kubernetes.Open(t.Context(), cfg, fmt.Sprintf("berth-leases-%d", n.Add(1)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
