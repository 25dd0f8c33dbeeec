package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// Reasons a cluster must hand its leases over, as reconciler conditions show
// (defined in api/v1alpha1, names.go).
const (
	ReasonCordoned            = berthv1alpha1.CordonedReason
	ReasonRegistrationRefused = berthv1alpha1.RegistrationRefusedReason
	ReasonUnregistered        = berthv1alpha1.UnregisteredReason
	// ReasonLeaving: the cluster is leaving a fleet-mode agent (its
	// kubeconfig was removed from the folder).
	ReasonLeaving = berthv1alpha1.LeavingReason
)

// DefaultHeartbeatInterval is how often a registrar heartbeats; the lease API
// counts a cluster healthy for 30 s after a heartbeat.
const DefaultHeartbeatInterval = 10 * time.Second

// Registry is the part of the lease API client a Registrar uses.
type Registry interface {
	RegisterCluster(ctx context.Context, id string, reg leaseapi.ClusterRegistration) (leaseapi.ClusterRegistrationResponse, error)
}

var _ Registry = (*leaseclient.Client)(nil)

// Fingerprint identifies a cluster: the UID of its kube-system namespace,
// which no other cluster shares and which survives agent restarts.
func Fingerprint(ctx context.Context, c ctrlclient.Reader) (string, error) {
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, ctrlclient.ObjectKey{Name: "kube-system"}, ns); err != nil {
		return "", fmt.Errorf("read the kube-system namespace for the cluster fingerprint: %w", err)
	}
	return string(ns.UID), nil
}

var (
	registeredGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_agent_cluster_registered",
		Help: "1 while the cluster's registration at the lease API is current.",
	}, []string{"cluster"})
	cordonedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_agent_cluster_cordoned",
		Help: "1 while the lease API marks the cluster cordoned.",
	}, []string{"cluster"})
	refusedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_agent_registration_refused",
		Help: "1 while the lease API refuses the cluster's registration because another cluster holds its id.",
	}, []string{"cluster"})
)

func init() {
	metrics.Registry.MustRegister(registeredGauge, cordonedGauge, refusedGauge)
}

// Registrar registers one cluster and heartbeats. It is a controller-runtime
// Runnable that runs on every replica, leader or not.
type Registrar struct {
	ClusterID    string
	Fingerprint  string
	AgentVersion string
	Labels       map[string]string
	Registry     Registry
	// Interval between heartbeats (DefaultHeartbeatInterval).
	Interval time.Duration
	Log      logr.Logger
	// OnChange, when set, is called in its own goroutine whenever the
	// membership changes, so that leases react at once.
	OnChange func(ctx context.Context)

	mu    sync.Mutex
	state state
}

type state struct {
	registered bool
	cordoned   bool
	refused    error
	lastErr    error
}

// Register makes one registration attempt and records its outcome.
func (r *Registrar) Register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.interval())
	defer cancel()
	res, err := r.Registry.RegisterCluster(ctx, r.ClusterID, leaseapi.ClusterRegistration{
		Fingerprint: r.Fingerprint, AgentVersion: r.AgentVersion, Labels: maps.Clone(r.Labels),
	})

	r.mu.Lock()
	old := r.state
	switch {
	case errors.Is(err, leaseclient.ErrConflict):
		r.state = state{refused: err}
		if old.refused == nil {
			r.Log.Error(err, "the lease API refused this cluster's registration: another live cluster holds the same cluster id; this agent acquires nothing until that changes",
				"cluster", r.ClusterID, "fingerprint", r.Fingerprint)
		}
	case err != nil:
		// Keep the last known membership: a heartbeat that fails does not
		// change whether the cluster is cordoned. Leases self-fence on their
		// own if the lease API stays unreachable.
		r.state.lastErr = err
		r.Log.V(1).Info("heartbeat failed", "cluster", r.ClusterID, "error", err.Error())
	default:
		r.state = state{registered: true, cordoned: res.Cordoned}
		switch {
		case !old.registered:
			r.Log.Info("cluster registered", "cluster", r.ClusterID, "fingerprint", r.Fingerprint, "cordoned", res.Cordoned)
		case old.cordoned != res.Cordoned:
			r.Log.Info("cluster cordon changed", "cluster", r.ClusterID, "cordoned", res.Cordoned)
		}
	}
	r.observe()
	changed := membershipOf(old) != membershipOf(r.state)
	r.mu.Unlock()
	if changed && r.OnChange != nil {
		// Never hold up the heartbeat; and the wake-up must outlive this
		// call's context, which ends as soon as it returns.
		go r.OnChange(context.WithoutCancel(ctx))
	}
	return err
}

// membershipOf reduces a state to what the reconciler acts on.
func membershipOf(s state) [3]bool {
	return [3]bool{s.registered, s.cordoned, s.refused != nil}
}

func (r *Registrar) observe() {
	registeredGauge.WithLabelValues(r.ClusterID).Set(boolGauge(r.state.registered))
	cordonedGauge.WithLabelValues(r.ClusterID).Set(boolGauge(r.state.cordoned))
	refusedGauge.WithLabelValues(r.ClusterID).Set(boolGauge(r.state.refused != nil))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Start heartbeats until ctx ends.
func (r *Registrar) Start(ctx context.Context) error {
	t := time.NewTicker(r.interval())
	defer t.Stop()
	for {
		_ = r.Register(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection is false: every replica keeps the registration fresh.
func (r *Registrar) NeedLeaderElection() bool { return false }

// Membership tells the reconciler whether this cluster must hand its leases
// over, and why; an empty reason means it may hold leases.
func (r *Registrar) Membership() (reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s := r.state; {
	case s.refused != nil:
		return ReasonRegistrationRefused, fmt.Sprintf("cluster id %q is registered by another cluster: %v", r.ClusterID, s.refused)
	case !s.registered:
		return ReasonUnregistered, fmt.Sprintf("cluster %q is not registered at the lease API yet", r.ClusterID)
	case s.cordoned:
		return ReasonCordoned, fmt.Sprintf("cluster %q is cordoned at the lease API: it hands its leases over and takes none until uncordoned", r.ClusterID)
	}
	return "", ""
}

// Checker is a readiness check: ready once registered and not refused.
func (r *Registrar) Checker(*http.Request) error {
	if reason, msg := r.Membership(); reason == ReasonRegistrationRefused || reason == ReasonUnregistered {
		return errors.New(msg)
	}
	return nil
}

func (r *Registrar) interval() time.Duration {
	if r.Interval > 0 {
		return r.Interval
	}
	return DefaultHeartbeatInterval
}

// RegisterFirst reads the cluster's fingerprint from c and registers the
// cluster once, before anything else starts, so that the reconciler knows
// from its first reconcile whether it may hold leases. Only reading the
// fingerprint fails it: a refused or failed registration is what Membership
// then says, and the heartbeat keeps trying.
func (r *Registrar) RegisterFirst(ctx context.Context, c ctrlclient.Reader) error {
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fingerprint, err := Fingerprint(fctx, c)
	if err != nil {
		return err
	}
	r.Fingerprint = fingerprint
	if err := r.Register(ctx); err != nil && !errors.Is(err, leaseclient.ErrConflict) {
		r.Log.Error(err, "first registration failed; retrying with the heartbeat", "cluster", r.ClusterID)
	}
	return nil
}
