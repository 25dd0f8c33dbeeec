package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// Metrics are the lease API's Prometheus metrics, on a registry of their own
// so that several servers can live in one test process.
type Metrics struct {
	Registry *prometheus.Registry

	requests         *prometheus.CounterVec
	requestDuration  *prometheus.HistogramVec
	outcomes         *prometheus.CounterVec
	batchLeases      prometheus.Histogram
	storeDuration    *prometheus.HistogramVec
	leasesHeld       prometheus.Gauge
	transitions      *prometheus.CounterVec
	clustersTotal    prometheus.Gauge
	clustersHealthy  prometheus.Gauge
	clustersCordoned prometheus.Gauge
	watchesOpen      prometheus.Gauge
	watchEvents      *prometheus.CounterVec
	watchResets      *prometheus.CounterVec
	confirmations    *prometheus.CounterVec
}

// NewMetrics registers the metrics (and the Go and process collectors) on a
// new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaseapi_requests_total",
			Help: "HTTP requests answered, by route and status code.",
		}, []string{"route", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_leaseapi_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaseapi_outcomes_total",
			Help: "Lease and registry requests by outcome: acquired, held-by-other, renewed, lost, released, revoked, moved, conflict, unauthorized, invalid, error.",
		}, []string{"outcome"}),
		batchLeases: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "berth_leaseapi_batch_renewal_leases",
			Help:    "Leases per batched renewal (POST /v1alpha1/renewals) accepted for renewal.",
			Buckets: []float64{1, 10, 50, 100, 500, 1000, 2500, 5000, 10000},
		}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_leaseapi_store_duration_seconds",
			Help:    "Time of one store call, by operation.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"op"}),
		leasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_leaseapi_leases_held",
			Help: "Leases with a live holder, as of the last sweep.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaseapi_lease_transitions_total",
			Help: "Changes of a lease's holder, by reason: acquired, released, expired.",
		}, []string{"reason"}),
		clustersTotal: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_leaseapi_clusters_registered",
			Help: "Clusters registered, as of the last sweep.",
		}),
		clustersHealthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_leaseapi_clusters_healthy",
			Help: "Registered clusters whose last heartbeat is recent, as of the last sweep.",
		}),
		clustersCordoned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_leaseapi_clusters_cordoned",
			Help: "Registered clusters that are cordoned, as of the last sweep.",
		}),
		watchesOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "berth_leaseapi_watches_open",
			Help: "Watch streams (GET /v1alpha1/watch/leases) open.",
		}),
		watchEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaseapi_watch_events_total",
			Help: "Lines sent on watch streams, by type: RESET, CHANGED, BOOKMARK.",
		}, []string{"type"}),
		watchResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaseapi_watch_resets_total",
			Help: "RESET lines sent on watch streams, by cause: start, unknown-revision, too-old, behind, feed.",
		}, []string{"cause"}),
		confirmations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_leaseapi_confirmations_total",
			Help: "Confirmations of a lease's term answered (GET .../confirmation), by result: confirmed, not-confirmed.",
		}, []string{"result"}),
	}
	for _, result := range []string{"confirmed", "not-confirmed"} {
		m.confirmations.WithLabelValues(result)
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests, m.requestDuration, m.outcomes, m.batchLeases, m.storeDuration, m.leasesHeld,
		m.transitions, m.clustersTotal, m.clustersHealthy, m.clustersCordoned,
		m.watchesOpen, m.watchEvents, m.watchResets, m.confirmations,
	)
	return m
}

func (m *Metrics) observeOutcome(outcome string) { m.outcomes.WithLabelValues(outcome).Inc() }

// observeConfirmation counts an answered confirmation by its result.
func (m *Metrics) observeConfirmation(c leaseapi.Confirmation) {
	result := "not-confirmed"
	if c.Confirmed {
		result = "confirmed"
	}
	m.confirmations.WithLabelValues(result).Inc()
}

// observeDecision counts a decision's outcome and, when the holder changed,
// the transition.
func (m *Metrics) observeDecision(d lease.Decision) {
	m.observeOutcome(string(d.Outcome))
	switch {
	case d.Outcome == lease.OutcomeAcquired:
		m.transitions.WithLabelValues("acquired").Inc()
	case d.Outcome == lease.OutcomeReleased && d.Write:
		m.transitions.WithLabelValues("released").Inc()
	}
}

// InstrumentStore wraps s so that every call's latency is observed. The
// wrapper offers store.LeaseBatchStore when s does.
func (m *Metrics) InstrumentStore(s store.Store) store.Store {
	is := &instrumentedStore{Store: s, m: m}
	if b, ok := s.(store.LeaseBatchStore); ok {
		return &instrumentedBatchStore{instrumentedStore: is, batch: b}
	}
	return is
}

type instrumentedBatchStore struct {
	*instrumentedStore
	batch store.LeaseBatchStore
}

var _ store.LeaseBatchStore = (*instrumentedBatchStore)(nil)

func (s *instrumentedBatchStore) GetLeases(ctx context.Context, keys []store.LeaseKey) ([]store.Lease, error) {
	defer s.observe("get_leases", time.Now())
	return s.batch.GetLeases(ctx, keys)
}

func (s *instrumentedBatchStore) PutLeases(ctx context.Context, leases []store.Lease) ([]store.Lease, []error, error) {
	defer s.observe("put_leases", time.Now())
	return s.batch.PutLeases(ctx, leases)
}

type instrumentedStore struct {
	store.Store
	m *Metrics
}

func (s *instrumentedStore) observe(op string, start time.Time) {
	s.m.storeDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (s *instrumentedStore) GetLease(ctx context.Context, namespace, name string) (store.Lease, error) {
	defer s.observe("get_lease", time.Now())
	return s.Store.GetLease(ctx, namespace, name)
}

func (s *instrumentedStore) PutLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	defer s.observe("put_lease", time.Now())
	return s.Store.PutLease(ctx, l)
}

func (s *instrumentedStore) ListLeases(ctx context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	defer s.observe("list_leases", time.Now())
	return s.Store.ListLeases(ctx, opts)
}

func (s *instrumentedStore) GetCluster(ctx context.Context, id string) (store.Cluster, error) {
	defer s.observe("get_cluster", time.Now())
	return s.Store.GetCluster(ctx, id)
}

func (s *instrumentedStore) PutCluster(ctx context.Context, c store.Cluster) (store.Cluster, error) {
	defer s.observe("put_cluster", time.Now())
	return s.Store.PutCluster(ctx, c)
}

func (s *instrumentedStore) ListClusters(ctx context.Context) ([]store.Cluster, error) {
	defer s.observe("list_clusters", time.Now())
	return s.Store.ListClusters(ctx)
}

var _ store.TermStore = (*instrumentedStore)(nil)

// ListTerms passes store.TermStore on: the wrapped store's terms, or none
// when it keeps none.
func (s *instrumentedStore) ListTerms(ctx context.Context, namespace, name string, limit int) ([]store.Term, error) {
	ts, ok := s.Store.(store.TermStore)
	if !ok {
		return nil, nil
	}
	defer s.observe("list_terms", time.Now())
	return ts.ListTerms(ctx, namespace, name, limit)
}

func (s *instrumentedStore) Ping(ctx context.Context) error {
	defer s.observe("ping", time.Now())
	return s.Store.Ping(ctx)
}
