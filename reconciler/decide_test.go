package reconciler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// t0 is "now" in the decision tests.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// term builds this cluster's term with its renew due and its local deadline
// given relative to t0.
func term(renewIn, deadlineIn time.Duration) *Term {
	return &Term{Holder: "cluster-a", Token: 7, RenewDue: t0.Add(renewIn), Deadline: t0.Add(deadlineIn)}
}

// Terms in the states the decision distinguishes.
func heldTerm() *Term         { return term(5*time.Second, 10*time.Second) }
func renewDueTerm() *Term     { return term(-time.Second, 10*time.Second) }
func pastDeadlineTerm() *Term { return term(-5*time.Second, -time.Second) }

// facts builds Facts at t0 from options.
func facts(opts ...func(*Facts)) Facts {
	f := Facts{Now: t0}
	for _, o := range opts {
		o(&f)
	}
	return f
}

func batchRenewed(f *Facts)          { f.BatchRenewed = true }
func withTerm(t *Term) func(*Facts)  { return func(f *Facts) { f.Term = t } }
func withRunning(n int) func(*Facts) { return func(f *Facts) { f.RunningPods = n } }
func withGated(n int) func(*Facts)   { return func(f *Facts) { f.GatedPods = n } }
func withRecover(tok int32) func(*Facts) {
	return func(f *Facts) { f.RecoverToken, f.RecoverDeadline = tok, t0.Add(3*time.Second) }
}
func recoverDeadlinePassed(f *Facts)     { f.RecoverDeadline = t0 }
func withRelease(tok int32) func(*Facts) { return func(f *Facts) { f.ReleaseToken = tok } }
func deleting(f *Facts)                  { f.Deleting = true }
func invalid(f *Facts)                   { f.Invalid = true }
func cordoned(f *Facts)                  { f.Cordoned = true }
func podsUnknown(f *Facts)               { f.PodsUnknown = true }
func shadowed(f *Facts)                  { f.Shadowed = true }
func keyShared(f *Facts)                 { f.KeyShared = true }
func revoked(f *Facts)                   { f.Revoked = true }
func releaseSent(f *Facts)               { f.ReleaseSent = true }

func TestDecide(t *testing.T) {
	poll := t0.Add(stopPollInterval)
	stopping := Decision{Pods: PodsStop, Phase: PhaseStopping, Wake: poll}
	stopAndRenew := Decision{Call: CallRenew, Pods: PodsStop, Phase: PhaseStopping, Wake: poll}
	stopAndRecover := Decision{Call: CallRecover, Pods: PodsStop, Phase: PhaseStopping, Wake: poll}
	release := Decision{Call: CallRelease, Wake: poll}

	cases := map[string]struct {
		facts Facts
		want  Decision
	}{
		// May run.
		"held, renew not due: active until the renew": {
			facts: facts(withTerm(heldTerm())),
			want:  Decision{Phase: PhaseActive, Wake: t0.Add(5 * time.Second)},
		},
		"held, renew due: renew and stay active": {
			facts: facts(withTerm(renewDueTerm())),
			want:  Decision{Call: CallRenew, Phase: PhaseActive, Wake: t0.Add(-time.Second)},
		},
		"held, renew due exactly now": {
			facts: facts(withTerm(term(0, 10*time.Second))),
			want:  Decision{Call: CallRenew, Phase: PhaseActive, Wake: t0},
		},
		"held, renew due after the deadline: wake at the deadline": {
			facts: facts(withTerm(term(20*time.Second, 10*time.Second))),
			want:  Decision{Phase: PhaseActive, Wake: t0.Add(10 * time.Second)},
		},
		"held, renew due, renewals in batches: the renewer renews, nothing to schedule": {
			facts: facts(withTerm(renewDueTerm()), batchRenewed),
			want:  Decision{Phase: PhaseActive},
		},
		"held with gated Pods, renewals in batches: ungate them": {
			facts: facts(withTerm(renewDueTerm()), withGated(2), batchRenewed),
			want:  Decision{Pods: PodsUngate, Phase: PhaseActive},
		},
		"past the deadline, renewals in batches: stop and renew it here": {
			facts: facts(withTerm(pastDeadlineTerm()), withRunning(1), batchRenewed),
			want:  Decision{Call: CallRenew, Pods: PodsStop, Phase: PhaseStopping, Wake: t0.Add(stopPollInterval)},
		},
		"held with gated Pods: ungate them": {
			facts: facts(withTerm(heldTerm()), withGated(3), withRunning(1)),
			want:  Decision{Pods: PodsUngate, Phase: PhaseActive, Wake: t0.Add(5 * time.Second)},
		},
		"held, renew due, gated Pods: renew and ungate": {
			facts: facts(withTerm(renewDueTerm()), withGated(1)),
			want:  Decision{Call: CallRenew, Pods: PodsUngate, Phase: PhaseActive, Wake: t0.Add(-time.Second)},
		},
		"held, Pods unknown: stays active, nothing to ungate": {
			facts: facts(withTerm(heldTerm()), podsUnknown),
			want:  Decision{Phase: PhaseActive, Wake: t0.Add(5 * time.Second)},
		},
		"held, one nanosecond before the deadline": {
			facts: facts(withTerm(term(-time.Second, time.Nanosecond)), withGated(1)),
			want:  Decision{Call: CallRenew, Pods: PodsUngate, Phase: PhaseActive, Wake: t0.Add(-time.Second)},
		},

		// Deadline passed: self-fence.
		"deadline reached exactly, Pods running: stop": {
			facts: facts(withTerm(term(time.Second, 0)), withRunning(1)),
			want:  stopping,
		},
		"deadline passed, Pods running, renew due: stop and keep renewing": {
			facts: facts(withTerm(pastDeadlineTerm()), withRunning(2), withGated(1)),
			want:  stopAndRenew,
		},
		"deadline passed, Pods running, retry not due yet: stop only": {
			facts: facts(withTerm(term(100*time.Millisecond, -time.Second)), withRunning(1)),
			want:  stopping,
		},
		"deadline passed, Pods unknown: stop and keep renewing": {
			facts: facts(withTerm(pastDeadlineTerm()), podsUnknown),
			want:  stopAndRenew,
		},
		"deadline passed, no Pods: release": {
			facts: facts(withTerm(pastDeadlineTerm())),
			want:  release,
		},
		"deadline passed, only gated Pods: release, never ungate": {
			facts: facts(withTerm(pastDeadlineTerm()), withGated(2)),
			want:  release,
		},

		// Lost term.
		"lost, Pods running: stop, no call": {
			facts: facts(withRunning(1), withGated(1)),
			want:  stopping,
		},
		"lost, Pods unknown: stop, no call": {
			facts: facts(podsUnknown),
			want:  stopping,
		},

		// Agent restarted while holding.
		"restarted with a recover token: recover": {
			facts: facts(withRecover(7)),
			want:  Decision{Call: CallRecover, Wake: poll},
		},
		"restarted with a recover token and Pods running: recover first": {
			facts: facts(withRecover(7), withRunning(2), withGated(1)),
			want:  Decision{Call: CallRecover, Wake: poll},
		},
		"restarted with a recover token and Pods unknown: recover first": {
			facts: facts(withRecover(7), podsUnknown),
			want:  Decision{Call: CallRecover, Wake: poll},
		},
		"recover token past its deadline, Pods running: stop them, and renew the token meanwhile": {
			facts: facts(withRecover(7), recoverDeadlinePassed, withRunning(2)),
			want:  stopAndRecover,
		},
		"recover token past its deadline, nothing runs: release it": {
			facts: facts(withRecover(7), recoverDeadlinePassed),
			want:  release,
		},
		"recover token while deleting, Pods running: stop, and renew the token so the term outlasts them": {
			facts: facts(withRecover(7), deleting, withRunning(1)),
			want:  stopAndRecover,
		},
		"recover token while cordoned, Pods running: stop, and renew the token": {
			facts: facts(withRecover(7), cordoned, withRunning(2)),
			want:  stopAndRecover,
		},
		"recover token while shadowed, Pods unknown: stop, and renew the token": {
			facts: facts(withRecover(7), shadowed, podsUnknown),
			want:  stopAndRecover,
		},
		"recover token while deleting, no Pods: release": {
			facts: facts(withRecover(7), deleting),
			want:  release,
		},
		"recover token, invalid spec, no Pods: release": {
			facts: facts(withRecover(7), invalid),
			want:  release,
		},
		"recover token, cordoned, no Pods: release": {
			facts: facts(withRecover(7), cordoned),
			want:  release,
		},

		// An unconfirmed recovery left a token to release.
		"release token, Pods running: stop, and renew the token": {
			facts: facts(withRelease(7), withRunning(1)),
			want:  stopAndRecover,
		},
		"release token, Pods unknown: stop, and renew the token": {
			facts: facts(withRelease(7), podsUnknown),
			want:  stopAndRecover,
		},
		"release token, no Pods: release before acquiring": {
			facts: facts(withRelease(7), withGated(1)),
			want:  release,
		},
		"release token while deleting: release before the finalizer goes": {
			facts: facts(withRelease(7), deleting),
			want:  release,
		},

		// Pods unknown, nothing held.
		"Pods unknown, nothing held: no acquire": {
			facts: facts(podsUnknown, withGated(1)),
			want:  stopping,
		},
		"Pods unknown while deleting: finalizer stays": {
			facts: facts(podsUnknown, deleting),
			want:  stopping,
		},

		// Deleting.
		"deleting, held, Pods running: stop": {
			facts: facts(deleting, withTerm(heldTerm()), withRunning(1), withGated(1)),
			want:  stopping,
		},
		"deleting, held, renew due, Pods running: stop and renew": {
			facts: facts(deleting, withTerm(renewDueTerm()), withRunning(1)),
			want:  stopAndRenew,
		},
		"deleting, held, no Pods: release": {
			facts: facts(deleting, withTerm(heldTerm())),
			want:  release,
		},
		"deleting, nothing held or running: remove the finalizer": {
			facts: facts(deleting),
			want:  Decision{RemoveFinalizer: true},
		},
		"deleting, only gated Pods: remove the finalizer": {
			facts: facts(deleting, withGated(2)),
			want:  Decision{RemoveFinalizer: true},
		},
		"deleting and invalid, nothing held: remove the finalizer": {
			facts: facts(deleting, invalid, cordoned),
			want:  Decision{RemoveFinalizer: true},
		},

		// Invalid spec.
		"invalid, held, Pods running: stop": {
			facts: facts(invalid, withTerm(heldTerm()), withRunning(1)),
			want:  stopping,
		},
		"invalid, held, no Pods: release": {
			facts: facts(invalid, withTerm(heldTerm()), withGated(1)),
			want:  release,
		},
		"invalid, nothing held: no call, no wake": {
			facts: facts(invalid, withGated(1)),
			want:  Decision{},
		},

		// Cordoned.
		"cordoned, held, Pods running: stop": {
			facts: facts(cordoned, withTerm(heldTerm()), withRunning(3)),
			want:  stopping,
		},
		"cordoned, held, no Pods: release": {
			facts: facts(cordoned, withTerm(heldTerm())),
			want:  release,
		},
		"cordoned, nothing held: no call, no wake": {
			facts: facts(cordoned),
			want:  Decision{},
		},

		// Two BerthLeases name one lease: one term, acted on by the older.
		"shadowed, nothing held: wait, never acquire": {
			facts: facts(shadowed, withGated(2)),
			want:  Decision{},
		},
		"shadowed, held, Pods run: stop them, keep renewing": {
			facts: facts(shadowed, withTerm(renewDueTerm()), withRunning(2)),
			want:  stopAndRenew,
		},
		"shadowed, held, nothing runs, key unconfirmed: ask to release (the release is checked first)": {
			facts: facts(shadowed, withTerm(heldTerm())),
			want:  release,
		},
		"key shared, held, nothing runs: let go of the term without releasing it": {
			facts: facts(shadowed, keyShared, withTerm(heldTerm())),
			want:  Decision{DropTerm: true},
		},
		"deleting, key shared, release token: let go of it": {
			facts: facts(deleting, keyShared, withRelease(4)),
			want:  Decision{DropTerm: true},
		},
		"deleting, key shared, a release of unknown outcome: release again, never let go of it": {
			facts: facts(deleting, keyShared, releaseSent, withRelease(4)),
			want:  release,
		},
		"deleting, key shared, Pods run: stop them first": {
			facts: facts(deleting, keyShared, withTerm(heldTerm()), withRunning(1)),
			want:  stopping,
		},
		"deleting, key shared, nothing held: remove the finalizer": {
			facts: facts(deleting, keyShared),
			want:  Decision{RemoveFinalizer: true},
		},

		// An administrator revoked the term: a handover.
		"revoked, held, Pods run: stop them, renewing the term until they are gone": {
			facts: facts(revoked, withTerm(renewDueTerm()), withRunning(2)),
			want:  stopAndRenew,
		},
		"revoked, held, renew not due, gated Pods: stop nothing more, never ungate": {
			facts: facts(revoked, withTerm(heldTerm()), withGated(2), withRunning(1)),
			want:  stopping,
		},
		"revoked, held, nothing runs: release": {
			facts: facts(revoked, withTerm(heldTerm())),
			want:  release,
		},
		"revoked, another BerthLease names the lease: release all the same (nobody can renew it)": {
			facts: facts(revoked, keyShared, withTerm(heldTerm())),
			want:  release,
		},
		"revoked token to release, nothing runs: release": {
			facts: facts(revoked, withRelease(4)),
			want:  release,
		},

		// Waiting.
		"waiting: acquire": {
			facts: facts(),
			want:  Decision{Call: CallAcquire},
		},
		"waiting with gated Pods: acquire, never ungate": {
			facts: facts(withGated(4)),
			want:  Decision{Call: CallAcquire},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := Decide(tc.facts)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
			if v := violations(tc.facts, got); len(v) > 0 {
				t.Errorf("Decide() breaks invariants:\n%s", strings.Join(v, "\n"))
			}
		})
	}
}

// violations lists the safety and liveness invariants d breaks for f.
func violations(f Facts, d Decision) []string {
	var out []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	mayRun := f.MayRun()
	podsMayRun := f.RunningPods > 0 || f.PodsUnknown
	holdsSomething := f.Term != nil || f.RecoverToken > 0 || f.ReleaseToken > 0
	recovering := f.Term == nil && f.RecoverToken > 0 && !f.mustYield() && f.Now.Before(f.RecoverDeadline)
	// keepingToken: Pods may run and only a token (no term) is held: it is
	// renewed while they stop.
	keepingToken := f.Term == nil && (f.RecoverToken > 0 || f.ReleaseToken > 0) && podsMayRun

	// MayRun itself.
	wantMayRun := f.Term != nil && f.Now.Before(f.Term.Deadline) && !f.Deleting && !f.Invalid && !f.Cordoned && !f.Shadowed && !f.Revoked
	check(mayRun == wantMayRun, "MayRun() = %v, want %v", mayRun, wantMayRun)

	// Safety.
	check(d.Pods != PodsUngate || mayRun, "PodsUngate without MayRun")
	check(d.Pods != PodsUngate || f.GatedPods > 0, "PodsUngate with no gated Pods")
	check((d.Phase == PhaseActive) == mayRun, "Phase %q with MayRun %v", d.Phase, mayRun)
	check(d.Call != CallAcquire || !podsMayRun, "CallAcquire while Pods may run")
	check(d.Call != CallAcquire || !holdsSomething, "CallAcquire while a term or token is held")
	check(d.Call != CallAcquire || !f.mustYield(), "CallAcquire while the cluster must yield")
	check(d.Call != CallRelease || !podsMayRun, "CallRelease while Pods may run")
	check(d.Call != CallRelease || !mayRun, "CallRelease while the term may run")
	check(d.Call != CallRelease || holdsSomething, "CallRelease with nothing to release")
	check(d.Call != CallRelease || !f.KeyShared || f.Revoked || f.ReleaseSent, "CallRelease of a term another BerthLease shares")
	check(!d.DropTerm || (f.KeyShared && !f.Revoked && holdsSomething), "DropTerm of a term nobody else may renew")
	check(!d.DropTerm || !f.ReleaseSent, "DropTerm of a term whose release may still land")
	check(!d.DropTerm || !podsMayRun, "DropTerm while Pods may run")
	check(!d.DropTerm || d.Call == CallNone, "DropTerm with a call")
	check(!d.RemoveFinalizer || f.Deleting, "RemoveFinalizer while not deleting")
	check(!d.RemoveFinalizer || !podsMayRun, "RemoveFinalizer while Pods may run")
	check(!d.RemoveFinalizer || !holdsSomething, "RemoveFinalizer while a term or token is held")
	check(!d.RemoveFinalizer || d.Call == CallNone, "RemoveFinalizer with a call")
	check(d.Call != CallRenew || (f.Term != nil && !f.Now.Before(f.Term.RenewDue)), "CallRenew without a due term")
	check(d.Call != CallRecover || recovering || keepingToken, "CallRecover while not recovering")
	check(!keepingToken || recovering || d.Call == CallRecover, "a token held while Pods may run is not renewed")
	check(d.Pods != PodsStop || !mayRun, "PodsStop while the term may run")
	check((d.Pods == PodsStop) == (d.Phase == PhaseStopping), "Pods %v with Phase %q", d.Pods, d.Phase)

	// Liveness.
	check(!podsMayRun || mayRun || recovering || d.Pods == PodsStop, "Pods may run unallowed and are not stopped")
	// With renewals in batches the renewer renews a running term and wakes
	// the BerthLease at its deadline.
	check(!mayRun || f.Now.Before(f.Term.RenewDue) || d.Call == CallRenew || f.BatchRenewed, "renew due and not renewed")
	check(!mayRun || !f.BatchRenewed || d.Call == CallNone, "renewed here although the renewer renews it")
	if mayRun {
		check(!d.Wake.After(f.Term.Deadline), "active past the deadline: Wake %v after Deadline %v", d.Wake, f.Term.Deadline)
	}
	check(d.Phase == PhaseActive || d.Wake.IsZero() || d.Wake.After(f.Now), "Wake %v not after Now in phase %q: a hot loop", d.Wake, d.Phase)
	check(d.Phase != PhaseActive || !d.Wake.IsZero() || f.BatchRenewed, "active without a wake-up")
	check(d.Call != CallNone || d.Pods != PodsNone || d.RemoveFinalizer || d.DropTerm || d.Phase == PhaseActive || f.mustYield(),
		"nothing to do while free to act")
	return out
}

// termState is one of the term variants the property test enumerates.
type termState int

const (
	termNone termState = iota
	termHeld
	termRenewDue
	termPastDeadline
	termPastDeadlineRetryLater
	termStates
)

func (s termState) term() *Term {
	switch s {
	case termHeld:
		return heldTerm()
	case termRenewDue:
		return renewDueTerm()
	case termPastDeadline:
		return pastDeadlineTerm()
	case termPastDeadlineRetryLater:
		return term(time.Second, -time.Second)
	}
	return nil
}

// TestDecideInvariants enumerates every combination of the facts that
// matter and checks the invariants on each decision.
func TestDecideInvariants(t *testing.T) {
	const flags = 8 // Deleting, Invalid, Cordoned, Shadowed, KeyShared, Revoked, ReleaseSent, BatchRenewed
	n := 0
	for mask := 0; mask < 1<<flags; mask++ {
		on := func(i int) bool { return mask&(1<<i) != 0 }
		for ts := termNone; ts < termStates; ts++ {
			for _, rec := range []int32{0, 5, -5} { // -5: token 5, its deadline passed
				for _, rel := range []int32{0, 4} {
					for _, running := range []int{0, 1} {
						for _, unknown := range []bool{false, true} {
							for _, gated := range []int{0, 1} {
								f := Facts{
									Now: t0, Deleting: on(0), Invalid: on(1), Cordoned: on(2), Shadowed: on(3), KeyShared: on(4), Revoked: on(5), ReleaseSent: on(6), BatchRenewed: on(7),
									Term: ts.term(), RecoverToken: max(rec, -rec), RecoverDeadline: t0.Add(time.Duration(rec) * time.Second), ReleaseToken: rel,
									RunningPods: running, PodsUnknown: unknown, GatedPods: gated,
								}
								n++
								checkDecision(t, f)
							}
						}
					}
				}
			}
		}
	}
	if want := (1 << flags) * int(termStates) * 3 * 2 * 2 * 2 * 2; n != want {
		t.Fatalf("enumerated %d combinations, want %d", n, want)
	}
}

// checkDecision decides on f and reports broken invariants, and that the
// decision neither changed the facts nor varies between calls.
func checkDecision(t *testing.T, f Facts) {
	t.Helper()
	var before Term
	if f.Term != nil {
		before = *f.Term
	}
	d := Decide(f)
	if v := violations(f, d); len(v) > 0 {
		t.Errorf("Decide(%s) = %+v breaks invariants:\n%s", describe(f), d, strings.Join(v, "\n"))
	}
	if again := Decide(f); again != d {
		t.Errorf("Decide(%s) not deterministic: %+v then %+v", describe(f), d, again)
	}
	if f.Term != nil && *f.Term != before {
		t.Errorf("Decide(%s) changed the term: %+v became %+v", describe(f), before, *f.Term)
	}
}

func describe(f Facts) string {
	t := "none"
	if f.Term != nil {
		t = fmt.Sprintf("{token %d, renew %v, deadline %v}", f.Term.Token, f.Term.RenewDue.Sub(f.Now), f.Term.Deadline.Sub(f.Now))
	}
	return fmt.Sprintf("deleting=%v invalid=%v cordoned=%v shadowed=%v keyShared=%v revoked=%v releaseSent=%v batchRenewed=%v term=%s recover=%d release=%d running=%d unknown=%v gated=%d",
		f.Deleting, f.Invalid, f.Cordoned, f.Shadowed, f.KeyShared, f.Revoked, f.ReleaseSent, f.BatchRenewed, t, f.RecoverToken, f.ReleaseToken, f.RunningPods, f.PodsUnknown, f.GatedPods)
}

func FuzzDecide(f *testing.F) {
	f.Add(uint8(0), false, int64(0), int64(0), int32(0), int32(0), 0, 0)
	f.Add(uint8(0), true, int64(5000), int64(10000), int32(0), int32(0), 0, 3)
	f.Add(uint8(0), true, int64(-1000), int64(10000), int32(0), int32(0), 1, 1)
	f.Add(uint8(0), true, int64(-5000), int64(-1), int32(0), int32(0), 2, 0)
	f.Add(uint8(0b0001), true, int64(0), int64(0), int32(0), int32(0), 0, 0)
	f.Add(uint8(0b0010), false, int64(0), int64(0), int32(3), int32(0), 1, 0)
	f.Add(uint8(0b0100), false, int64(0), int64(0), int32(0), int32(3), 0, 1)
	f.Add(uint8(0b1000), false, int64(0), int64(0), int32(0), int32(3), 0, 0)
	f.Add(uint8(0b110000), true, int64(5000), int64(10000), int32(0), int32(0), 0, 0)
	f.Add(uint8(0b010000), true, int64(-1000), int64(10000), int32(0), int32(0), 1, 1)
	f.Add(uint8(0b1100000), true, int64(-1000), int64(10000), int32(0), int32(0), 1, 1)
	f.Fuzz(func(t *testing.T, flags uint8, hasTerm bool, renewMs, deadlineMs int64, rec, rel int32, running, gated int) {
		fa := Facts{
			Now:          t0,
			Deleting:     flags&1 != 0,
			Invalid:      flags&2 != 0,
			Cordoned:     flags&4 != 0,
			PodsUnknown:  flags&8 != 0,
			Shadowed:     flags&16 != 0,
			KeyShared:    flags&32 != 0,
			Revoked:      flags&64 != 0,
			ReleaseSent:  flags&128 != 0,
			RecoverToken: rec,
			// The recover deadline rides on the renew offset's sign.
			RecoverDeadline: t0.Add(time.Duration(renewMs%2) * time.Second),
			ReleaseToken:    rel,
			RunningPods:     running,
			GatedPods:       gated,
		}
		if hasTerm {
			// Offsets within ±1000 days keep the times representable.
			const limit = int64(1000 * 24 * time.Hour / time.Millisecond)
			fa.Term = &Term{
				Holder:   "cluster-a",
				Token:    max(rec, rel, 1),
				RenewDue: t0.Add(time.Duration(renewMs%limit) * time.Millisecond),
				Deadline: t0.Add(time.Duration(deadlineMs%limit) * time.Millisecond),
			}
		}
		checkDecision(t, fa)
	})
}
