package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/process"
)

// Fault is one operation as the nemesis carried it out.
type Fault struct {
	Kind Kind
	// Cluster is the cluster acted on ("" for the lease API).
	Cluster string
	// Start and End bound the fault; End equals Start for a fault that
	// happens at once.
	Start, End time.Time
	// Skipped says why the step did nothing (the agent already down, say).
	Skipped string
	// Err is what went wrong carrying it out (a refusal, say); the fault
	// still counts as tried.
	Err string
}

func (f Fault) String() string {
	s := string(f.Kind)
	if f.Cluster != "" {
		s += " " + f.Cluster
	}
	if f.End.After(f.Start) {
		s += fmt.Sprintf(" %s-%s", f.Start.Format("15:04:05.000"), f.End.Format("15:04:05.000"))
	} else {
		s += " at " + f.Start.Format("15:04:05.000")
	}
	if f.Skipped != "" {
		s += " (skipped: " + f.Skipped + ")"
	}
	if f.Err != "" {
		s += " (" + f.Err + ")"
	}
	return s
}

// Outage is a stretch during which a cluster's agent could not act: killed
// or frozen.
type Outage struct {
	Cluster    string
	Start, End time.Time
}

// reuseName is the second BerthLease (and its Deployment) of Reuse.
func reuseName(w localfleet.Workload) string { return w.Name + "-v2" }

// Nemesis injects a schedule's faults into a fleet and heals it afterwards.
// It is used from one goroutine.
type Nemesis struct {
	Fleet    *localfleet.Fleet
	Workload localfleet.Workload
	// Berthctl is the berthctl binary for administrator releases.
	Berthctl string
	// Clients is the test clients' proxy to the lease API: cut whenever a
	// cluster is.
	Clients *localfleet.Proxy
	// Holder names the cluster running the workload now, or "".
	Holder func() string
	Logf   func(format string, args ...any)
	// Standbys are each cluster's second agent replica, when the agents run
	// with --leader-elect (StartStandbys): a Freeze then freezes whichever
	// replica leads, and the heal starts a replica that exited anew.
	Standbys map[string]*process.Process

	state  map[string]*memberState
	apiOff bool
	faults []Fault
	outs   []Outage
}

// memberState is what the nemesis has done to one cluster and not undone.
type memberState struct {
	frozen   *process.Process // the agent process it froze
	dead     bool             // the agent is killed
	down     time.Time        // since when the agent cannot act
	cut      bool
	cordoned bool
	absent   bool // the BerthLease is deleted
	reused   bool // the second BerthLease exists
}

// pendingEnd undoes a fault at due.
type pendingEnd struct {
	due   time.Time
	fault int // index into faults
	undo  func(ctx context.Context) error
}

// Run carries out the schedule's steps, undoing each fault after its Hold,
// and returns when the last is undone. Faults of the same kind on the same
// cluster do not stack: a step finding its fault in place is skipped.
func (n *Nemesis) Run(ctx context.Context, s Schedule) {
	n.reset()
	start := time.Now()
	var pending []pendingEnd
	due := start
	for i := 0; i < len(s.Steps) || len(pending) > 0; {
		next := time.Time{}
		if i < len(s.Steps) {
			next = due.Add(s.Steps[i].Wait)
		}
		slices.SortStableFunc(pending, func(a, b pendingEnd) int { return a.due.Compare(b.due) })
		if len(pending) > 0 && (next.IsZero() || !pending[0].due.After(next)) {
			p := pending[0]
			pending = pending[1:]
			sleepUntil(ctx, p.due)
			n.end(ctx, p)
			continue
		}
		sleepUntil(ctx, next)
		due = next
		if end := n.begin(ctx, s.Steps[i]); end != nil {
			pending = append(pending, *end)
		}
		i++
	}
}

// Faults returns the faults of the last Run (and its Heal).
func (n *Nemesis) Faults() []Fault { return slices.Clone(n.faults) }

// Outages returns the stretches during which an agent could not act.
func (n *Nemesis) Outages() []Outage {
	out := slices.Clone(n.outs)
	for name, st := range n.state {
		if !st.down.IsZero() {
			out = append(out, Outage{Cluster: name, Start: st.down, End: time.Now()})
		}
	}
	return out
}

func (n *Nemesis) reset() {
	n.faults, n.outs = nil, nil
	if n.state == nil {
		n.state = map[string]*memberState{}
		for _, m := range n.Fleet.Members {
			n.state[m.Name] = &memberState{}
		}
	}
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}

// target resolves a step's cluster.
func (n *Nemesis) target(st Step) *localfleet.Member {
	if st.Target == Holder {
		if m := n.Fleet.Member(n.Holder()); m != nil {
			return m
		}
	}
	return n.Fleet.Members[st.Index%len(n.Fleet.Members)]
}

// begin starts a step's fault and returns how to undo it, if it lasts.
func (n *Nemesis) begin(ctx context.Context, st Step) *pendingEnd {
	m := n.target(st)
	f := Fault{Kind: st.Kind, Cluster: m.Name, Start: time.Now()}
	ms := n.state[m.Name]
	var undo func(ctx context.Context) error
	var err error
	skip := func(why string) { f.Skipped = why }
	switch st.Kind {
	case Cordon:
		if ms.cordoned {
			skip("already cordoned")
			break
		}
		if err = n.cordon(ctx, m.Name, true); err == nil {
			ms.cordoned = true
			undo = func(ctx context.Context) error {
				ms.cordoned = false
				return n.cordon(ctx, m.Name, false)
			}
		}
	case Kill:
		if ms.dead {
			skip("agent already killed")
			break
		}
		m.StopAgent()
		ms.dead, ms.frozen = true, nil
		n.markDown(ms, f.Start)
		undo = func(context.Context) error { return n.restartAgent(m, ms) }
	case Freeze:
		if ms.dead || ms.frozen != nil {
			skip("agent already down")
			break
		}
		p := m.Agent
		if n.Standbys != nil {
			// The leader of the two replicas: the other takes over during a
			// long freeze, and the woken one must not act on what it knew.
			p = cmp.Or(m.Leader(ctx, m.Agent, n.Standbys[m.Name]), m.Agent)
		}
		if err = p.Signal(syscall.SIGSTOP); err == nil {
			ms.frozen = p
			n.markDown(ms, f.Start)
			undo = func(context.Context) error { return n.thaw(m, ms, p) }
		}
	case Cut:
		f.Cluster = m.Name
		if ms.cut {
			skip("already cut off")
			break
		}
		m.Proxy.Cut()
		n.Clients.Cut()
		ms.cut = true
		undo = func(context.Context) error {
			m.Proxy.Heal()
			ms.cut = false
			if !n.anyCut() {
				n.Clients.Heal()
			}
			return nil
		}
	case KillAPI:
		f.Cluster = ""
		if n.apiOff {
			skip("lease API already down")
			break
		}
		n.Fleet.LeaseAPI.Kill()
		n.apiOff = true
		undo = func(ctx context.Context) error { return n.restartAPI(ctx) }
	case Delete, Orphan:
		if ms.absent {
			skip("BerthLease already deleted")
			break
		}
		if err = n.deleteBerthLease(ctx, m, st.Kind == Orphan); err == nil {
			ms.absent = true
			undo = func(ctx context.Context) error {
				if err := n.ensureBerthLease(ctx, m, 5*time.Second); err != nil {
					return err
				}
				ms.absent = false
				return nil
			}
		}
	case Reuse:
		if ms.reused {
			skip("second BerthLease already there")
			break
		}
		ms.reused = true // whatever part of it was made must be removed
		err = n.reuse(ctx, m, st.Replicas)
		undo = func(ctx context.Context) error {
			if err := n.unreuse(ctx, m); err != nil {
				return err
			}
			ms.reused = false
			return nil
		}
	case Release:
		f.Cluster = ""
		err = n.release(ctx)
	case Scale:
		err = n.scale(ctx, m, st.Replicas)
	}
	if err != nil {
		f.Err = err.Error()
	}
	f.End = f.Start
	n.faults = append(n.faults, f)
	n.Logf("nemesis: %s", f)
	if undo == nil {
		return nil
	}
	return &pendingEnd{due: f.Start.Add(st.Hold), fault: len(n.faults) - 1, undo: undo}
}

func (n *Nemesis) end(ctx context.Context, p pendingEnd) {
	f := &n.faults[p.fault]
	if err := p.undo(ctx); err != nil {
		f.Err = strings.TrimPrefix(f.Err+"; undo: "+err.Error(), "; ")
	}
	f.End = time.Now()
	n.Logf("nemesis: end of %s", *f)
}

func (n *Nemesis) anyCut() bool {
	for _, st := range n.state {
		if st.cut {
			return true
		}
	}
	return false
}

func (n *Nemesis) markDown(ms *memberState, at time.Time) {
	if ms.down.IsZero() {
		ms.down = at
	}
}

func (n *Nemesis) markUp(name string, ms *memberState) {
	if !ms.down.IsZero() {
		n.outs = append(n.outs, Outage{Cluster: name, Start: ms.down, End: time.Now()})
		ms.down = time.Time{}
	}
}

func (n *Nemesis) restartAgent(m *localfleet.Member, ms *memberState) error {
	if err := m.StartAgent(m.Name); err != nil {
		return err
	}
	ms.dead = false
	n.markUp(m.Name, ms)
	return nil
}

// StartStandbys runs a second agent replica for every cluster, beside its
// Agent; the fleet's agents must run with --leader-elect.
func (n *Nemesis) StartStandbys() error {
	n.Standbys = map[string]*process.Process{}
	for _, m := range n.Fleet.Members {
		if err := n.startStandby(m); err != nil {
			return err
		}
	}
	return nil
}

func (n *Nemesis) startStandby(m *localfleet.Member) error {
	if p := n.Standbys[m.Name]; p != nil {
		p.Kill()
	}
	p, err := m.StartStandby()
	if err != nil {
		return err
	}
	n.Standbys[m.Name] = p
	return nil
}

// StopStandbys kills every standby replica.
func (n *Nemesis) StopStandbys() {
	for _, p := range n.Standbys {
		if p != nil {
			p.Kill()
		}
	}
}

// thaw continues the process it froze, unless that process was killed
// meanwhile (the kill's end starts a new one).
func (n *Nemesis) thaw(m *localfleet.Member, ms *memberState, p *process.Process) error {
	if ms.frozen != p {
		return nil
	}
	ms.frozen = nil
	err := p.Signal(syscall.SIGCONT)
	n.markUp(m.Name, ms)
	return err
}

func (n *Nemesis) restartAPI(ctx context.Context) error {
	if err := n.Fleet.LeaseAPI.Start(ctx); err != nil {
		return err
	}
	n.apiOff = false
	return nil
}

func (n *Nemesis) cordon(ctx context.Context, cluster string, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var err error
	if on {
		_, err = n.Fleet.LeaseAPI.Admin.Cordon(ctx, cluster)
	} else {
		_, err = n.Fleet.LeaseAPI.Admin.Uncordon(ctx, cluster)
	}
	return err
}

func (n *Nemesis) key() ctrlclient.ObjectKey {
	return ctrlclient.ObjectKey{Namespace: n.Workload.Namespace, Name: n.Workload.Name}
}

// deleteBerthLease deletes the member's BerthLease; with orphan, after
// removing its finalizer, so that it is gone at once.
func (n *Nemesis) deleteBerthLease(ctx context.Context, m *localfleet.Member, orphan bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	bl := &berthv1alpha1.BerthLease{}
	if err := m.Client.Get(ctx, n.key(), bl); err != nil {
		return err
	}
	if orphan && len(bl.Finalizers) > 0 {
		patch := ctrlclient.MergeFrom(bl.DeepCopy())
		bl.Finalizers = nil
		if err := m.Client.Patch(ctx, bl, patch); err != nil {
			return fmt.Errorf("remove finalizer: %w", err)
		}
	}
	return m.Client.Delete(ctx, bl)
}

// ensureBerthLease makes the member's BerthLease anew if it is gone,
// waiting up to wait for one being deleted to go.
func (n *Nemesis) ensureBerthLease(ctx context.Context, m *localfleet.Member, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		bl := &berthv1alpha1.BerthLease{}
		err := m.Client.Get(cctx, n.key(), bl)
		switch {
		case err == nil && bl.DeletionTimestamp == nil:
			cancel()
			return nil
		case apierrors.IsNotFound(err):
			bl = builders.BerthLease(n.Workload.Namespace, n.Workload.Name).TTL(n.Workload.TTLSeconds).Heartbeat(n.Workload.HeartbeatSeconds).Obj()
			err = m.Client.Create(cctx, bl)
			cancel()
			if err == nil || apierrors.IsAlreadyExists(err) {
				continue
			}
			return fmt.Errorf("make the BerthLease anew: %w", err)
		}
		cancel()
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("still being deleted")
			}
			return fmt.Errorf("BerthLease: %w", err)
		}
		sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
	}
}

// reuse makes a second BerthLease with the first's lease name and a
// Deployment whose Pods it manages, as a rename in two steps would.
func (n *Nemesis) reuse(ctx context.Context, m *localfleet.Member, replicas int32) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, name := n.Workload, reuseName(n.Workload)
	bl := builders.BerthLease(w.Namespace, name).LeaseName(w.Name).TTL(w.TTLSeconds).Heartbeat(w.HeartbeatSeconds).Obj()
	if err := m.Client.Create(ctx, bl); err != nil {
		return fmt.Errorf("create a second BerthLease of lease %s: %w", w.Name, err)
	}
	d := builders.Deployment(w.Namespace, name).ManagedBy(name).Replicas(replicas).Obj()
	if err := m.Client.Create(ctx, d); err != nil {
		return fmt.Errorf("create the second Deployment: %w", err)
	}
	return nil
}

// unreuse deletes the second Deployment and BerthLease.
func (n *Nemesis) unreuse(ctx context.Context, m *localfleet.Member) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	name := reuseName(n.Workload)
	meta := metav1.ObjectMeta{Namespace: n.Workload.Namespace, Name: name}
	var errs []error
	for _, obj := range []ctrlclient.Object{&appsv1.Deployment{ObjectMeta: meta}, &berthv1alpha1.BerthLease{ObjectMeta: meta}} {
		if err := m.Client.Delete(ctx, obj, ctrlclient.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// release frees the lease as an administrator would, with berthctl.
func (n *Nemesis) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	api := n.Fleet.LeaseAPI
	out, err := exec.CommandContext(ctx, n.Berthctl, "--server", api.URL, "--token-file", api.TokenFiles[localfleet.AdminSubject], "--timeout", "3s",
		"leases", "release", n.Workload.Namespace+"/"+n.Workload.Name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("berthctl leases release: %w: %s", err, strings.TrimSpace(string(out)))
	}
	n.Logf("nemesis: %s", strings.TrimSpace(string(out)))
	return nil
}

func (n *Nemesis) scale(ctx context.Context, m *localfleet.Member, replicas int32) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: n.Workload.Namespace, Name: n.Workload.Name}}
	return m.Client.Patch(ctx, d, ctrlclient.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)))
}

// Heal undoes whatever the schedule left: every agent running and
// reachable, the lease API up, no cluster cordoned, every BerthLease and
// Deployment as the fleet applied them, and no second BerthLease.
func (n *Nemesis) Heal(ctx context.Context) error {
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	if n.apiOff {
		note("start the lease API", n.restartAPI(ctx))
	}
	for _, m := range n.Fleet.Members {
		ms := n.state[m.Name]
		if ms.frozen != nil {
			note("thaw "+m.Name, n.thaw(m, ms, ms.frozen))
		}
		if m.Agent == nil || m.Agent.Exited() {
			note("start "+m.Name+"'s agent", n.restartAgent(m, ms))
		}
		if p, ok := n.Standbys[m.Name]; ok && (p == nil || p.Exited()) {
			// A leader frozen past the election's lease exits once it wakes.
			note("start "+m.Name+"'s standby", n.startStandby(m))
		}
		m.Proxy.Heal()
		ms.cut = false
	}
	n.Clients.Heal()
	for _, m := range n.Fleet.Members {
		ms := n.state[m.Name]
		note("uncordon "+m.Name, retry(ctx, 20*time.Second, func() error { return n.cordon(ctx, m.Name, false) }))
		ms.cordoned = false
		note("remove "+m.Name+"'s second BerthLease", n.unreuse(ctx, m))
		ms.reused = false
		note(m.Name+"'s BerthLease", n.ensureBerthLease(ctx, m, 30*time.Second))
		ms.absent = false
		note("scale "+m.Name, n.scale(ctx, m, n.Workload.Replicas))
	}
	return errors.Join(errs...)
}

// retry calls fn until it succeeds or timeout passes.
func retry(ctx context.Context, timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepUntil(ctx, time.Now().Add(300*time.Millisecond))
	}
}

// RemoveStrays deletes, in every cluster but the lease's holder at the lease
// API, the ungated managed Pods, and everywhere the Pods stamped with a
// BerthLease UID other than the current one: an operator's cleanup after a
// schedule left Pods running that no agent stops. Their controllers make
// them again, gated. It returns what it deleted.
func (n *Nemesis) RemoveStrays(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := n.Fleet.LeaseAPI.Admin.GetLease(ctx, n.Workload.Namespace, n.Workload.Name)
	if err != nil {
		return nil, err
	}
	var deleted []string
	for _, m := range n.Fleet.Members {
		bl := &berthv1alpha1.BerthLease{}
		if err := m.Client.Get(ctx, n.key(), bl); err != nil {
			return deleted, err
		}
		pods := &corev1.PodList{}
		if err := m.Client.List(ctx, pods, ctrlclient.InNamespace(n.Workload.Namespace), ctrlclient.HasLabels{reconciler.ManagedLease}); err != nil {
			return deleted, err
		}
		for _, p := range pods.Items {
			gated := slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == reconciler.SchedulingGate })
			stale := p.Labels[reconciler.ManagedUID] != string(bl.UID)
			if (gated || m.Name == l.Holder) && !stale {
				continue
			}
			if err := m.Client.Delete(ctx, &p, ctrlclient.GracePeriodSeconds(1)); err != nil && !apierrors.IsNotFound(err) {
				return deleted, err
			}
			deleted = append(deleted, m.Name+"/"+p.Name)
		}
	}
	slices.SortFunc(deleted, cmp.Compare)
	return deleted, nil
}
