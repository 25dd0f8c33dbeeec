package server

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthfleet/berth/leaseapi/store/refclock"
)

// ObserveClock exports the reading of a shared store's clock, by which the
// service judges lease terms (docs/safety.md, "Clocks").
func (m *Metrics) ObserveClock(c *refclock.Clock) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "berth_leaseapi_clock_uncertainty_seconds",
			Help: "Width of the bounds on the shared store's clock that lease terms are judged by; +Inf when it cannot be bounded (the server then refuses lease requests).",
		}, func() float64 {
			r, _, ok := c.Estimate()
			if !ok {
				return math.Inf(1)
			}
			return r.Uncertainty().Seconds()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "berth_leaseapi_clock_offset_seconds",
			Help: "The shared store's clock (middle of its bounds) minus this server's wall clock; NaN when it cannot be bounded.",
		}, func() float64 {
			r, local, ok := c.Estimate()
			if !ok {
				return math.NaN()
			}
			return r.Earliest.Add(r.Uncertainty() / 2).Sub(local).Seconds()
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "berth_leaseapi_clock_resets_total",
			Help: "Samples of the shared store's clock that contradicted all earlier ones (its clock was stepped, or another server answered), which were dropped.",
		}, func() float64 { return float64(c.Resets()) }),
	)
}
