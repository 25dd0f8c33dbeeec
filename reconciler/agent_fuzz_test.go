package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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
// restart that forgets everything and recovers from status, status writes
// that fail, Pods that cannot be listed, Pods that take up to their grace
// period to stop, cordons. The other agent competes for the lease, so a
// term that ends is taken over.
//
// An agent is never late: it reconciles by the wake-up its last decision
// asked for (a reconcile may come earlier, as events bring it). Past that,
// nothing is promised (an agent down longer than its validity). An agent's
// requests in flight still land after it restarts; a release is recorded in
// status before it is sent, and not sent when that write fails.
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
	f.Fuzz(func(t *testing.T, program []byte) {
		if len(program) == 0 {
			return
		}
		newFleetSim(t, program).run()
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
}

type simAgent struct {
	holder string
	mem    tenure
	// status is what the last status write was computed from.
	status   statusInput
	cordoned bool
	pod      simPod
	killAt   time.Time
	// podToken is the token written on the running Pod.
	podToken int32
	// wake: the agent reconciles by then (when no call is in flight).
	wake    time.Time
	pending *simCall
	// releasing is the release recorded in status before it was sent
	// (recordRelease), until the next status write replaces it.
	releasing int32
	// the current reconcile's draws.
	podsUnknown, statusFails bool
	killDelay                time.Duration
	// granted are the tokens the server granted this agent.
	granted map[int32]bool
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
	for _, h := range []string{"cluster-a", "cluster-b"} {
		s.agents = append(s.agents, &simAgent{holder: h, wake: t0, granted: map[int32]bool{}})
	}
	return s
}

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
			if s.agents[who].pending == nil {
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
		again.tracing = true
		again.run()
		s.t.Fatalf("at +%v (ttl %v, heartbeat %v): %s (not again with tracing on)", s.now.Sub(t0), s.ttl, s.hb, fmt.Sprintf(format, args...))
	}
	tail := s.trace
	if len(tail) > 80 {
		tail = tail[len(tail)-80:]
	}
	s.t.Fatalf("at +%v (ttl %v, heartbeat %v): %s\ntrace:\n%s", s.now.Sub(t0), s.ttl, s.hb, fmt.Sprintf(format, args...), strings.Join(tail, "\n"))
}

// Events, in the order they happen at one instant.
const (
	evKill = iota
	evArrival
	evAnswer
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
			consider(a.killAt, evKill, i)
		}
		if a.pending != nil {
			consider(a.pending.answerAt, evAnswer, i)
		} else {
			consider(a.wake, evWake, i)
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
		case evArrival:
			c := s.inflight[idx]
			s.inflight = append(s.inflight[:idx], s.inflight[idx+1:]...)
			s.land(c)
		case evAnswer:
			s.answer(idx)
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
	}
}

// observe is observe's part of the memory: recovery, self-fencing, facts.
func (s *fleetSim) observe(i int) Facts {
	a := s.agents[i]
	if !a.mem.started {
		// The term's last renewal, as the lease API's record has it
		// (lastRenewal), when the record still shows the term status names.
		st := a.statusNow()
		var renewedAt time.Time
		if st.LeaseState == StateHeld && st.CurrentHolder == a.holder && s.cur.Holder == a.holder && s.cur.FencingToken == st.FencingToken {
			renewedAt = s.cur.RenewedAt
		}
		a.mem = a.mem.recoverFromStatus(st, a.holder, s.ttl, renewedAt, s.now)
	}
	var fenced bool
	if a.mem, fenced = a.mem.checkDeadline(s.now); fenced {
		s.note(func() string { return fmt.Sprintf("%s: self-fenced (token %d)", a.holder, a.mem.term.Token) })
	}
	// A failed list knows no Pods at all (listPods).
	f := Facts{Now: s.now, Cordoned: a.cordoned, PodsUnknown: a.podsUnknown}
	switch {
	case a.podsUnknown:
	case a.pod == podGated:
		f.GatedPods = 1
	default:
		f.RunningPods = 1
	}
	return a.mem.intoFacts(f)
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
		a.mem, _ = a.mem.dropTerm()
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
	token := a.mem.tokenFor(c)
	if c != CallAcquire && !a.granted[token] {
		s.fail("%s presents token %d to %s, never granted to it", a.holder, token, callName(c))
	}
	if c == CallRelease && a.pod != podGated {
		s.fail("%s releases token %d while its Pod may run", a.holder, token)
	}
	if c == CallRelease {
		a.releasing = token
	}
	req := request{call: c, holder: a.holder, token: token, ttl: s.ttl, heartbeat: s.hb, sent: s.now}
	cut := s.now.Add(DefaultCallTimeout)
	if dl := a.mem.callDeadline(); s.now.Before(dl) && dl.Before(cut) {
		cut = dl
	}
	b1, b2 := s.src.next(), s.src.next()
	step := s.ttl / 64
	d1, d2 := time.Duration(b1/8%8)*step, time.Duration(b2%8)*step
	call := &simCall{agent: i, req: req, fault: int(b1 % 8), arrives: true, arrival: s.now.Add(d1)}
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
	a.pending = call
	if call.arrives {
		s.inflight = append(s.inflight, call)
	}
	s.note(func() string {
		return fmt.Sprintf("%s: sends %s token %d (fault %d, arrives %v at +%v, answer at +%v, cut %v)",
			a.holder, callName(c), token, call.fault, call.arrives, call.arrival.Sub(t0), call.answerAt.Sub(t0), call.cut)
	})
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
	a.mem, o = a.mem.afterAnswer(c.req, res, err, s.now)
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

func (s *fleetSim) finishWith(i int, f Facts, d Decision) {
	a := s.agents[i]
	wake := d.Wake
	if wake.IsZero() {
		wake = s.now.Add(s.hb)
	}
	a.wake = latest(wake, s.now.Add(10*time.Millisecond))
	if a.statusFails {
		s.note(func() string { return fmt.Sprintf("%s: status write failed", a.holder) })
		return
	}
	// The status is computed when a restarted agent reads it: what recovery
	// reads of it does not depend on the status before.
	a.status = statusInput{generation: 1, holder: a.holder, facts: f, decision: d, tenure: a.mem}
	a.releasing = 0
	if d.Pods != PodsUngate || a.pod != podGated || !s.now.Before(f.Term.Deadline) {
		return
	}
	if f.Term.Token < s.lastRunToken {
		s.fail("%s ungates with token %d after token %d ran", a.holder, f.Term.Token, s.lastRunToken)
	}
	s.lastRunToken = f.Term.Token
	a.pod, a.podToken = podRunning, f.Term.Token
	s.note(func() string { return fmt.Sprintf("%s: Pod ungated with token %d", a.holder, a.podToken) })
}

// restartAgent restarts an agent: it forgets everything but status. The
// new process looks by when the old one would have. Its requests in flight
// still land at the lease API (a release among them may free the term
// after the new process renewed it, unless status recorded it: recordRelease).
func (s *fleetSim) restartAgent(i int) {
	a := s.agents[i]
	if a.pending != nil {
		a.wake = a.pending.answerAt
		a.pending = nil
	}
	a.mem = tenure{}
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

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
