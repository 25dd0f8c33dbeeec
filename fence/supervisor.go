package fence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthfleet/berth/leaseapi"
)

// Exit codes of berth-fence besides the child's own.
const (
	// ExitFenced: the workload was stopped because its term could not be
	// confirmed in time or was lost (EX_TEMPFAIL). The kubelet restarts the
	// container into a new berth-fence exec, which must confirm again.
	ExitFenced = 75
	// ExitConfig: the environment contract is not met (EX_CONFIG).
	ExitConfig = 78
	// ExitUsage: the command line is wrong.
	ExitUsage = 2
)

// Backoff of the confirmations before the workload starts.
const (
	waitBackoffMin = 200 * time.Millisecond
	waitBackoffMax = 5 * time.Second
	// identityPoll is how often the identity files are read again while
	// they are missing.
	identityPoll = 200 * time.Millisecond
	// callTimeout bounds a confirmation call before the workload runs,
	// and while it runs when the deadline is further away.
	callTimeout = 10 * time.Second
)

// Confirmer asks the lease API whether holder holds the lease with
// fencingToken: the lease API client's Confirm.
type Confirmer interface {
	Confirm(ctx context.Context, namespace, name, holder string, fencingToken int32) (leaseapi.Confirmation, error)
}

// IdentitySource reads the Pod's identity (FileIdentity).
type IdentitySource interface {
	Read() (Identity, error)
}

// Supervisor runs one workload under a lease's term: it waits for the
// Pod's identity and for the lease API's confirmation of it, starts the
// child, keeps confirming, and stops the child's process group at the
// local deadline or when the term is lost. See docs/fencing.md.
type Supervisor struct {
	// Namespace and Name are the lease's key at the lease API.
	Namespace, Name string
	Identity        IdentitySource
	Confirmer       Confirmer
	Starter         Starter
	// Environ is the environment the child's is made from (ChildEnv).
	Environ []string
	Clock   Clock
	// Signals are the signals the fence received, forwarded to the child's
	// process group (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2).
	Signals <-chan os.Signal
	Log     *Logger
	// Once: ask for one confirmation instead of waiting for one. When the
	// Pod's term cannot be read or is not confirmed, the fence exits
	// ExitFenced at once without starting the child. For exec probes and
	// lifecycle hooks, which run workload code beside the container's main
	// process and must answer within their own timeouts.
	Once bool
}

type phase int

const (
	phaseIdentity phase = iota // waiting for the identity files
	phaseWaiting               // waiting for the first confirmation
	phaseRunning               // the child runs under a confirmed term
	phaseStopping              // the child is being stopped, or ends
)

// answer is one confirmation call's outcome; sent is when it was sent.
type answer struct {
	sent time.Duration
	conf leaseapi.Confirmation
	err  error
}

// run is the state of one Run.
type run struct {
	*Supervisor
	phase phase
	id    Identity

	// next is when the next identity read or confirmation call is due.
	next time.Duration
	// backoff is the wait after the next failed confirmation before the
	// child starts.
	backoff time.Duration
	// waitReason is the last reason logged for waiting, so a line is
	// written per change only.
	waitReason string

	// inflight: a call is under way; cancel cuts it.
	inflight bool
	cancel   context.CancelFunc
	answers  chan answer

	child  Child
	exited <-chan ExitStatus
	// deadline is the newest confirmation's local deadline (phaseRunning).
	deadline time.Duration
	ttl      time.Duration
	// failing: the last confirmation of the running child failed.
	failing bool

	// fenced: the supervisor itself stops the child (exit ExitFenced).
	fenced bool
	// killAt is when the group gets SIGKILL; killed once it has.
	killAt time.Duration
	killed bool
}

// Run supervises until the child has ended, and returns the fence's exit
// code: the child's own, ExitFenced when the fence stopped it, or 128 + a
// signal's number when a terminating signal came before the child started.
func (s *Supervisor) Run() int {
	r := &run{Supervisor: s, phase: phaseIdentity, backoff: waitBackoffMin, answers: make(chan answer, 1)}
	defer func() {
		if r.cancel != nil {
			r.cancel()
		}
	}()
	if s.Once {
		id, err := s.Identity.Read()
		if err != nil {
			s.Log.Event(EventWaitingIdentity, "reason", err.Error())
			s.Log.Event(EventExiting, "code", ExitFenced)
			return ExitFenced
		}
		r.id, r.phase = id, phaseWaiting
	}
	for {
		now := s.Clock.Now()
		r.tick(now)
		wait := min(max(r.wake()-now, 0), PollInterval)
		select {
		case a := <-r.answers:
			r.inflight = false
			if code, done := r.onAnswer(a); done {
				return code
			}
		case st := <-r.exited:
			return r.onExit(st)
		case sig := <-s.Signals:
			if code, done := r.onSignal(sig); done {
				return code
			}
		case <-s.Clock.After(wait):
		}
	}
}

// tick does what is due at now: the deadline, SIGKILL, the identity read
// and the next confirmation call.
func (r *run) tick(now time.Duration) {
	switch r.phase {
	case phaseIdentity:
		if now >= r.next {
			r.readIdentity(now)
		}
	case phaseRunning:
		if now >= r.deadline {
			r.stop(now, KillDelay(r.ttl), "local deadline passed", "sinceDeadline", now-r.deadline)
		}
	case phaseStopping:
		if r.fenced && !r.killed && now >= r.killAt {
			r.sigkill()
		}
	}
	if (r.phase == phaseWaiting || r.phase == phaseRunning) && !r.inflight && now >= r.next {
		r.call(now)
	}
}

// wake is the next moment tick has something to do.
func (r *run) wake() time.Duration {
	w := r.next
	if r.inflight {
		// The answer wakes the loop; only the deadline is due meanwhile.
		w = r.Clock.Now() + time.Hour
	}
	switch {
	case r.phase == phaseRunning:
		w = min(w, r.deadline)
	case r.phase == phaseStopping && r.fenced && !r.killed:
		w = r.killAt
	case r.phase == phaseStopping:
		w = r.Clock.Now() + time.Hour // only the child's exit or a signal
	}
	return w
}

func (r *run) readIdentity(now time.Duration) {
	id, err := r.Identity.Read()
	if err != nil {
		r.next = now + identityPoll
		if reason := err.Error(); reason != r.waitReason {
			r.waitReason = reason
			r.Log.Event(EventWaitingIdentity, "reason", reason)
		}
		return
	}
	r.id, r.phase, r.next, r.waitReason = id, phaseWaiting, now, ""
}

// call sends one confirmation request, bounded by the local deadline while
// the child runs.
func (r *run) call(now time.Duration) {
	limit := callTimeout
	if r.phase == phaseRunning {
		limit = min(limit, r.deadline-now)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	r.inflight, r.cancel = true, cancel
	id := r.id
	go func() {
		// sent is taken before the call: retries inside it only make
		// the deadline more conservative.
		sent := r.Clock.Now()
		conf, err := r.Confirmer.Confirm(ctx, r.Namespace, r.Name, id.Holder, id.Token)
		cancel()
		r.answers <- answer{sent: sent, conf: conf, err: err}
	}()
}

// confirmed reports whether an answer confirms the Pod's own term.
func (r *run) confirmed(a answer) bool {
	return a.err == nil && a.conf.Confirmed && a.conf.Holder == r.id.Holder && a.conf.FencingToken == r.id.Token
}

// onAnswer applies a confirmation call's answer; done when the fence must
// exit with code (the child could not be started).
func (r *run) onAnswer(a answer) (code int, done bool) {
	now := r.Clock.Now()
	// The deadline is judged before any answer: one that arrives after
	// it never revives the child.
	if r.phase == phaseRunning && now >= r.deadline {
		r.stop(now, KillDelay(r.ttl), "local deadline passed", "sinceDeadline", now-r.deadline)
	}
	switch r.phase {
	case phaseWaiting:
		return r.onWaitingAnswer(now, a)
	case phaseRunning:
		r.onRunningAnswer(now, a)
	}
	return 0, false
}

func (r *run) onWaitingAnswer(now time.Duration, a answer) (int, bool) {
	deadline := Deadline(a.sent, a.conf.RemainingMillis, a.conf.TTLSeconds)
	if !r.confirmed(a) || deadline <= now {
		reason := denial(a)
		if r.confirmed(a) {
			reason = "confirmed with too little of the term left"
		}
		if r.Once {
			r.Log.Event(EventWaiting, "holder", r.id.Holder, "token", r.id.Token, "reason", reason)
			r.Log.Event(EventExiting, "code", ExitFenced)
			return ExitFenced, true
		}
		if reason != r.waitReason {
			r.waitReason = reason
			r.Log.Event(EventWaiting, "holder", r.id.Holder, "token", r.id.Token, "reason", reason, "retryIn", r.backoff)
		}
		r.next = now + r.backoff
		r.backoff = min(2*r.backoff, waitBackoffMax)
		return 0, false
	}
	r.deadline, r.ttl = deadline, time.Duration(a.conf.TTLSeconds)*time.Second
	r.Log.Event(EventConfirmed, "holder", r.id.Holder, "token", r.id.Token,
		"remaining", millis(a.conf.RemainingMillis), "deadlineIn", deadline-now)
	child, err := r.Starter.Start(ChildEnv(r.Environ, r.id.Holder, r.id.Token))
	if err != nil {
		code := 126
		var se *StartError
		if errors.As(err, &se) {
			code = se.Code
		}
		r.Log.Event(EventStartFailed, "error", err)
		r.Log.Event(EventExiting, "code", code)
		return code, true
	}
	r.child, r.exited, r.phase = child, child.Exited(), phaseRunning
	r.next = now + ConfirmInterval(r.ttl)
	r.Log.Event(EventChildStarted, "pid", child.Pid())
	return 0, false
}

func (r *run) onRunningAnswer(now time.Duration, a answer) {
	if a.err != nil {
		r.next = now + RetryInterval(r.ttl)
		if !r.failing {
			r.Log.Event(EventConfirmFailed, "error", a.err, "deadlineIn", r.deadline-now, "retryIn", RetryInterval(r.ttl))
		}
		r.failing = true
		return
	}
	if !r.confirmed(a) {
		if termEnded(r.id, a.conf) {
			// The term is over: another cluster may be granted the lease at any
			// moment, so there is no time for a graceful stop.
			r.stop(now, 0, denial(a))
			return
		}
		r.stop(now, KillDelay(r.ttl), denial(a))
		return
	}
	// The newest confirmation's deadline wins, earlier or later: the
	// lease API's latest word on what remains.
	r.deadline, r.ttl = Deadline(a.sent, a.conf.RemainingMillis, a.conf.TTLSeconds), time.Duration(a.conf.TTLSeconds)*time.Second
	if r.failing {
		r.failing = false
		r.Log.Event(EventConfirmationRestored, "token", r.id.Token, "remaining", millis(a.conf.RemainingMillis), "deadlineIn", r.deadline-now)
	}
	r.next = now + ConfirmInterval(r.ttl)
	if now >= r.deadline {
		r.stop(now, KillDelay(r.ttl), "confirmed with too little of the term left")
	}
}

// denial says why an answer does not confirm the Pod's term.
func denial(a answer) string {
	switch c := a.conf; {
	case a.err != nil:
		return a.err.Error()
	case c.Revoked:
		return fmt.Sprintf("term revoked (holder %q, token %d)", c.Holder, c.FencingToken)
	case c.Holder == "":
		return fmt.Sprintf("lease free (last token %d)", c.FencingToken)
	case c.Confirmed:
		return fmt.Sprintf("confirmation names another term (holder %q, token %d)", c.Holder, c.FencingToken)
	default:
		return fmt.Sprintf("held by holder %q with token %d", c.Holder, c.FencingToken)
	}
}

// termEnded reports whether an answer that does not confirm id says id's term
// is over: the lease is free, or held by another holder or term. Only the
// Pod's own term revoked (it lasts until its holder releases it or it
// expires) leaves time for a graceful stop.
func termEnded(id Identity, c leaseapi.Confirmation) bool {
	return c.Holder != id.Holder || c.FencingToken != id.Token
}

// stop begins stopping the child: SIGTERM to its group now, SIGKILL grace
// later; with no grace, SIGKILL at once.
func (r *run) stop(now, grace time.Duration, reason string, kv ...any) {
	if r.cancel != nil {
		r.cancel()
	}
	r.phase, r.fenced, r.killAt = phaseStopping, true, now+grace
	r.Log.Event(EventConfirmationLost, append([]any{"reason", reason, "token", r.id.Token}, kv...)...)
	if grace == 0 {
		r.sigkill()
		return
	}
	r.Log.Event(EventStopping, "signal", "SIGTERM", "pid", r.child.Pid(), "sigkillIn", grace)
	if err := r.child.Signal(syscall.SIGTERM); err != nil {
		r.Log.Event(EventStopping, "pid", r.child.Pid(), "error", err)
	}
}

// sigkill sends SIGKILL to the child's group, once.
func (r *run) sigkill() {
	r.killed = true
	r.Log.Event(EventSIGKILL, "pid", r.child.Pid())
	if err := r.child.Signal(syscall.SIGKILL); err != nil {
		r.Log.Event(EventSIGKILL, "pid", r.child.Pid(), "error", err)
	}
}

// onExit ends the run with the child's status: what is left of its group
// is killed, so nothing of the workload outlives the fence.
func (r *run) onExit(st ExitStatus) int {
	pid := r.child.Pid()
	_ = r.child.Signal(syscall.SIGKILL)
	kv := []any{"pid", pid, "code", st.ExitCode()}
	if st.Signal != 0 {
		kv = append(kv, "signal", signalName(st.Signal))
	}
	r.Log.Event(EventChildExited, kv...)
	code := st.ExitCode()
	if r.fenced {
		code = ExitFenced
	}
	r.Log.Event(EventExiting, "code", code)
	return code
}

func (r *run) onSignal(sig os.Signal) (int, bool) {
	ss, ok := sig.(syscall.Signal)
	if !ok {
		return 0, false
	}
	if r.child == nil {
		switch ss {
		case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
			r.Log.Event(EventSignalBeforeStart, "signal", signalName(ss))
			r.Log.Event(EventExiting, "code", 128+int(ss))
			return 128 + int(ss), true
		}
		return 0, false
	}
	r.Log.Event(EventSignalForwarded, "signal", signalName(ss), "pid", r.child.Pid())
	if err := r.child.Signal(ss); err != nil {
		r.Log.Event(EventSignalForwarded, "signal", signalName(ss), "pid", r.child.Pid(), "error", err)
	}
	return 0, false
}

func signalName(s syscall.Signal) string {
	if name := unix.SignalName(s); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", int(s))
}
