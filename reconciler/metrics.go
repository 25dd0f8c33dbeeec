package reconciler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The agent's lease metrics, on controller-runtime's registry (served on
// --metrics-bind-address). Labels: the cluster (the agent's cluster id, empty
// without one) and the BerthLease's namespace and name, so that a fleet-mode
// agent keeps its clusters apart.
var (
	leaseHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_agent_lease_held",
		Help: "1 while this cluster holds the BerthLease's lease and may run its Pods.",
	}, []string{"cluster", "namespace", "name"})
	leaseTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_agent_lease_transitions_total",
		Help: "Lease transitions of this cluster, by reason (Acquired, Lost, Released, Stopping, SelfFenced, LeaseAPIUnreachable).",
	}, []string{"cluster", "namespace", "name", "reason"})
	leaseCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_agent_lease_call_duration_seconds",
		Help:    "Time of one lease API call, by call (acquire, renew, recover, release) and result (ok, error).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"call", "result"})
	deadlineRemaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_agent_local_deadline_remaining_seconds",
		Help: "Time left before the local deadline of the held term, as of its last renewal or reconcile (0 when not held).",
	}, []string{"cluster", "namespace", "name"})
	renewTime = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_agent_lease_renew_timestamp_seconds",
		Help: "When the last successful renewal of the held term was sent (Unix time), for renewals in batches; status does not record renewals.",
	}, []string{"cluster", "namespace", "name"})
	renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_agent_renewals_total",
		Help: "Renewals of running terms sent in batches, by result (renewed, lost, revoked, error).",
	}, []string{"cluster", "result"})
	batchSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_agent_renewal_batch_size",
		Help:    "Leases renewed by one batched renewal.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 8),
	}, []string{"cluster"})
	leaseEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_agent_lease_events_total",
		Help: "Events of the lease API's change stream, by type (reset, changed), and the reconciles they woke (woken).",
	}, []string{"cluster", "type"})
	selfFences = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_agent_self_fence_total",
		Help: "Times the local deadline passed without a renewal, so that the agent stopped its Pods on its own.",
	}, []string{"cluster", "namespace", "name"})
	placementMoves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_agent_placement_moves_total",
		Help: "Placement decisions on held terms, by reason: FailingOver and FailingBack (the term was moved), FailoverLimited (it stayed), FailbackHeld (a failback waits), InvalidPlacement (no failback).",
	}, []string{"cluster", "namespace", "name", "reason"})
)

func init() {
	metrics.Registry.MustRegister(leaseHeld, leaseTransitions, leaseCallDuration, deadlineRemaining, selfFences,
		renewTime, renewals, batchSize, leaseEvents, placementMoves)
}

// observeBatch records one batched renewal of n leases.
func observeBatch(cluster string, sent, done time.Time, n int, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	leaseCallDuration.WithLabelValues("renew-batch", result).Observe(done.Sub(sent).Seconds())
	batchSize.WithLabelValues(cluster).Observe(float64(n))
}
