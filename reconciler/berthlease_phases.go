package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi"
	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// observation is what one reconcile gathered.
type observation struct {
	facts     Facts
	holder    string
	ttl       time.Duration
	heartbeat time.Duration
	// tenure is the memory's tenure the facts were taken from.
	tenure tenure
	// mem is the memory the facts were taken from.
	mem *memory
	// handedOver: the reconcile handed the running term to the renewer,
	// which took it (handOver).
	handedOver bool
	// specErr explains Facts.Invalid.
	specErr error
	// yieldReason and yieldMessage explain Facts.Cordoned.
	yieldReason, yieldMessage string
	// shadowedBy names the older BerthLease that explains Facts.Shadowed;
	// sharedWith names a BerthLease that explains Facts.KeyShared.
	shadowedBy, sharedWith string
	// running are ungated, unfinished managed Pods; gated are this
	// BerthLease's Pods waiting behind the gate.
	running, gated []corev1.Pod
	// stale are gated Pods stamped with the UID of an earlier BerthLease of
	// this name: they can never run, so they are recycled.
	stale []corev1.Pod
	// strays are ungated Pods stamped with the UID of an earlier BerthLease
	// of this name (forced out without its finalizer): they ran under a term
	// of that BerthLease, not of this one, so they are stopped whatever this
	// one decides. They are also in running until they are gone.
	strays  []corev1.Pod
	managed int
}

// minTTLSeconds is the shortest TTL a BerthLease may ask for (the CRD's
// minimum too).
const minTTLSeconds = 3

// validateSpec checks what CEL cannot: that a holder is known, and the
// timing again in case an object slipped past validation.
func (r *BerthLeaseReconciler) validateSpec(bl *berthv1alpha1.BerthLease) error {
	s := bl.Spec
	switch {
	case r.holder(bl) == "":
		return errors.New("no holder identity: set spec.holderIdentity or run the agent with --cluster-id")
	case s.TTLSeconds < minTTLSeconds:
		return fmt.Errorf("ttlSeconds %d is below the minimum of %d", s.TTLSeconds, minTTLSeconds)
	case s.HeartbeatIntervalSeconds < 1 || s.HeartbeatIntervalSeconds*3 > s.TTLSeconds:
		return fmt.Errorf("heartbeatIntervalSeconds %d must be between 1 and a third of ttlSeconds (%d)", s.HeartbeatIntervalSeconds, s.TTLSeconds)
	}
	return nil
}

// observe gathers the facts: the spec, the in-memory term, and the managed
// Pods read from the API server (not the cache), or, when pods is given,
// as that observation of this reconcile read them.
func (r *BerthLeaseReconciler) observe(ctx context.Context, bl *berthv1alpha1.BerthLease, mem *memory, pods *observation) *observation {
	p := &observation{
		mem:       mem,
		holder:    r.holder(bl),
		ttl:       time.Duration(bl.Spec.TTLSeconds) * time.Second,
		heartbeat: time.Duration(bl.Spec.HeartbeatIntervalSeconds) * time.Second,
	}
	p.specErr = r.validateSpec(bl)
	if !mem.read().started {
		renewedAt, ttl := r.lastRenewal(ctx, bl, p.holder)
		// The term lasts as the lease API granted it, which may be shorter
		// than the spec says now (the TTL was lowered since).
		ttl = min(p.ttl, cmp.Or(ttl, p.ttl))
		now := r.Clock.Now()
		mem.update(func(t tenure) tenure { return t.recoverFromStatus(bl.Status, p.holder, ttl, renewedAt, now) })
	}
	// The Pods are read whatever the agent's flags: without --managed-workloads
	// it ungates none, but Pods an earlier process ungated (an agent run with the
	// flag, then without) run under this cluster's term all the same, and must be
	// gone before the term is given up.
	podsUnknown := false
	switch {
	case pods != nil:
		p.running, p.gated, p.stale, p.strays, p.managed = pods.running, pods.gated, pods.stale, pods.strays, pods.managed
		podsUnknown = pods.facts.PodsUnknown
	default:
		if err := r.listPods(ctx, bl, p); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "cannot see the managed Pods; holding on to the lease until they can be seen")
			podsUnknown = true
		}
		if mem.superseded {
			// Only its own Pods run under a superseded term; the current
			// BerthLease of the name runs the others under its own.
			p.running = slices.DeleteFunc(p.running, func(pod corev1.Pod) bool { return pod.Labels[ManagedUID] != string(bl.UID) })
		}
	}
	if r.Membership != nil {
		p.yieldReason, p.yieldMessage = r.Membership()
	}
	if name, err := r.shadowedBy(ctx, bl); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "cannot tell whether an older BerthLease names this lease")
	} else {
		p.shadowedBy = name
	}
	now := r.Clock.Now()
	var fenced bool
	t := mem.update(func(t tenure) tenure {
		t, fenced = t.checkDeadline(now)
		return t
	})
	if fenced {
		logr.FromContextOrDiscard(ctx).Info("local deadline passed without a renewal: self-fencing", "token", t.term.Token)
		selfFences.WithLabelValues(r.ClusterIdentity, bl.Namespace, bl.Name).Inc()
	}
	p.tenure = t
	p.facts = t.intoFacts(Facts{
		Now:         now,
		Deleting:    !bl.DeletionTimestamp.IsZero(),
		Invalid:     p.specErr != nil,
		Cordoned:    p.yieldReason != "",
		Shadowed:    p.shadowedBy != "",
		RunningPods: len(p.running),
		PodsUnknown: podsUnknown,
		GatedPods:   len(p.gated),
		// A BerthLease that is gone or superseded has no reconcile the
		// renewer could wake; it is renewed by settling it.
		BatchRenewed: r.batching() && !mem.gone && !mem.superseded,
	})
	return p
}

// lastRenewal is when the term status says this holder holds was last
// renewed, and for how long, for a recovery after a restart
// (recoverFromStatus): the lease API's record of it, when the record still
// shows that term. A record of another term means the term is over: zero,
// so the Pods stop first. When the lease API cannot be read (a few tries
// within the call timeout), the renew time an agent of an earlier release
// wrote into status, if any, stands in (status is no longer written at
// each renewal).
func (r *BerthLeaseReconciler) lastRenewal(ctx context.Context, bl *berthv1alpha1.BerthLease, holder string) (time.Time, time.Duration) {
	st := bl.Status
	if st.LeaseState != StateHeld || st.CurrentHolder != holder || st.FencingToken == 0 || st.ReleasingToken > 0 {
		return time.Time{}, 0
	}
	lr, ok := r.LeaseClient.(LeaseReader)
	if !ok {
		return time.Time{}, 0
	}
	ctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	var (
		l   leaseapi.Lease
		err error
	)
	for range 3 {
		if l, err = lr.GetLease(ctx, bl.Namespace, bl.EffectiveLeaseName()); err == nil || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	switch {
	case err != nil:
		logr.FromContextOrDiscard(ctx).Error(err, "cannot read the lease's last renewal to recover the term status records")
		if st.RenewTime != nil {
			return st.RenewTime.Time, 0
		}
		return time.Time{}, 0
	case l.Holder != holder || l.FencingToken != st.FencingToken:
		return time.Time{}, 0
	}
	return l.RenewedAt, time.Duration(l.TTLSeconds) * time.Second
}

// LeaseReader is what a LeaseClient may also offer: a lease's record
// (leaseclient.Client.GetLease). A restarted agent reads when the term it
// recovers was last renewed from it.
type LeaseReader interface {
	GetLease(ctx context.Context, namespace, name string) (leaseapi.Lease, error)
}

func (r *BerthLeaseReconciler) listPods(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation) error {
	ctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, ctrlclient.InNamespace(bl.Namespace), ctrlclient.MatchingLabels{ManagedLease: bl.Name}); err != nil {
		p.running, p.gated, p.stale, p.strays, p.managed = nil, nil, nil, nil, 0
		return fmt.Errorf("list managed Pods: %w", err)
	}
	for _, pod := range pods.Items {
		p.managed++
		switch {
		case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		case !gated(&pod):
			// Any ungated Pod that names this lease may be running, whatever
			// its UID label says: it counts until it is gone.
			p.running = append(p.running, pod)
			if uid := pod.Labels[ManagedUID]; uid != "" && uid != string(bl.UID) {
				p.strays = append(p.strays, pod)
			}
		case !pod.DeletionTimestamp.IsZero():
		case pod.Labels[ManagedUID] == string(bl.UID):
			p.gated = append(p.gated, pod)
		default:
			p.stale = append(p.stale, pod)
		}
	}
	return nil
}

func gated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == SchedulingGate })
}

// call makes the lease API call the decision asked for, and records the
// answer in memory through afterAnswer. Every call is bounded by
// CallTimeout and, while a term is held, by its local deadline.
func (r *BerthLeaseReconciler) call(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation, mem *memory, c Call) {
	log := logr.FromContextOrDiscard(ctx)
	ns, name := bl.Namespace, bl.EffectiveLeaseName()
	ctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	t := mem.read()
	req := request{call: c, holder: p.holder, token: t.tokenFor(c), ttl: p.ttl, heartbeat: p.heartbeat, sent: r.Clock.Now()}
	req.bound = t.boundFor(req.token, req.sent)
	if deadline := t.callDeadline(); req.sent.Before(deadline) {
		// Never hold the reconcile past the local deadline: at the
		// deadline, stopping comes first.
		var cancelAtDeadline context.CancelFunc
		ctx, cancelAtDeadline = context.WithDeadline(ctx, r.wallDeadline(deadline))
		defer cancelAtDeadline()
	}

	var (
		res leaseclient.AcquireResult
		err error
	)
	switch c {
	case CallAcquire:
		if mem.holdingOff(req.sent) {
			log.V(1).Info("not asking for the lease yet: this cluster gave up its fenced term, and the others go first")
			return
		}
		res, err = r.LeaseClient.Acquire(ctx, ns, name, req.holder, req.ttl)
		if err == nil && res.Revoked && res.Holder == req.holder && res.FencingToken == mem.givenUp.Load() {
			// This cluster's own term, which it gave up by revoking it
			// (fencedTerm): it only waits out its expiry, held by no one
			// who may run. Not a revocation to hand over again.
			res.Revoked = false
		}
	case CallRenew, CallRecover:
		res, err = r.LeaseClient.Renew(ctx, ns, name, req.holder, req.token, req.ttl)
	case CallRelease:
		if rerr := r.recordRelease(ctx, bl, mem, req.token); rerr != nil {
			// Not sent: the decision's wake-up brings the next try.
			log.Error(rerr, "release not sent", "token", req.token)
			return
		}
		if fencedTerm(bl, p, mem, req.token) {
			if err = r.LeaseClient.Revoke(ctx, ns, name, req.holder, req.token); err == nil {
				mem.gaveUp(req.token, req.sent.Add(req.ttl+req.heartbeat))
			}
		} else {
			err = r.LeaseClient.Release(ctx, ns, name, req.holder, req.token)
		}
	}
	now := r.Clock.Now()
	observeCall(c, req.sent, now, err)
	var o outcome
	mem.update(func(t tenure) tenure {
		t, o = t.afterAnswer(req, res, err, now)
		return t
	})
	switch o.change {
	case changeFailed:
		if c == CallRelease {
			log.Error(err, "release failed", "token", o.token)
		} else {
			log.Error(err, "lease API call failed", "call", callName(c))
		}
	case changeRevoked:
		log.Info("lease revoked: stopping the Pods, then releasing", "token", o.token, "expiresAt", o.expiresAt)
	case changeLost:
		log.Info("lease lost", "token", o.token, "currentHolder", o.holder)
	case changeReleased:
		if mem.givenUp.Load() == req.token {
			log.Info("lease released: revoked, free at its expiry (fenced Pods)", "token", o.token)
		} else {
			log.Info("lease released", "token", o.token)
		}
	}
}

// fencedTerm reports whether Pods may run under berth-fence under the term
// of token, so that the agent must give it up by revoking it: the lease
// API then denies it to confirmations at once and grants it to no one
// before its expiry, which every fence's deadline precedes. A release
// would free it at once, while a fenced Pod the API server no longer shows
// (forced off a node the control plane cannot reach) may still run. It is
// so when the BerthLease asks spec.podFencing Exec, when a Pod the agent
// sees is fenced, or when the term was recorded as fenced (in memory, or
// in status for an agent that starts anew): switching podFencing off, a
// restart, or a BerthLease made anew does not make a fenced term a plain
// one.
func fencedTerm(bl *berthv1alpha1.BerthLease, p *observation, mem *memory, token int32) bool {
	if bl.Spec.PodFencing == berthv1alpha1.PodFencingExec || slices.ContainsFunc(p.running, fencedPod) || slices.ContainsFunc(p.gated, fencedPod) || slices.ContainsFunc(p.stale, fencedPod) {
		return true
	}
	return token > 0 && (mem.fencedToken.Load() == token || bl.Status.FencedToken == token)
}

// fencedPod reports whether admission wrapped pod in berth-fence: it has
// the fence's projected volume.
func fencedPod(pod corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == FenceVolume })
}

// recordFenced writes into status that the term of token runs fenced Pods
// (FencedToken) before the first of them is ungated, so that an agent that
// starts anew gives the term up as a fenced one (fencedTerm).
func (r *BerthLeaseReconciler) recordFenced(ctx context.Context, bl *berthv1alpha1.BerthLease, mem *memory, token int32) error {
	mem.fencedToken.Store(token)
	if mem.gone || mem.superseded || bl.Status.FencedToken == token {
		return nil
	}
	patch := ctrlclient.MergeFrom(bl.DeepCopy())
	was := bl.Status.FencedToken
	bl.Status.FencedToken = token
	switch err := r.Status().Patch(ctx, bl, patch); {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	default:
		bl.Status.FencedToken = was
		return fmt.Errorf("record fenced term %d in status: %w", token, err)
	}
}

// recordRelease writes the token about to be released into status
// (ReleasingToken) before the release is sent. A release whose outcome is
// not known may still land at the lease API later and free the term; the
// memory keeps that (releaseSent), and status keeps it for an agent that
// starts anew (a restart, a fleet member replaced), which then only stops
// the Pods and releases again instead of recovering the term and running
// under it. A BerthLease that is gone, or superseded, has no status to
// write: a new agent cannot recover its term from status either.
func (r *BerthLeaseReconciler) recordRelease(ctx context.Context, bl *berthv1alpha1.BerthLease, mem *memory, token int32) error {
	if mem.gone || mem.superseded || bl.Status.ReleasingToken == token {
		return nil
	}
	patch := ctrlclient.MergeFrom(bl.DeepCopy())
	was := bl.Status.ReleasingToken
	bl.Status.ReleasingToken = token
	err := r.Status().Patch(ctx, bl, patch)
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	default:
		bl.Status.ReleasingToken = was
		return fmt.Errorf("record the release of token %d in status: %w", token, err)
	}
}

func observeCall(c Call, sent, done time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	leaseCallDuration.WithLabelValues(callName(c), result).Observe(done.Sub(sent).Seconds())
}

// wallDeadline turns a monotonic deadline into a context deadline.
func (r *BerthLeaseReconciler) wallDeadline(deadline time.Time) time.Time {
	return time.Now().Add(deadline.Sub(r.Clock.Now()))
}

func callName(c Call) string {
	return [...]string{"none", "acquire", "renew", "recover", "release"}[c]
}

// actOnPods ungates or stops the managed Pods, if the decision asks for
// only. Only an agent with ManagedWorkloads ungates; every agent stops.
func (r *BerthLeaseReconciler) actOnPods(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation, d Decision, only PodAction) error {
	if d.Pods != only {
		return nil
	}
	switch d.Pods {
	case PodsUngate:
		if !r.ManagedWorkloads {
			return nil
		}
		return r.ungate(ctx, bl, p)
	case PodsStop:
		return r.stop(ctx, p)
	}
	return nil
}

// ungate removes the gate from each gated Pod of this BerthLease and writes
// the term on it. The update carries the Pod's resourceVersion, so it lands
// only on the Pod as it was read. It checks the deadline before every Pod.
func (r *BerthLeaseReconciler) ungate(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation) error {
	log := logr.FromContextOrDiscard(ctx)
	term := p.facts.Term
	if fencedTerm(bl, p, p.mem, term.Token) {
		if err := r.recordFenced(ctx, bl, p.mem, term.Token); err != nil {
			return err // nothing ungated: the reconcile is retried
		}
	}
	jobs, since := map[types.UID]bool{}, termStart(bl)
	var errs []error
	for i := range p.gated {
		if !r.Clock.Now().Before(term.Deadline) {
			return nil // the next reconcile stops instead
		}
		if now := p.mem.read().term; now == nil || now.Token != term.Token || now.Holder != term.Holder {
			return nil // the renewer learnt that the term ended: its wake-up follows
		}
		if ok, err := r.jobMayRun(ctx, &p.gated[i], since, jobs); !ok {
			if err != nil {
				// Only this Pod waits; the reconcile is retried.
				errs = append(errs, err)
			}
			continue // the Pod of a stale Job, or one that cannot be judged
		}
		pod := p.gated[i].DeepCopy()
		pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == SchedulingGate })
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[AnnotationFencingToken] = strconv.FormatInt(int64(term.Token), 10)
		pod.Annotations[AnnotationHolder] = term.Holder
		uctx, cancel := context.WithDeadline(ctx, r.wallDeadline(term.Deadline))
		err := r.Update(uctx, pod)
		cancel()
		switch {
		case apierrors.IsConflict(err), apierrors.IsNotFound(err):
			continue // changed or gone since read; the watch brings us back
		case err != nil:
			return fmt.Errorf("ungate Pod %s: %w", pod.Name, err)
		}
		log.V(1).Info("ungated Pod", "pod", pod.Name, "token", term.Token)
	}
	return errors.Join(errs...)
}

// stop deletes the running managed Pods with a grace period bounded by the
// stop budget. Their controllers recreate them, gated by admission.
func (r *BerthLeaseReconciler) stop(ctx context.Context, p *observation) error {
	return r.stopPods(ctx, p, p.running)
}

// stopPods deletes pods with a grace period bounded by the stop budget.
func (r *BerthLeaseReconciler) stopPods(ctx context.Context, p *observation, pods []corev1.Pod) error {
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	for i := range pods {
		pod := &pods[i]
		grace := podGracePeriod(p.ttl, pod.Spec.TerminationGracePeriodSeconds)
		if g := pod.DeletionGracePeriodSeconds; !pod.DeletionTimestamp.IsZero() && g != nil && *g <= grace {
			continue // already going, within the budget
		}
		err := r.Delete(ctx, pod, ctrlclient.GracePeriodSeconds(grace), ctrlclient.Preconditions{UID: &pod.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("stop Pod %s: %w", pod.Name, err)
		}
		log.Info("stopping Pod", "pod", pod.Name, "gracePeriodSeconds", grace)
	}
	return nil
}

// recycle deletes the gated Pods stamped with an earlier BerthLease's UID (it
// was deleted and made anew, as a GitOps prune and sync does): they never
// ran and never may, and their controllers make them anew, stamped by
// admission with the current UID. Each delete is bound to the Pod as it was
// read, still gated.
func (r *BerthLeaseReconciler) recycle(ctx context.Context, p *observation) error {
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	for i := range p.stale {
		pod := &p.stale[i]
		err := r.Delete(ctx, pod, ctrlclient.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue // changed or gone since read; the watch brings us back
		case err != nil:
			return fmt.Errorf("recycle Pod %s: %w", pod.Name, err)
		}
		log.Info("recycled a gated Pod of an earlier BerthLease of this name", "pod", pod.Name, "uid", pod.Labels[ManagedUID])
	}
	return nil
}
