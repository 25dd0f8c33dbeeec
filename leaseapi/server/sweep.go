package server

import (
	"context"
	"time"
)

// RunSweeper frees expired leases every SweepInterval and refreshes the
// gauges, until ctx ends.
func (s *Server) RunSweeper(ctx context.Context) {
	t := s.Clock.NewTicker(s.SweepInterval)
	defer t.Stop()
	for {
		s.sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

func (s *Server) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := s.Service.Sweep(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.Log.Error(err, "sweep expired leases")
		}
		return
	}
	s.Metrics.leasesHeld.Set(float64(res.Held))
	if res.Expired > 0 {
		s.Metrics.transitions.WithLabelValues("expired").Add(float64(res.Expired))
		s.Log.V(1).Info("freed expired leases", "count", res.Expired)
	}
	clusters, err := s.Service.Clusters(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.Log.Error(err, "count clusters")
		}
		return
	}
	healthy, cordoned := 0, 0
	for _, c := range clusters {
		if c.Healthy {
			healthy++
		}
		if c.Cordoned {
			cordoned++
		}
	}
	s.Metrics.clustersTotal.Set(float64(len(clusters)))
	s.Metrics.clustersHealthy.Set(float64(healthy))
	s.Metrics.clustersCordoned.Set(float64(cordoned))
}
