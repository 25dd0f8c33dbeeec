package reconciler

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi/client"
)

// The timing of the memory tests: a request sent at t0, answered a second
// later.
const (
	memTTL       = 30 * time.Second
	memHeartbeat = 10 * time.Second
)

var answeredAt = t0.Add(time.Second)

// compareTenure compares tenures field by field, errors by errors.Is.
var compareTenure = []cmp.Option{cmp.AllowUnexported(tenure{}, outcome{}), cmpopts.EquateErrors()}

// grantedTerm is the term a grant of token to a request sent at t0 begins.
func grantedTerm(token int32) *Term {
	return &Term{Holder: us, Token: token, Deadline: t0.Add(LocalValidity(memTTL)), RenewDue: t0.Add(memHeartbeat)}
}

// tenures in the states the transitions distinguish.
func holding(t *Term) tenure { return tenure{started: true, term: t} }
func recovering(token int32) tenure {
	return tenure{started: true, recoverToken: token, recoverDeadline: t0.Add(3 * time.Second)}
}
func releasing(token int32) tenure { return tenure{started: true, releaseToken: token} }

// with applies changes to a tenure built above.
func with(t tenure, opts ...func(*tenure)) tenure {
	for _, o := range opts {
		o(&t)
	}
	return t
}
func wasRevoked(t *tenure)               { t.revoked = true }
func releaseWasSent(t *tenure)           { t.releaseSent = t.releaseToken }
func wasSelfFenced(t *tenure)            { t.selfFenced = true }
func failedWith(err error) func(*tenure) { return func(t *tenure) { t.apiErr = err } }
func saw(r client.AcquireResult) func(*tenure) {
	return func(t *tenure) { t.observed = r }
}

// Answers of the lease API.
func revokedAnswer(token int32) client.AcquireResult {
	return client.AcquireResult{Holder: us, FencingToken: token, RenewedAt: renewedAt, ExpiresAt: expiresAt, Revoked: true}
}

var (
	lostToOther  = granted(other, 8)
	lostToNobody = client.AcquireResult{FencingToken: 7}
	errConflict  = fmt.Errorf("release lease ns/l: %w", client.ErrConflict)
)

func TestAfterAnswer(t *testing.T) {
	req := func(c Call, token int32) request {
		return request{call: c, holder: us, token: token, ttl: memTTL, heartbeat: memHeartbeat, sent: t0}
	}
	// heldTerm is due for renewal; after a failure it is retried soon.
	retried := heldTerm()
	retried.RenewDue = answeredAt.Add(retryInterval(memHeartbeat))

	cases := map[string]struct {
		before      tenure
		req         request
		res         client.AcquireResult
		err         error
		want        tenure
		wantOutcome outcome
	}{
		// Acquire.
		"acquire granted: a term measured from when it was sent": {
			before: tenure{started: true},
			req:    req(CallAcquire, 0),
			res:    granted(us, 8),
			want:   with(holding(grantedTerm(8)), saw(granted(us, 8))),
		},
		"acquire granted after a failure and a self-fence: both cleared": {
			before: with(tenure{started: true}, wasSelfFenced, failedWith(errUnreachable)),
			req:    req(CallAcquire, 0),
			res:    granted(us, 8),
			want:   with(holding(grantedTerm(8)), saw(granted(us, 8))),
		},
		"acquire held by another: only the answer is kept": {
			before: tenure{started: true},
			req:    req(CallAcquire, 0),
			res:    lostToOther,
			want:   with(tenure{started: true}, saw(lostToOther)),
		},
		"acquire finds this cluster's own term revoked: its token is kept to release": {
			before:      tenure{started: true},
			req:         req(CallAcquire, 0),
			res:         revokedAnswer(7),
			want:        with(releasing(7), wasRevoked, saw(revokedAnswer(7))),
			wantOutcome: outcome{change: changeRevoked, token: 7, expiresAt: expiresAt},
		},
		"acquire fails: the error is kept, nothing else": {
			before:      with(tenure{started: true}, saw(lostToOther)),
			req:         req(CallAcquire, 0),
			err:         errUnreachable,
			want:        with(tenure{started: true}, saw(lostToOther), failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed},
		},

		// Renew.
		"renew granted: the deadline moves to sent + validity": {
			before: with(holding(renewDueTerm()), failedWith(errUnreachable)),
			req:    req(CallRenew, 7),
			res:    granted(us, 7),
			want:   with(holding(grantedTerm(7)), saw(granted(us, 7))),
		},
		"renew granted after the deadline passed: no longer self-fenced": {
			before: with(holding(pastDeadlineTerm()), wasSelfFenced),
			req:    req(CallRenew, 7),
			res:    granted(us, 7),
			want:   with(holding(grantedTerm(7)), saw(granted(us, 7))),
		},
		"renew fails: the term keeps its deadline, retried soon": {
			before:      with(holding(renewDueTerm()), saw(granted(us, 7))),
			req:         req(CallRenew, 7),
			err:         errUnreachable,
			want:        with(holding(retried), saw(granted(us, 7)), failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed, token: 7},
		},
		"renew answered revoked: the term is kept, revoked, renewed from when it was sent": {
			before:      holding(renewDueTerm()),
			req:         req(CallRenew, 7),
			res:         revokedAnswer(7),
			want:        with(holding(grantedTerm(7)), wasRevoked, saw(revokedAnswer(7))),
			wantOutcome: outcome{change: changeRevoked, token: 7, expiresAt: expiresAt},
		},
		"renew of a term already revoked: renewed, not news": {
			before: with(holding(renewDueTerm()), wasRevoked),
			req:    req(CallRenew, 7),
			res:    revokedAnswer(7),
			want:   with(holding(grantedTerm(7)), wasRevoked, saw(revokedAnswer(7))),
		},
		"renew of a term revoked meanwhile (moved by this agent) answered plain: the answer left first, the term stays revoked": {
			before: with(holding(renewDueTerm()), wasRevoked),
			req:    req(CallRenew, 7),
			res:    granted(us, 7),
			want:   with(holding(grantedTerm(7)), wasRevoked, saw(granted(us, 7))),
		},
		"acquire granted a new term after a revoked one: not revoked": {
			before: with(holding(renewDueTerm()), wasRevoked),
			req:    req(CallAcquire, 0),
			res:    granted(us, 8),
			want:   with(holding(grantedTerm(8)), saw(granted(us, 8))),
		},
		"renew answered with another revoked term of this cluster: that token is to release": {
			before:      holding(renewDueTerm()),
			req:         req(CallRenew, 7),
			res:         revokedAnswer(9),
			want:        with(releasing(9), wasRevoked, saw(revokedAnswer(9))),
			wantOutcome: outcome{change: changeRevoked, token: 9, expiresAt: expiresAt},
		},
		"renew answered lost to another holder: the term is gone": {
			before:      with(holding(renewDueTerm()), wasRevoked),
			req:         req(CallRenew, 7),
			res:         lostToOther,
			want:        with(tenure{started: true}, saw(lostToOther)),
			wantOutcome: outcome{change: changeLost, token: 7, holder: other},
		},
		"renew answered lost, nobody holds it: the term is gone": {
			before:      holding(pastDeadlineTerm()),
			req:         req(CallRenew, 7),
			res:         lostToNobody,
			want:        with(tenure{started: true}, saw(lostToNobody)),
			wantOutcome: outcome{change: changeLost, token: 7},
		},

		// Recover a token from status.
		"recover granted: a term, nothing left to recover": {
			before: recovering(7),
			req:    req(CallRecover, 7),
			res:    granted(us, 7),
			want:   with(tenure{started: true, term: grantedTerm(7), recoverDeadline: t0.Add(3 * time.Second)}, saw(granted(us, 7))),
		},
		"recover fails: the token is to release": {
			before:      recovering(7),
			req:         req(CallRecover, 7),
			err:         errUnreachable,
			want:        with(tenure{started: true, releaseToken: 7, recoverDeadline: t0.Add(3 * time.Second)}, failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed, token: 7},
		},
		"recover answered revoked: the term is kept, revoked": {
			before:      recovering(7),
			req:         req(CallRecover, 7),
			res:         revokedAnswer(7),
			want:        with(tenure{started: true, term: grantedTerm(7), recoverDeadline: t0.Add(3 * time.Second)}, wasRevoked, saw(revokedAnswer(7))),
			wantOutcome: outcome{change: changeRevoked, token: 7, expiresAt: expiresAt},
		},
		"recover answered lost: nothing is held, nothing was known to be": {
			before: recovering(7),
			req:    req(CallRecover, 7),
			res:    lostToOther,
			want:   with(tenure{started: true, recoverDeadline: t0.Add(3 * time.Second)}, saw(lostToOther)),
		},

		// Recover (renew) a token to release while Pods stop.
		"renew of a token to release granted: a term": {
			before: releasing(7),
			req:    req(CallRecover, 7),
			res:    granted(us, 7),
			want:   with(holding(grantedTerm(7)), saw(granted(us, 7))),
		},
		"renew of a token to release fails: still to release": {
			before:      releasing(7),
			req:         req(CallRecover, 7),
			err:         errUnreachable,
			want:        with(releasing(7), failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed, token: 7},
		},
		"renew of a revoked token to release: a revoked term (news again, as no term was known)": {
			before:      with(releasing(7), wasRevoked),
			req:         req(CallRecover, 7),
			res:         revokedAnswer(7),
			want:        with(holding(grantedTerm(7)), wasRevoked, saw(revokedAnswer(7))),
			wantOutcome: outcome{change: changeRevoked, token: 7, expiresAt: expiresAt},
		},
		"renew of a token to release answered lost: still to release (a release of it is harmless)": {
			before: releasing(7),
			req:    req(CallRecover, 7),
			res:    lostToOther,
			want:   with(releasing(7), saw(lostToOther)),
		},

		// Release.
		"release of the revoked term: everything forgotten but that it was handed over": {
			before:      with(holding(grantedTerm(7)), wasRevoked, failedWith(errUnreachable), saw(revokedAnswer(7))),
			req:         bounded(req(CallRelease, 7), grantedTerm(7).Deadline),
			want:        with(tenure{started: true, handedOver: 7}, saw(client.AcquireResult{FencingToken: 7})),
			wantOutcome: outcome{change: changeReleased, token: 7},
		},
		"release of a revoked term past its local deadline: it may have expired first, not handed over": {
			before:      with(holding(pastDeadlineTerm()), wasRevoked, wasSelfFenced, failedWith(errUnreachable), saw(revokedAnswer(7))),
			req:         req(CallRelease, 7),
			want:        with(tenure{started: true}, wasSelfFenced, saw(client.AcquireResult{FencingToken: 7})),
			wantOutcome: outcome{change: changeReleased, token: 7},
		},
		"release answered conflict: no longer this cluster's, forgotten": {
			before:      releasing(7),
			req:         req(CallRelease, 7),
			err:         errConflict,
			want:        with(tenure{started: true}, saw(client.AcquireResult{FencingToken: 7})),
			wantOutcome: outcome{change: changeReleased, token: 7},
		},
		"release of a recover token: forgotten": {
			before:      recovering(7),
			req:         req(CallRelease, 7),
			want:        with(tenure{started: true, recoverDeadline: t0.Add(3 * time.Second)}, saw(client.AcquireResult{FencingToken: 7})),
			wantOutcome: outcome{change: changeReleased, token: 7},
		},
		"release of the term fails: its token is to release first": {
			before:      with(holding(heldTerm()), wasRevoked),
			req:         req(CallRelease, 7),
			err:         errUnreachable,
			want:        with(releasing(7), releaseWasSent, wasRevoked, failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed, token: 7},
		},
		"release of a recover token fails: kept as a token to release too": {
			before:      recovering(7),
			req:         req(CallRelease, 7),
			err:         errUnreachable,
			want:        with(recovering(7), func(t *tenure) { t.releaseToken = 7 }, releaseWasSent, failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed, token: 7},
		},
		"release succeeds after one of unknown outcome: everything forgotten": {
			before:      with(releasing(7), releaseWasSent, failedWith(errUnreachable)),
			req:         req(CallRelease, 7),
			want:        with(tenure{started: true}, saw(client.AcquireResult{FencingToken: 7})),
			wantOutcome: outcome{change: changeReleased, token: 7},
		},

		// A release of unknown outcome may still land: its term never runs
		// Pods again.
		"renew of a token whose release may still land, granted: still only a token to release": {
			before: with(releasing(7), releaseWasSent, failedWith(errUnreachable)),
			req:    req(CallRecover, 7),
			res:    granted(us, 7),
			want:   with(releasing(7), releaseWasSent, saw(granted(us, 7))),
		},
		"renew of a token whose release may still land, revoked: a revoked token to release": {
			before:      with(releasing(7), releaseWasSent),
			req:         req(CallRecover, 7),
			res:         revokedAnswer(7),
			want:        with(releasing(7), releaseWasSent, wasRevoked, saw(revokedAnswer(7))),
			wantOutcome: outcome{change: changeRevoked, token: 7, expiresAt: expiresAt},
		},
		"renew of a revoked token whose release may still land: not news again": {
			before: with(releasing(7), releaseWasSent, wasRevoked),
			req:    req(CallRecover, 7),
			res:    revokedAnswer(7),
			want:   with(releasing(7), releaseWasSent, wasRevoked, saw(revokedAnswer(7))),
		},
		"renew of a token whose release may still land, lost: still to release": {
			before: with(releasing(7), releaseWasSent),
			req:    req(CallRecover, 7),
			res:    lostToOther,
			want:   with(releasing(7), releaseWasSent, saw(lostToOther)),
		},
		"renew of a token whose release may still land fails: still to release": {
			before:      with(releasing(7), releaseWasSent),
			req:         req(CallRecover, 7),
			err:         errUnreachable,
			want:        with(releasing(7), releaseWasSent, failedWith(errUnreachable)),
			wantOutcome: outcome{change: changeFailed, token: 7},
		},
		"recover of a status token whose release may still land, granted: a token to release": {
			before: with(recovering(7), func(t *tenure) { t.releaseSent = 7 }),
			req:    req(CallRecover, 7),
			res:    granted(us, 7),
			want:   with(tenure{started: true, releaseToken: 7, releaseSent: 7, recoverDeadline: t0.Add(3 * time.Second)}, saw(granted(us, 7))),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := tc.before
			var beforeTerm Term
			if before.term != nil {
				beforeTerm = *before.term
			}
			got, gotOutcome := tc.before.afterAnswer(tc.req, tc.res, tc.err, answeredAt)
			if diff := cmp.Diff(tc.want, got, compareTenure...); diff != "" {
				t.Errorf("afterAnswer() tenure mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantOutcome, gotOutcome, compareTenure...); diff != "" {
				t.Errorf("afterAnswer() outcome mismatch (-want +got):\n%s", diff)
			}
			if before.term != nil && *before.term != beforeTerm {
				t.Errorf("afterAnswer() changed the term it was given: %+v became %+v", beforeTerm, *before.term)
			}
		})
	}
}

// withReleasing is st with a release of token recorded (recordRelease).
func withReleasing(st berthv1alpha1.BerthLeaseStatus, token int32) berthv1alpha1.BerthLeaseStatus {
	st.ReleasingToken = token
	return st
}

func TestRecoverFromStatus(t *testing.T) {
	now := t0.Add(5 * time.Second)
	lastRenew := t0
	held := func(holder string, token int32) berthv1alpha1.BerthLeaseStatus {
		return berthv1alpha1.BerthLeaseStatus{LeaseState: StateHeld, CurrentHolder: holder, FencingToken: token}
	}
	cases := map[string]struct {
		before    tenure
		status    berthv1alpha1.BerthLeaseStatus
		renewedAt time.Time
		want      tenure
	}{
		"held by this cluster with a renew time: recover until validity after it": {
			status: held(us, 7), renewedAt: lastRenew,
			want: tenure{started: true, recoverToken: 7, recoverDeadline: t0.Add(LocalValidity(memTTL))},
		},
		"renew time longer ago than the validity: a deadline already passed": {
			status: held(us, 7), renewedAt: t0.Add(-time.Hour),
			want: tenure{started: true, recoverToken: 7, recoverDeadline: t0.Add(-time.Hour + LocalValidity(memTTL))},
		},
		"held by this cluster without a renew time: no deadline, so the Pods stop first": {
			status: held(us, 7),
			want:   tenure{started: true, recoverToken: 7},
		},
		"a release of this cluster's token was sent, not confirmed: release it again, never recover it": {
			status: withReleasing(held(us, 7), 7), renewedAt: lastRenew,
			want: tenure{started: true, releaseToken: 7, releaseSent: 7},
		},
		"an unconfirmed release recorded over a stale holder (an earlier status write failed): still this cluster's, released again": {
			status: withReleasing(held(other, 7), 7),
			want:   tenure{started: true, releaseToken: 7, releaseSent: 7},
		},
		"held by another cluster: nothing to recover": {
			status: held(other, 7),
			want:   tenure{started: true},
		},
		"held without a token: nothing to recover": {
			status: held(us, 0),
			want:   tenure{started: true},
		},
		"waiting: nothing to recover": {
			status: berthv1alpha1.BerthLeaseStatus{LeaseState: StateWaiting, CurrentHolder: us, FencingToken: 7},
			want:   tenure{started: true},
		},
		"released: nothing to recover": {
			status: berthv1alpha1.BerthLeaseStatus{LeaseState: StateReleased, CurrentHolder: us, FencingToken: 7},
			want:   tenure{started: true},
		},
		"already started: status is not read again": {
			before: with(holding(heldTerm()), saw(granted(us, 7))),
			status: held(us, 6),
			want:   with(holding(heldTerm()), saw(granted(us, 7))),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := tc.before.recoverFromStatus(tc.status, us, memTTL, tc.renewedAt, now)
			if diff := cmp.Diff(tc.want, got, compareTenure...); diff != "" {
				t.Errorf("recoverFromStatus() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckDeadline(t *testing.T) {
	cases := map[string]struct {
		before     tenure
		now        time.Time
		want       tenure
		wantFenced bool
	}{
		"before the deadline: nothing": {
			before: holding(heldTerm()),
			now:    t0.Add(10*time.Second - time.Nanosecond),
			want:   holding(heldTerm()),
		},
		"at the deadline: self-fenced": {
			before:     holding(heldTerm()),
			now:        t0.Add(10 * time.Second),
			want:       with(holding(heldTerm()), wasSelfFenced),
			wantFenced: true,
		},
		"after the deadline: self-fenced": {
			before:     holding(heldTerm()),
			now:        t0.Add(time.Minute),
			want:       with(holding(heldTerm()), wasSelfFenced),
			wantFenced: true,
		},
		"after the deadline, already self-fenced: not news": {
			before: with(holding(heldTerm()), wasSelfFenced),
			now:    t0.Add(time.Minute),
			want:   with(holding(heldTerm()), wasSelfFenced),
		},
		"no term: nothing to fence": {
			before: recovering(7),
			now:    t0.Add(time.Minute),
			want:   recovering(7),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, fenced := tc.before.checkDeadline(tc.now)
			if diff := cmp.Diff(tc.want, got, compareTenure...); diff != "" {
				t.Errorf("checkDeadline() mismatch (-want +got):\n%s", diff)
			}
			if fenced != tc.wantFenced {
				t.Errorf("checkDeadline() reported %v, want %v", fenced, tc.wantFenced)
			}
		})
	}
}

func TestTokenFor(t *testing.T) {
	type tokens struct{ Acquire, Renew, Recover, Release int32 }
	cases := map[string]struct {
		tenure tenure
		want   tokens
	}{
		"a term": {
			tenure: holding(heldTerm()),
			want:   tokens{Renew: 7, Release: 7},
		},
		"a term and a stale token to release: the term's": {
			tenure: with(holding(heldTerm()), func(t *tenure) { t.releaseToken = 4 }),
			want:   tokens{Renew: 7, Recover: 4, Release: 7},
		},
		"a token to recover": {
			tenure: recovering(5),
			want:   tokens{Recover: 5, Release: 5},
		},
		"a token to release": {
			tenure: releasing(4),
			want:   tokens{Recover: 4, Release: 4},
		},
		"both tokens: recover the recover token, release the release token": {
			tenure: with(recovering(5), func(t *tenure) { t.releaseToken = 4 }),
			want:   tokens{Recover: 5, Release: 4},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := tokens{Acquire: tc.tenure.tokenFor(CallAcquire), Recover: tc.tenure.tokenFor(CallRecover), Release: tc.tenure.tokenFor(CallRelease)}
			if tc.tenure.term != nil {
				got.Renew = tc.tenure.tokenFor(CallRenew)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tokenFor() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCallDeadline(t *testing.T) {
	cases := map[string]struct {
		tenure tenure
		want   time.Time
	}{
		"a term: its local deadline":                {tenure: holding(heldTerm()), want: t0.Add(10 * time.Second)},
		"a term and a recover deadline: the term's": {tenure: with(holding(heldTerm()), func(t *tenure) { t.recoverDeadline = t0 }), want: t0.Add(10 * time.Second)},
		"recovering: the recovery's":                {tenure: recovering(7), want: t0.Add(3 * time.Second)},
		"a token to release: none":                  {tenure: releasing(7)},
		"nothing: none":                             {tenure: tenure{started: true}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.tenure.callDeadline()); diff != "" {
				t.Errorf("callDeadline() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDropTerm(t *testing.T) {
	cases := map[string]struct {
		before    tenure
		want      tenure
		wantToken int32
	}{
		"a term": {
			before:    with(holding(heldTerm()), saw(granted(us, 7)), wasSelfFenced),
			want:      with(tenure{started: true}, wasSelfFenced),
			wantToken: 7,
		},
		"a revoked token to release": {
			before:    with(releasing(4), wasRevoked),
			want:      tenure{started: true},
			wantToken: 4,
		},
		"a token to recover, larger than the one to release": {
			before:    with(recovering(9), func(t *tenure) { t.releaseToken = 4 }),
			want:      tenure{started: true, recoverDeadline: t0.Add(3 * time.Second)},
			wantToken: 9,
		},
		"nothing": {
			before: tenure{started: true},
			want:   tenure{started: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, token := tc.before.dropTerm()
			if diff := cmp.Diff(tc.want, got, compareTenure...); diff != "" {
				t.Errorf("dropTerm() mismatch (-want +got):\n%s", diff)
			}
			if token != tc.wantToken {
				t.Errorf("dropTerm() let go of token %d, want %d", token, tc.wantToken)
			}
			if got.holds() {
				t.Errorf("dropTerm() still holds something")
			}
		})
	}
}

func TestCarriedOver(t *testing.T) {
	full := tenure{
		started: true, term: heldTerm(), recoverToken: 5, recoverDeadline: t0, releaseToken: 4,
		observed: granted(us, 7), apiErr: errUnreachable, selfFenced: true, revoked: true,
	}
	want := tenure{started: true, term: heldTerm(), recoverToken: 5, releaseToken: 4, observed: granted(us, 7), revoked: true}
	if diff := cmp.Diff(want, full.carriedOver(), compareTenure...); diff != "" {
		t.Errorf("carriedOver() mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(tenure{started: true}, tenure{}.carriedOver(), compareTenure...); diff != "" {
		t.Errorf("carriedOver() of nothing mismatch (-want +got):\n%s", diff)
	}
}

func TestIntoFacts(t *testing.T) {
	cases := map[string]struct {
		tenure tenure
		want   Facts
	}{
		"a revoked term: revoked": {
			tenure: with(holding(heldTerm()), wasRevoked),
			want:   Facts{Now: t0, RunningPods: 1, Term: heldTerm(), Revoked: true},
		},
		"a revoked token to release: revoked": {
			tenure: with(releasing(4), wasRevoked),
			want:   Facts{Now: t0, RunningPods: 1, ReleaseToken: 4, Revoked: true},
		},
		"revoked, but only a token to recover: not revoked (it was not the one revoked)": {
			tenure: with(recovering(5), wasRevoked),
			want:   Facts{Now: t0, RunningPods: 1, RecoverToken: 5, RecoverDeadline: t0.Add(3 * time.Second)},
		},
		"nothing held": {
			tenure: tenure{started: true, revoked: true},
			want:   Facts{Now: t0, RunningPods: 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := tc.tenure.intoFacts(Facts{Now: t0, RunningPods: 1, Revoked: true})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("intoFacts() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReleaseOfUnknownOutcomeNeverRunsAgain: a release whose outcome is
// unknown may land at the lease API later (delayed, or retried past the
// call's timeout) and free the term. Before releaseSent, a renewal of the
// token while the Pods could not be listed made it a term again, the Pods
// were ungated under it, and the late release then freed it under them
// (FuzzAgent found it: testdata/fuzz/FuzzAgent/delayed-release-lands-after-renewal).
func TestReleaseOfUnknownOutcomeNeverRunsAgain(t *testing.T) {
	mem := holding(pastDeadlineTerm())
	step := func(c Call, res client.AcquireResult, err error) {
		t.Helper()
		mem, _ = mem.afterAnswer(request{call: c, holder: us, token: mem.tokenFor(c), ttl: memTTL, heartbeat: memHeartbeat, sent: t0}, res, err, answeredAt)
	}
	step(CallRelease, client.AcquireResult{}, errUnreachable)
	f := mem.intoFacts(Facts{Now: answeredAt, PodsUnknown: true})
	if d := Decide(f); d.Call != CallRecover || d.Pods != PodsStop {
		t.Fatalf("after a failed release with the Pods unknown, Decide() = %+v, want the token renewed while the Pods stop", d)
	}
	step(CallRecover, granted(us, 7), nil)
	for _, f := range []Facts{
		mem.intoFacts(Facts{Now: answeredAt, GatedPods: 1}),
		mem.intoFacts(Facts{Now: answeredAt, PodsUnknown: true}),
	} {
		if f.MayRun() {
			t.Fatalf("renewed after a release of unknown outcome, the cluster may run again: %s", describe(f))
		}
		if d := Decide(f); d.Pods == PodsUngate {
			t.Fatalf("renewed after a release of unknown outcome, Decide(%s) = %+v ungates", describe(f), d)
		}
	}
	if d := Decide(mem.intoFacts(Facts{Now: answeredAt, GatedPods: 1})); d.Call != CallRelease {
		t.Fatalf("renewed after a release of unknown outcome, nothing running: Decide() = %+v, want the release sent again", d)
	}
}

// bounded is req bounded by the local deadline of the term it presents.
func bounded(req request, deadline time.Time) request {
	req.bound = deadline
	return req
}

func TestHandedOver(t *testing.T) {
	// release sends a release of token 7 from mem as call does.
	release := func(mem tenure, err error) tenure {
		t.Helper()
		req := request{call: CallRelease, holder: us, token: 7, ttl: memTTL, heartbeat: memHeartbeat, sent: t0}
		req.bound = mem.boundFor(req.token, req.sent)
		mem, _ = mem.afterAnswer(req, client.AcquireResult{}, err, answeredAt)
		return mem
	}
	live := holding(grantedTerm(7))
	if got := release(with(live, wasRevoked), nil).handedOver; got != 7 {
		t.Errorf("a revoked term released: handedOver = %d, want 7", got)
	}
	if got := release(live, nil).handedOver; got != 0 {
		t.Errorf("a term released that was not revoked: handedOver = %d, want none", got)
	}
	if got := release(with(live, wasRevoked), errConflict).handedOver; got != 0 {
		t.Errorf("a revoked term no longer ours at its release (expired, taken): handedOver = %d, want none: it was lost", got)
	}
	// The lease API answers a release of an expired term with success too:
	// only the agent's deadline tells a handover from a term that ran out.
	// A self-fence, then a revoked renewal that re-granted the term: live.
	if got := release(with(live, wasRevoked, wasSelfFenced), nil).handedOver; got != 7 {
		t.Errorf("a revoked term renewed after a self-fence, released: handedOver = %d, want 7", got)
	}
	for name, mem := range map[string]tenure{
		"sent past its local deadline": with(holding(pastDeadlineTerm()), wasRevoked, wasSelfFenced),
		"no term known, only a token":  with(releasing(7), wasRevoked),
		"another term's token":         with(holding(grantedTerm(6)), wasRevoked),
	} {
		if got := release(mem, nil).handedOver; got != 0 {
			t.Errorf("a revoked term released, %s: handedOver = %d, want none: it may have expired first", name, got)
		}
	}
}
