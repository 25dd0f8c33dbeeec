package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi/client"
	leasemachine "github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// FuzzAgent runs two agents' memories against the lease API's own state
// machine (leaseapi/lease's Decide functions on one record), on one clock,
// as whole sequences: each reconcile gathers the facts from its memory and
// its Pod, decides, stops or ungates the Pod, sends the call the decision
// asks for and, when the answer comes, applies afterAnswer and decides
// again, exactly as settle and Reconcile do. The program injects the faults:
// a request lost before the server or an answer lost after it applied the
// request, a store failure, a request delayed past the local deadline (the
// call is cut there, the request still lands later), an administrator's
// revocation, expiry sweeps, a restart of the lease API (grace), an agent
// restart that forgets everything and recovers from status, a process
// frozen past its local deadline that runs on with stale memory, status writes
// that fail, Pods that cannot be listed, Pods that take up to their grace
// period to stop, cordons. The other agent competes for the lease, so a
// term that ends is taken over.
//
// An agent is never late: it reconciles by the wake-up its last decision
// asked for (a reconcile may come earlier, as events bring it). Past that,
// nothing is promised (an agent down longer than its validity). An agent's
// requests in flight still land after it restarts; a release is recorded in
// status before it is sent, and not sent when that write fails. A Pod that
// is gone (recreated gated) brings a reconcile, as the Pod watch does.
//
// The timing byte may run an agent's renewer (batched renewals): each agent
// is then a real BerthLeaseReconciler process on a fake clock, whose memory
// of the one BerthLease its reconciles (simulated as above, with
// Facts.BatchRenewed as observe sets it) and its renewer share. The renewer
// is the real one, renewDue, renewBatch and applyRenewal, run in a goroutine
// of its own that the sim steps: it looks when its loop would (the next look
// renewDue returns, or at once when handOver kicks it), and its batch is a
// request like any other, with the same faults, cut at the term's deadline;
// while it is in flight the reconciles go on (release, renew while stopping,
// acquire after a loss), and its answer, when it comes, is applied only to
// the term it renewed. The renewer wakes the BerthLease on news and at the
// deadline; a BerthLease running under it is reconciled on those wake-ups,
// on events and on the wake-ups its decisions ask for (none while it runs).
// Its reconcile hands the term over at its end (batchSpecFor, handOver),
// unless it fails first (a status write). A restart ends the process and its
// renewer with it; a batch in flight still lands. A lease API that offers no
// batches (a store fault's draw) stops the renewer.
//
// Checked at every decision: the invariants of TestDecide. Over the whole
// sequence:
//   - an agent's Pod runs (from its ungating until its grace period ends)
//     only while the lease API's record has that agent as holder, unexpired:
//     no other cluster could be granted the lease meanwhile;
//   - whenever an agent may run, the record holds its term's token and
//     expires no earlier than the local deadline plus the stop budget;
//   - a release is sent only when its Pod is gone;
//   - every token renewed, recovered or released was granted to that agent;
//   - the tokens written on ungated Pods never go back;
//   - no Pod runs past the last local deadline its agent's memory gave its
//     token, plus the stop budget and the drift margin;
//   - the renewer renews only the term the memory holds, while it is handed
//     over, granted to the agent, handed over by a reconcile (or left to it
//     by one that failed), due or within half a heartbeat of it, and before
//     its deadline; a reconcile hands over its own BerthLease's spec;
//   - a renewal the renewer applies while no call of the reconcile is in
//     flight is backed by the record to its deadline and the stop budget;
//   - healed (faults off, cordons lifted), one agent runs its Pod within a
//     few TTLs.
func FuzzAgent(f *testing.F) {
	// The first byte picks the timing; then each operation is a byte (and
	// the bytes its reconciles and calls draw). Zeros are a quiet fleet.
	f.Add([]byte{0, 0, 40, 0, 40, 0, 40})
	f.Add([]byte{1, 0, 60, 7, 0, 60, 0, 60})                // a restart of the holder's agent
	f.Add([]byte{2, 0, 30, 4, 0, 30, 0, 90})                // a revocation
	f.Add([]byte{0, 0, 20, 3, 0, 0x1c, 0, 0, 200})          // a renew lost after the server
	f.Add([]byte{1, 0, 20, 3, 0, 0x07, 0xff, 0, 200, 0, 9}) // a renew delayed past the deadline
	f.Add([]byte{2, 0, 20, 8, 0, 50, 18, 0, 100})           // a cordon
	f.Add([]byte{0, 0, 20, 13, 0x3f, 0, 200, 6, 0, 90})     // Pods unknown, a lease API restart
	// Timing bytes with 8 (cluster-a) or 16 (cluster-b) run the renewer.
	f.Add([]byte{24, 0, 40, 0, 40, 0, 40})                                        // batching on, quiet
	f.Add([]byte{0x18, 0x0, 0x75, 0xa9, 0x11, 0x0, 0xc2, 0x47, 0x0, 0xed})        // a batch's answer lost after the server renewed
	f.Add([]byte{0x1e, 0xc8, 0xc2, 0xdc, 0x0, 0x5b, 0x0, 0xe6, 0xe7, 0x97, 0x7b}) // a batch cut at the deadline lands after the release and the next term
	f.Add([]byte{0x1f, 0x49, 0x0, 0x0, 0x42, 0x0, 0x0, 0x1f, 0x0, 0x44})          // a revocation answered in a batch
	f.Add([]byte{0x1e, 0xe3, 0x0, 0x0, 0x35, 0x74, 0x84, 0xd7, 0xf, 0x7d, 0x0, 0x1a, 0x2f, 0x0, 0xe4, 0xca,
		0xd0, 0xdd, 0x24, 0x0, 0x0, 0x48, 0xff, 0x7}) // a restart with a batch in flight
	f.Add([]byte{0x1f, 0x0, 0x0, 0x27, 0xe9, 0x0, 0xca, 0x28, 0x21, 0xf, 0xf4, 0x31, 0xe6, 0x74, 0xb6, 0x0,
		0x0, 0x65, 0xe0, 0x0, 0x0, 0xd0, 0x0, 0x1, 0x56, 0x0, 0x1e, 0x0, 0xd2, 0x0}) // a release sent while a batch is in flight
	f.Add([]byte{0x18, 0x0, 0x28, 0xc, 0x8c, 0x0, 0x34, 0x0, 0x24, 0x0, 0x4d, 0x0, 0x30, 0x0, 0x1c, 0x0, 0x34}) // the holder frozen, revoked meanwhile
	f.Add([]byte{0x18, 0x0, 0x28, 0x0, 0x26, 0x0, 0x1d, 0x0, 0x37, 0x0, 0x35, 0xc, 0x23, 0x0, 0x3c, 0x0, 0x34}) // a process frozen, running on with stale memory
	f.Fuzz(func(t *testing.T, program []byte) {
		if len(program) == 0 {
			return
		}
		s := newFleetSim(t, program)
		defer s.close()
		s.run()
	})
}

// Faults of one call.
const (
	faultLostBefore = 4 // the request never reaches the server
	faultLostAfter  = 5 // the server applies it, the answer is lost
	faultStore      = 6 // the server answers 500 without applying it
	faultDelayed    = 7 // the request lands late, maybe after the call was cut
)

var (
	errSimLost  = errors.New("connection reset by peer")
	errSimStore = errors.New("lease API: 500 internal error")
)

// byteSource hands out a program's bytes, then zeros.
type byteSource struct {
	b []byte
	i int
}

func (s *byteSource) next() byte {
	if s.i >= len(s.b) {
		return 0
	}
	s.i++
	return s.b[s.i-1]
}

func (s *byteSource) done() bool { return s.i >= len(s.b) }

// simPod is an agent's one managed Pod.
type simPod int

const (
	podGated simPod = iota
	podRunning
	// podStopping: deleted; its containers run until killAt.
	podStopping
)

// simCall is a lease API call in flight.
type simCall struct {
	agent int
	req   request
	// arrives: the request reaches the server, at arrival.
	arrives bool
	arrival time.Time
	// answerAt is when the caller learns the outcome; cut: the call's
	// context ended first.
	answerAt time.Time
	cut      bool
	// fault is the call's fault; err the error the caller sees when the
	// server does not answer.
	fault int
	err   error
	// res and srvErr are the server's answer once it landed.
	res    client.AcquireResult
	srvErr error
	// batch: the renewer's batch, not a reconcile's call; unsupported: the
	// lease API answers that it offers no batches (a store fault's draw).
	batch, unsupported bool
}

type simAgent struct {
	holder string
	// batches: the agent's renewer runs (the program's choice), so running
	// terms are renewed in batches.
	batches bool
	// proc is the agent's process: its reconciler, whose memory of the one
	// BerthLease (mem) the renewer and the reconciles share, on clock; br is
	// its lease client as the renewer sees it; renewer is the renewer's
	// state while it runs (nil: it does not).
	proc    *BerthLeaseReconciler
	clock   *clocktesting.FakeClock
	br      *simBatcher
	bl      *berthv1alpha1.BerthLease
	mem     *memory
	renewer *simRenewer
	// status is what the last status write was computed from.
	status   statusInput
	cordoned bool
	pod      simPod
	killAt   time.Time
	// frozenUntil: the process is stopped (SIGSTOP) until then.
	frozenUntil time.Time
	// podToken is the token written on the running Pod.
	podToken int32
	// wake: the agent reconciles by then (when no call is in flight); zero
	// for never (a running term under the renewer, which wakes it).
	wake    time.Time
	pending *simCall
	// woken: the renewer woke the BerthLease while its reconcile waited on a
	// call; it is reconciled again when that reconcile ends.
	woken bool
	// handed are the tokens of the terms the reconciles of this process
	// handed to the renewer; specLeft: since the last hand-over, a reconcile
	// ended before it could hand over or take back (its status write failed),
	// so the renewer still renews whatever term the memory holds.
	handed   map[int32]bool
	specLeft bool
	// validUntil is, for each token, the latest local deadline the agent's
	// memory gave it (a term's, or a recovery's): its Pods stop within the
	// stop budget after it.
	validUntil map[int32]time.Time
	// releasing is the release recorded in status before it was sent
	// (recordRelease), until the next status write replaces it.
	releasing int32
	// the current reconcile's draws.
	podsUnknown, statusFails bool
	killDelay                time.Duration
	// granted are the tokens the server granted this agent.
	granted map[int32]bool
	// releaseSent are the tokens the agent sent a release of.
	releaseSent map[int32]bool
}

type fleetSim struct {
	t        *testing.T
	src      *byteSource
	ttl, hb  time.Duration
	now      time.Time
	cur      store.Lease
	agents   []*simAgent
	inflight []*simCall
	// lastRunToken is the highest token written on an ungated Pod.
	lastRunToken int32
	events       int
	program      []byte
	tracing      bool
	trace        []string
}

func newFleetSim(t *testing.T, program []byte) *fleetSim {
	src := &byteSource{b: program}
	first := src.next()
	ttl := []time.Duration{3 * time.Second, 6 * time.Second, 30 * time.Second}[int(first)%3]
	hb := ttl / 3
	if first&4 != 0 {
		hb = max(time.Second, ttl/10)
	}
	s := &fleetSim{t: t, program: program, src: src, ttl: ttl, hb: hb, now: t0, cur: store.Lease{Namespace: "ns", Name: "lease"}}
	for i, h := range []string{"cluster-a", "cluster-b"} {
		a := &simAgent{holder: h, wake: t0, granted: map[int32]bool{}, releaseSent: map[int32]bool{}, validUntil: map[int32]time.Time{}}
		a.batches = first&(8<<i) != 0
		s.agents = append(s.agents, a)
		s.startProcess(a)
	}
	return s
}

// simBatcher is an agent's lease client as its renewer sees it: RenewBatch
// hands the batch to the sim and waits for the sim's answer (the request
// itself is the sim's to land at the lease API, or lose).
type simBatcher struct {
	LeaseClient
	sent   chan []client.Renewal
	answer chan simBatchAnswer
	// quit ends a batch in flight when the process ends.
	quit chan struct{}
	// woken: the reconciler asked for its BerthLease to be reconciled.
	mu    sync.Mutex
	woken bool
}

type simBatchAnswer struct {
	res []client.AcquireResult
	err error
}

// RenewBatch ignores ctx: the sim cuts the call at the deadline itself, on
// its own clock.
func (b *simBatcher) RenewBatch(_ context.Context, _ string, renewals []client.Renewal) ([]client.AcquireResult, error) {
	b.sent <- renewals
	select {
	case ans := <-b.answer:
		return ans.res, ans.err
	case <-b.quit:
		return nil, errSimLost
	}
}

func (b *simBatcher) wake(context.Context, types.NamespacedName) {
	b.mu.Lock()
	b.woken = true
	b.mu.Unlock()
}

func (b *simBatcher) takeWoken() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.woken
	b.woken = false
	return w
}

// simRenewer is an agent's renewer, the loop of renew: at next it looks
// (renewDue, in a goroutine of its own); a batch it sends is in flight
// until its answer, and the goroutine waits in RenewBatch meanwhile.
type simRenewer struct {
	ctx    context.Context
	cancel context.CancelFunc
	next   time.Time
	batch  *simCall
	// done receives renewDue's next look when it returns.
	done chan time.Time
}

// startProcess starts an agent's process: a reconciler that remembers
// nothing, with its renewer running when the agent batches its renewals.
func (s *fleetSim) startProcess(a *simAgent) {
	a.clock = clocktesting.NewFakeClock(s.now)
	a.br = &simBatcher{sent: make(chan []client.Renewal), answer: make(chan simBatchAnswer), quit: make(chan struct{})}
	a.proc = &BerthLeaseReconciler{LeaseClient: a.br, Clock: a.clock, ClusterIdentity: a.holder, Wake: a.br.wake}
	a.proc.defaults()
	a.bl = &berthv1alpha1.BerthLease{Spec: berthv1alpha1.BerthLeaseSpec{
		LeaseName: s.cur.Name, TTLSeconds: int32(s.ttl / time.Second), HeartbeatIntervalSeconds: int32(s.hb / time.Second),
	}}
	a.bl.Namespace, a.bl.Name, a.bl.UID = s.cur.Namespace, "bl-"+a.holder, types.UID("uid-"+a.holder)
	a.mem = a.proc.memoryOf(a.bl)
	a.handed, a.specLeft, a.woken, a.renewer = map[int32]bool{}, false, false, nil
	if a.batches {
		a.proc.renewals.running.Store(true)
		ctx, cancel := context.WithCancel(context.Background())
		a.renewer = &simRenewer{ctx: ctx, cancel: cancel, next: s.now, done: make(chan time.Time, 1)}
	}
}

// stopProcess ends an agent's process: its renewer returns, a batch in
// flight with it unanswered (its request may still land).
func (s *fleetSim) stopProcess(a *simAgent) {
	rn := a.renewer
	if rn == nil {
		return
	}
	a.renewer = nil
	rn.cancel()
	if rn.batch != nil {
		s.note(func() string {
			return fmt.Sprintf("%s: process ends with a batch renewing token %d in flight", a.holder, rn.batch.req.token)
		})
		close(a.br.quit)
		<-rn.done
	}
}

// close ends every agent's process.
func (s *fleetSim) close() {
	for _, a := range s.agents {
		s.stopProcess(a)
	}
}

// simTraceLines is how much of the trace a failure shows.
var simTraceLines = 80

// maxEvents bounds one run.
const maxEvents = 3000

func (s *fleetSim) run() {
	for !s.src.done() && s.events < maxEvents {
		op := s.src.next()
		who := int(op/16) % len(s.agents)
		switch op % 16 {
		case 0, 1, 2, 9, 10, 11:
			s.advance(s.now.Add(time.Duration(s.src.next()) * s.ttl / 64))
		case 3:
			if s.agents[who].pending == nil && !s.now.Before(s.agents[who].frozenUntil) {
				s.note(func() string { return fmt.Sprintf("%s: woken early", s.agents[who].holder) })
				s.reconcile(who)
			}
		case 4:
			s.serverRevoke()
		case 5:
			s.serverApply(func() string { return "sweep" }, leasemachine.DecideExpire(s.cur, s.now), nil)
		case 6:
			s.serverApply(func() string { return "restart grace" }, leasemachine.DecideGrace(s.cur, s.now), nil)
		case 7:
			s.restartAgent(who)
		case 8:
			a := s.agents[who]
			a.cordoned = !a.cordoned
			s.note(func() string { return fmt.Sprintf("%s: cordoned %v", a.holder, a.cordoned) })
		case 12:
			s.freeze(who, s.src.next())
		}
	}
	// Heal: no more faults, no cordons; someone must run within a few TTLs.
	s.src = &byteSource{}
	for _, a := range s.agents {
		a.cordoned = false
	}
	s.advance(s.now.Add(5 * s.ttl))
	if s.events >= maxEvents {
		return
	}
	for _, a := range s.agents {
		if a.pod == podRunning {
			return
		}
	}
	s.fail("healed for five TTLs, yet no agent runs its Pod (record %+v)", s.cur)
}

// note records a line of the trace, only while tracing (a failing
// program runs again with tracing on).
func (s *fleetSim) note(line func() string) {
	if s.tracing {
		s.trace = append(s.trace, fmt.Sprintf("+%-9v ", s.now.Sub(t0))+line())
	}
}

func (s *fleetSim) fail(format string, args ...any) {
	s.t.Helper()
	if !s.tracing {
		again := newFleetSim(s.t, s.program)
		defer again.close()
		again.tracing = true
		again.run()
		s.t.Fatalf("at +%v (ttl %v, heartbeat %v): %s (not again with tracing on)", s.now.Sub(t0), s.ttl, s.hb, fmt.Sprintf(format, args...))
	}
	tail := s.trace
	if len(tail) > simTraceLines {
		tail = tail[len(tail)-simTraceLines:]
	}
	s.t.Fatalf("at +%v (ttl %v, heartbeat %v): %s\ntrace:\n%s", s.now.Sub(t0), s.ttl, s.hb, fmt.Sprintf(format, args...), strings.Join(tail, "\n"))
}

// Events, in the order they happen at one instant.
const (
	evKill = iota
	evArrival
	evAnswer
	evBatchAnswer
	evLook
	evWake
	evNone
)

func (s *fleetSim) nextEvent() (time.Time, int, int) {
	at, kind, idx := time.Time{}, evNone, 0
	consider := func(t time.Time, k, i int) {
		if kind == evNone || t.Before(at) || (t.Equal(at) && k < kind) {
			at, kind, idx = t, k, i
		}
	}
	for i, a := range s.agents {
		if a.pod == podStopping {
			consider(a.killAt, evKill, i) // the kubelet's, not the agent's
		}
		// A frozen process does nothing, and learns nothing, until it resumes.
		process := func(t time.Time, k int) { consider(latest(t, a.frozenUntil), k, i) }
		if rn := a.renewer; rn != nil && rn.batch != nil {
			process(rn.batch.answerAt, evBatchAnswer)
		} else if rn != nil {
			process(rn.next, evLook)
		}
		if a.pending != nil {
			process(a.pending.answerAt, evAnswer)
		} else if !a.wake.IsZero() {
			process(a.wake, evWake)
		}
	}
	for i, c := range s.inflight {
		consider(c.arrival, evArrival, i)
	}
	return at, kind, idx
}

// advance moves the clock to target, handling every event due on the way.
func (s *fleetSim) advance(target time.Time) {
	for s.events < maxEvents {
		at, kind, idx := s.nextEvent()
		if kind == evNone || at.After(target) {
			s.checkPods(target)
			s.now = target
			return
		}
		if at.Before(s.now) {
			at = s.now
		}
		s.checkPods(at)
		s.now = at
		s.events++
		switch kind {
		case evKill:
			a := s.agents[idx]
			a.pod, a.killAt, a.podToken = podGated, time.Time{}, 0
			s.note(func() string { return fmt.Sprintf("%s: Pod gone (recreated gated)", a.holder) })
			// The Pod watch brings the BerthLease.
			s.bring(idx)
		case evArrival:
			c := s.inflight[idx]
			s.inflight = append(s.inflight[:idx], s.inflight[idx+1:]...)
			s.land(c)
		case evAnswer:
			s.answer(idx)
		case evBatchAnswer:
			s.batchAnswer(idx)
		case evLook:
			s.look(idx)
		case evWake:
			s.reconcile(idx)
		}
	}
}

// checkPods checks that every Pod whose containers may run from now until
// until runs under the record's live term of its own cluster.
func (s *fleetSim) checkPods(until time.Time) {
	for _, a := range s.agents {
		end := until
		switch a.pod {
		case podGated:
			continue
		case podStopping:
			if a.killAt.Before(end) {
				end = a.killAt
			}
		}
		if !end.After(s.now) && a.pod == podStopping {
			continue
		}
		if s.cur.Holder != a.holder || end.After(s.cur.ExpiresAt) {
			s.fail("%s's Pod (%v, token %d) runs until %v, but the record is %q token %d until %v: another cluster may be granted the lease meanwhile",
				a.holder, a.pod, a.podToken, end.Sub(t0), s.cur.Holder, s.cur.FencingToken, s.cur.ExpiresAt.Sub(t0))
		}
		// The stop budget, and the drift margin: at the shortest TTL a Pod's
		// grace period is the whole stop budget, so a stop that starts a
		// little after the deadline (the renewer's wake-up) ends in it.
		if valid := a.validUntil[a.podToken]; end.After(valid.Add(s.ttl - LocalValidity(s.ttl))) {
			s.fail("%s's Pod (%v, token %d) runs until %v, past the token's last local deadline %v plus the stop budget and drift margin",
				a.holder, a.pod, a.podToken, end.Sub(t0), valid.Sub(t0))
		}
	}
}

// observe is observe's part of the memory: recovery, self-fencing, facts.
func (s *fleetSim) observe(i int) Facts {
	a := s.agents[i]
	if !a.mem.read().started {
		// The term's last renewal, as the lease API's record has it
		// (lastRenewal), when the record still shows the term status names.
		st := a.statusNow()
		var renewedAt time.Time
		if st.LeaseState == StateHeld && st.CurrentHolder == a.holder && s.cur.Holder == a.holder && s.cur.FencingToken == st.FencingToken {
			renewedAt = s.cur.RenewedAt
		}
		a.mem.update(func(t tenure) tenure { return t.recoverFromStatus(st, a.holder, s.ttl, renewedAt, s.now) })
		s.noteValid(a)
	}
	var fenced bool
	t := a.mem.update(func(t tenure) tenure {
		t, fenced = t.checkDeadline(s.now)
		return t
	})
	if fenced {
		s.note(func() string { return fmt.Sprintf("%s: self-fenced (token %d)", a.holder, t.term.Token) })
	}
	// A failed list knows no Pods at all (listPods).
	f := Facts{Now: s.now, Cordoned: a.cordoned, PodsUnknown: a.podsUnknown, BatchRenewed: a.proc.batching()}
	switch {
	case a.podsUnknown:
	case a.pod == podGated:
		f.GatedPods = 1
	default:
		f.RunningPods = 1
	}
	return t.intoFacts(f)
}

// decide is Decide, checked against the invariants.
func (s *fleetSim) decide(i int, f Facts) Decision {
	a := s.agents[i]
	d := Decide(f)
	if v := violations(f, d); len(v) > 0 {
		s.fail("%s: Decide(%s) = %+v breaks invariants:\n%s", a.holder, describe(f), d, strings.Join(v, "\n"))
	}
	if f.MayRun() {
		if s.cur.Holder != a.holder || s.cur.FencingToken != f.Term.Token {
			s.fail("%s may run with token %d, but the record is %q token %d", a.holder, f.Term.Token, s.cur.Holder, s.cur.FencingToken)
		}
		if end := f.Term.Deadline.Add(StopBudget(s.ttl)); end.After(s.cur.ExpiresAt) {
			s.fail("%s may run until %v plus the stop budget, %v, after the record expires at %v", a.holder, f.Term.Deadline.Sub(t0), end.Sub(t0), s.cur.ExpiresAt.Sub(t0))
		}
	}
	return d
}

// reconcile is Reconcile up to the call (settle's first half).
func (s *fleetSim) reconcile(i int) {
	a := s.agents[i]
	b := s.src.next()
	a.podsUnknown = b%8 == 7
	a.statusFails = (b/8)%8 == 7
	grace := time.Duration(podGracePeriod(s.ttl, nil)) * time.Second
	a.killDelay = time.Duration(b/64) * grace / 3
	f := s.observe(i)
	d := s.decide(i, f)
	s.note(func() string { return fmt.Sprintf("%s: %s -> %+v", a.holder, describe(f), d) })
	s.stop(i, d)
	switch {
	case d.DropTerm:
		a.mem.update(func(t tenure) tenure {
			t, _ = t.dropTerm()
			return t
		})
		s.finish(i, s.observe(i))
	case d.Call == CallRelease && a.statusFails:
		// recordRelease failed: the release is not sent.
		s.note(func() string { return fmt.Sprintf("%s: release not sent (recording it in status failed)", a.holder) })
		s.finishWith(i, f, d)
	case d.Call != CallNone:
		s.send(i, d.Call)
	default:
		s.finishWith(i, f, d)
	}
}

func (s *fleetSim) stop(i int, d Decision) {
	a := s.agents[i]
	if d.Pods != PodsStop || a.pod != podRunning {
		return
	}
	a.pod, a.killAt = podStopping, s.now.Add(a.killDelay)
	s.note(func() string { return fmt.Sprintf("%s: Pod stopping until +%v", a.holder, a.killAt.Sub(t0)) })
}

// send is call up to the request.
func (s *fleetSim) send(i int, c Call) {
	a := s.agents[i]
	mem := a.mem.read()
	token := mem.tokenFor(c)
	if c != CallAcquire && !a.granted[token] {
		s.fail("%s presents token %d to %s, never granted to it", a.holder, token, callName(c))
	}
	if c == CallRelease && a.pod != podGated {
		s.fail("%s releases token %d while its Pod may run", a.holder, token)
	}
	if c == CallRelease {
		a.releasing = token
		a.releaseSent[token] = true
		if a.renewer != nil && a.renewer.batch != nil {
			s.note(func() string { return fmt.Sprintf("%s: release sent while a batch is in flight", a.holder) })
		}
	}
	req := request{call: c, holder: a.holder, token: token, ttl: s.ttl, heartbeat: s.hb, sent: s.now}
	call := s.flight(i, req, mem.callDeadline())
	a.pending = call
	s.note(func() string {
		return fmt.Sprintf("%s: sends %s token %d (fault %d, arrives %v at +%v, answer at +%v, cut %v)",
			a.holder, callName(c), token, call.fault, call.arrives, call.arrival.Sub(t0), call.answerAt.Sub(t0), call.cut)
	})
}

// flight is a request on its way, with the faults the program draws for
// it; the call is cut after DefaultCallTimeout, or at deadline if sooner.
func (s *fleetSim) flight(i int, req request, deadline time.Time) *simCall {
	cut := s.now.Add(DefaultCallTimeout)
	if s.now.Before(deadline) && deadline.Before(cut) {
		cut = deadline
	}
	b1, b2 := s.src.next(), s.src.next()
	step := s.ttl / 64
	d1, d2 := time.Duration(b1/8%8)*step, time.Duration(b2%8)*step
	call := &simCall{agent: i, req: req, fault: int(b1 % 8), arrives: true, arrival: s.now.Add(d1)}
	// A batch of a lease API of an earlier release: 404, nothing applied.
	call.unsupported = call.fault == faultStore && b2 >= 0xf0
	call.answerAt = call.arrival.Add(d2)
	switch call.fault {
	case faultLostBefore:
		call.arrives, call.err, call.answerAt = false, errSimLost, s.now.Add(d1)
	case faultStore:
		call.arrives, call.err = false, errSimStore
	case faultLostAfter:
		call.err = errSimLost
	case faultDelayed:
		call.arrival = call.arrival.Add(time.Duration(b2/8) * s.ttl / 8)
		call.answerAt = call.arrival.Add(d2)
	}
	if !call.answerAt.Before(cut) {
		call.answerAt, call.cut = cut, true
	}
	if call.arrives {
		s.inflight = append(s.inflight, call)
	}
	return call
}

// land applies a request at the server when it arrives.
func (s *fleetSim) land(c *simCall) {
	r := c.req
	var (
		d   leasemachine.Decision
		err error
	)
	switch r.call {
	case CallAcquire:
		d, err = leasemachine.DecideAcquire(s.cur, r.holder, r.ttl, s.now)
	case CallRenew, CallRecover:
		d = leasemachine.DecideRenew(s.cur, r.holder, r.token, r.ttl, s.now)
	case CallRelease:
		d, err = leasemachine.DecideRelease(s.cur, r.holder, r.token, s.now)
		if errors.Is(err, leasemachine.ErrNotHolder) {
			err = fmt.Errorf("release: %w", client.ErrConflict)
		}
	}
	c.srvErr = err
	if c.batch && s.agents[c.agent].releaseSent[r.token] {
		s.note(func() string {
			return fmt.Sprintf("%s's batch lands after a release of token %d was sent", r.holder, r.token)
		})
	}
	c.res = client.AcquireResult{
		Acquired: d.Held(), Holder: d.Next.Holder, FencingToken: d.Next.FencingToken,
		AcquiredAt: d.Next.AcquiredAt, RenewedAt: d.Next.RenewedAt, ExpiresAt: d.Next.ExpiresAt, Revoked: d.Next.Revoked,
	}
	if d.Outcome == leasemachine.OutcomeAcquired {
		s.agents[c.agent].granted[d.Next.FencingToken] = true
	}
	s.serverApply(func() string { return fmt.Sprintf("%s by %s token %d", callName(r.call), r.holder, r.token) }, d, err)
}

func (s *fleetSim) serverApply(what func() string, d leasemachine.Decision, err error) {
	if d.Write {
		s.cur = d.Next
	}
	s.note(func() string {
		return fmt.Sprintf("server: %s -> %s (err %v); record %q token %d until +%v revoked %v", what(), d.Outcome, err, s.cur.Holder, s.cur.FencingToken, s.cur.ExpiresAt.Sub(t0), s.cur.Revoked)
	})
}

func (s *fleetSim) serverRevoke() {
	d, err := leasemachine.DecideRevoke(s.cur, s.cur.Holder, s.cur.FencingToken, s.now)
	s.serverApply(func() string { return "administrator's revoke" }, d, err)
}

// answer is the rest of settle and Reconcile, once the call's outcome is
// known.
func (s *fleetSim) answer(i int) {
	a := s.agents[i]
	c := a.pending
	a.pending = nil
	var (
		res client.AcquireResult
		err error
	)
	switch {
	case c.cut:
		err = context.DeadlineExceeded
	case c.err != nil:
		err = c.err
	default:
		res, err = c.res, c.srvErr
	}
	var o outcome
	a.mem.update(func(t tenure) tenure {
		t, o = t.afterAnswer(c.req, res, err, s.now)
		return t
	})
	s.noteValid(a)
	s.note(func() string {
		return fmt.Sprintf("%s: %s answered %+v err %v -> change %d", a.holder, callName(c.req.call), res, err, o.change)
	})
	s.finish(i, s.observe(i))
}

// finish decides again on fresh facts, stops, writes status, ungates.
func (s *fleetSim) finish(i int, f Facts) {
	d := s.decide(i, f)
	s.note(func() string { return fmt.Sprintf("%s: %s -> %+v", s.agents[i].holder, describe(f), d) })
	s.stop(i, d)
	s.finishWith(i, f, d)
}

// finishWith is the end of Reconcile: the hand-over of a running term to
// the renewer (right after settle, before anything that can fail), the
// wake-up (result), the status write and ungating.
func (s *fleetSim) finishWith(i int, f Facts, d Decision) {
	a := s.agents[i]
	spec := a.proc.batchSpecFor(a.bl, &observation{facts: f, holder: a.holder, ttl: s.ttl, heartbeat: s.hb}, a.mem, d)
	if spec != nil && (spec.holder != a.holder || spec.ttl != s.ttl || spec.heartbeat != s.hb || spec.namespace != s.cur.Namespace || spec.lease != s.cur.Name) {
		s.fail("%s hands over its term with the spec %+v, not its BerthLease's", a.holder, *spec)
	}
	handed := a.proc.handOver(a.mem, spec)
	a.specLeft = false
	if handed {
		a.handed[f.Term.Token] = true
		s.note(func() string { return fmt.Sprintf("%s: term token %d handed to the renewer", a.holder, f.Term.Token) })
	}
	s.kicked(i)

	wake := d.Wake
	switch {
	case !wake.IsZero():
	case a.statusFails:
		// The reconcile fails: retried with failureBackoff.
		wake = s.now.Add(stopPollInterval)
	case f.MayRun() && f.BatchRenewed && !handed:
		// The renewer ended after the facts were taken (result).
		wake = earliest(f.Term.RenewDue, f.Term.Deadline)
	case f.MayRun() && f.BatchRenewed && !f.PodsUnknown:
		// The renewer wakes the BerthLease on news and at the deadline;
		// nothing else is scheduled (result).
	default:
		wake = s.now.Add(s.hb)
	}
	if !wake.IsZero() {
		wake = latest(wake, s.now.Add(10*time.Millisecond))
	}
	if a.woken {
		wake, a.woken = s.now, false
	}
	a.wake = wake
	if a.statusFails {
		s.note(func() string { return fmt.Sprintf("%s: status write failed", a.holder) })
		return
	}
	// The status is computed when a restarted agent reads it: what recovery
	// reads of it does not depend on the status before.
	a.status = statusInput{generation: 1, holder: a.holder, facts: f, decision: d, tenure: a.mem.read()}
	a.releasing = 0
	if d.Pods == PodsUngate && a.pod == podGated && s.now.Before(f.Term.Deadline) {
		if f.Term.Token < s.lastRunToken {
			s.fail("%s ungates with token %d after token %d ran", a.holder, f.Term.Token, s.lastRunToken)
		}
		s.lastRunToken = f.Term.Token
		a.pod, a.podToken = podRunning, f.Term.Token
		s.note(func() string { return fmt.Sprintf("%s: Pod ungated with token %d", a.holder, a.podToken) })
	}
}

// kicked makes an idle renewer look at once when a term was handed to it
// (handOver's kick); a renewer waiting on a batch finds the kick after it.
func (s *fleetSim) kicked(i int) {
	a := s.agents[i]
	if a.renewer == nil || a.renewer.batch != nil {
		return
	}
	select {
	case <-a.proc.renewals.kick:
		a.renewer.next = s.now
	default:
	}
}

// look is one round of the renewer's loop (renewDue): it wakes the
// BerthLease whose deadline passed, and sends a batch when the term is due.
func (s *fleetSim) look(i int) {
	a := s.agents[i]
	rn := a.renewer
	a.clock.SetTime(s.now)
	go func() { rn.done <- a.proc.renewDue(rn.ctx, a.br, a.proc.Log) }()
	select {
	case renewals := <-a.br.sent:
		s.sendBatch(i, renewals)
	case next := <-rn.done:
		s.looked(i, next)
	}
}

// sendBatch is renewBatch up to the request: the renewer sends the term's
// renewal, never past its local deadline.
func (s *fleetSim) sendBatch(i int, renewals []client.Renewal) {
	a := s.agents[i]
	mem := a.mem.read()
	if len(renewals) != 1 {
		s.fail("%s's renewer sends %d renewals, for one BerthLease", a.holder, len(renewals))
	}
	rn := renewals[0]
	a.mem.mu.Lock()
	spec := a.mem.batch
	a.mem.mu.Unlock()
	switch {
	case spec == nil:
		s.fail("%s's renewer renews token %d, which is not handed to it", a.holder, rn.FencingToken)
	case mem.term == nil || mem.term.Token != rn.FencingToken:
		s.fail("%s's renewer renews token %d, not the term the memory holds (%+v)", a.holder, rn.FencingToken, mem.term)
	case !a.granted[rn.FencingToken]:
		s.fail("%s's renewer renews token %d, never granted to it", a.holder, rn.FencingToken)
	case !a.handed[rn.FencingToken] && !a.specLeft:
		s.fail("%s's renewer renews token %d, a term no reconcile handed to it", a.holder, rn.FencingToken)
	case rn.Namespace != s.cur.Namespace || rn.Name != s.cur.Name || rn.TTL != s.ttl:
		s.fail("%s's renewer renews %+v, not its BerthLease's lease", a.holder, rn)
	case !s.now.Before(mem.term.Deadline) || s.now.Before(mem.term.RenewDue.Add(-s.hb/2)):
		s.fail("%s's renewer renews token %d at +%v, due at +%v, deadline at +%v", a.holder, rn.FencingToken, s.now.Sub(t0), mem.term.RenewDue.Sub(t0), mem.term.Deadline.Sub(t0))
	}
	req := request{call: CallRenew, holder: a.holder, token: rn.FencingToken, ttl: rn.TTL, heartbeat: s.hb, sent: s.now}
	call := s.flight(i, req, mem.term.Deadline)
	call.batch = true
	a.renewer.batch = call
	s.note(func() string {
		return fmt.Sprintf("%s: renewer sends a batch renewing token %d (fault %d, arrives %v at +%v, answer at +%v, cut %v, unsupported %v)",
			a.holder, rn.FencingToken, call.fault, call.arrives, call.arrival.Sub(t0), call.answerAt.Sub(t0), call.cut, call.unsupported)
	})
}

// batchAnswer is the rest of renewBatch: the answer applied to the term, if
// it is still the memory's (applyRenewal), and the wake-up on news.
func (s *fleetSim) batchAnswer(i int) {
	a := s.agents[i]
	rn := a.renewer
	c := rn.batch
	rn.batch = nil
	var ans simBatchAnswer
	switch {
	case c.unsupported:
		ans.err = fmt.Errorf("renew batch: %w", client.ErrNotSupported)
	case c.cut:
		ans.err = context.DeadlineExceeded
	case c.err != nil:
		ans.err = c.err
	case c.srvErr != nil:
		ans.err = c.srvErr
	default:
		ans.res = []client.AcquireResult{c.res}
	}
	before := a.mem.read()
	a.clock.SetTime(s.now)
	a.br.answer <- ans
	next := <-rn.done
	after := a.mem.read()
	s.noteValid(a)
	s.note(func() string {
		return fmt.Sprintf("%s: batch renewing token %d answered %+v err %v; applied %v (term %+v)",
			a.holder, c.req.token, ans.res, ans.err, after.term != before.term || after.apiErr != before.apiErr, after.term)
	})
	if t := after.term; t != nil && t != before.term && a.pending == nil && !after.revoked && after.releaseSent == 0 && s.now.Before(t.Deadline) {
		// A renewal applied while no call of the reconcile is in flight: the
		// record backs the term it gives, to its deadline and the stop budget.
		if s.cur.Holder != a.holder || s.cur.FencingToken != t.Token || t.Deadline.Add(StopBudget(s.ttl)).After(s.cur.ExpiresAt) {
			s.fail("%s's renewer applied token %d until +%v, but the record is %q token %d until +%v",
				a.holder, t.Token, t.Deadline.Sub(t0), s.cur.Holder, s.cur.FencingToken, s.cur.ExpiresAt.Sub(t0))
		}
	}
	s.looked(i, next)
}

// looked is the renewer's loop after renewDue: it stops once the lease API
// offers no batches, and otherwise waits until next (at least a
// millisecond) or a kick; then the BerthLeases it woke are reconciled.
func (s *fleetSim) looked(i int, next time.Time) {
	a := s.agents[i]
	if a.proc.renewals.off.Load() {
		// As renew ends: every term goes back to its reconcile, woken.
		a.proc.giveBack(a.renewer.ctx)
		s.stopProcess(a)
		s.note(func() string { return fmt.Sprintf("%s: renewer stopped: the lease API offers no batches", a.holder) })
	} else {
		a.renewer.next = latest(next, s.now.Add(time.Millisecond))
		s.kicked(i)
	}
	if a.br.takeWoken() {
		s.note(func() string { return fmt.Sprintf("%s: woken by the renewer", a.holder) })
		s.bring(i)
	}
}

// bring queues a reconcile of the agent's BerthLease now, or, while its
// reconcile waits on a call, right after it.
func (s *fleetSim) bring(i int) {
	a := s.agents[i]
	if a.pending == nil {
		a.wake = s.now
	} else {
		a.woken = true
	}
}

// noteValid records the local deadlines the agent's memory gives its
// tokens.
func (s *fleetSim) noteValid(a *simAgent) {
	t := a.mem.read()
	if t.term != nil {
		a.validUntil[t.term.Token] = latest(a.validUntil[t.term.Token], t.term.Deadline)
	}
	if t.recoverToken > 0 {
		a.validUntil[t.recoverToken] = latest(a.validUntil[t.recoverToken], t.recoverDeadline)
	}
}

// freeze stops the agent's process (SIGSTOP, a stalled node): until it
// resumes it neither reconciles nor looks nor learns an answer, and then runs
// on with the memory it had. Its requests in flight still land and its Pod
// runs on. It resumes in the second half of the longest freeze it may take:
// one that leaves its Pod, stopped at once, gone within the stop budget after
// the last local deadline its memory gave the Pod's token, so mostly past that
// deadline, while the lease API still holds the term (longer is the
// documented limit). Without a Pod that may run it is frozen up to a TTL.
func (s *fleetSim) freeze(i int, b byte) {
	a := s.agents[i]
	limit := s.now.Add(s.ttl)
	if a.pod == podRunning {
		grace := time.Duration(podGracePeriod(s.ttl, nil)) * time.Second
		limit = earliest(limit, a.validUntil[a.podToken].Add(StopBudget(s.ttl)-grace-time.Millisecond))
	}
	if !limit.After(s.now) {
		return
	}
	a.frozenUntil = s.now.Add(limit.Sub(s.now) * time.Duration(128+int(b)/2) / 255)
	s.note(func() string { return fmt.Sprintf("%s: frozen until +%v", a.holder, a.frozenUntil.Sub(t0)) })
}

// restartAgent restarts an agent: it forgets everything but status. The
// new process looks by when the old one would have. Its requests in flight
// still land at the lease API (a release among them may free the term
// after the new process renewed it, unless status recorded it: recordRelease).
func (s *fleetSim) restartAgent(i int) {
	a := s.agents[i]
	a.frozenUntil = time.Time{} // a frozen process killed: the new one runs
	if a.pending != nil {
		a.wake = a.pending.answerAt
		a.pending = nil
	}
	if old := a.mem.read(); a.renewer != nil && old.term != nil && (a.wake.IsZero() || old.term.Deadline.Before(a.wake)) {
		// The old process's renewer would have woken it at the deadline.
		a.wake = latest(old.term.Deadline, s.now)
	}
	s.stopProcess(a)
	if a.wake.IsZero() {
		// Start wakes every BerthLease; the controller lists them anyway.
		a.wake = s.now
	}
	s.startProcess(a)
	s.note(func() string {
		st := a.statusNow()
		return fmt.Sprintf("%s: agent restarted (status %s token %d)", a.holder, st.LeaseState, st.FencingToken)
	})
}

// statusNow is the agent's status as the API server has it: the last status
// write, and the release recorded since.
func (a *simAgent) statusNow() berthv1alpha1.BerthLeaseStatus {
	st := computeStatus(berthv1alpha1.BerthLeaseStatus{}, a.status)
	if a.releasing != 0 {
		st.ReleasingToken = a.releasing
	}
	return st
}
