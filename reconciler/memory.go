package reconciler

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/leaseapi/client"
)

// memory is what the reconciler keeps of one BerthLease between reconciles;
// a term's deadline lives on the monotonic clock, so it cannot be stored in
// status. What it remembers of the lease (its tenure) changes only through
// tenure's pure transitions; the rest is the reconciler's bookkeeping.
type memory struct {
	// name is the BerthLease's namespace and name.
	name types.NamespacedName
	// key is the lease the BerthLease names ("namespace/leaseName"): what
	// the lease API's change stream reports.
	key string
	// mu guards tenure and batch: the renewer changes the tenure of a
	// running term between reconciles (read, update).
	mu     sync.Mutex
	tenure tenure
	// batch says how the renewer renews the term while it runs (nil: the
	// reconcile renews it itself, or there is none). Only the reconcile sets
	// it, at its end.
	batch *batchSpec
	// waiting says how the acquirer may take the lease over when the change
	// stream reports it free (nil: only the reconcile acquires). Only the
	// reconcile sets it, at its end; the acquirer clears it when it acts.
	waiting *batchSpec
	// fenceWoken is the term whose passed deadline the renewer has woken
	// the reconcile for (once per term).
	fenceWoken *Term
	// fencedToken is the token of the latest term of this BerthLease under
	// which Pods may run under berth-fence with local deadlines up to its
	// expiry, whether or not the agent sees them (a Pod deleted while its
	// node is cut off, or forced). Such a term is given up by revoking it
	// instead of releasing it (fencedTerm). Carried over to a BerthLease
	// made anew under the same name, as the term is.
	fencedToken atomic.Int32
	// givenUp is the token of the fenced term this cluster last gave up by
	// revoking it: until it expires, an acquire finds it held by this
	// cluster, revoked, and that is a term to wait out, not one to hand over.
	givenUp atomic.Int32
	// holdOffUntil (Unix nanoseconds on the reconciler's clock): after giving
	// a fenced term up, this cluster does not ask for the lease again until
	// that term has surely ended and a heartbeat more has passed, so that the
	// clusters woken by its end take it first. Without it, the cluster the
	// term was revoked from (or that was cordoned, or whose BerthLease was
	// made anew) would race them for the lease at the term's expiry, and
	// could win it back. Only ever delays an acquire.
	holdOffUntil atomic.Int64
	// last is the BerthLease as last read: what is known of it if it
	// vanishes (reconcileGone).
	last *berthv1alpha1.BerthLease
	// gone: the BerthLease is gone from the API server (reconcileGone); its
	// status can no longer be written.
	gone bool
	// superseded: a BerthLease of the same name but another lease was made
	// since; this memory's term is settled as a vanished BerthLease's, for
	// the Pods stamped with its UID only.
	superseded bool
	// placement is what placement keeps of the term (place).
	placement placementMemory
}

// tenure is what the agent remembers of its hold on one lease at the lease
// API: the term it measures, the tokens it may still hold without one, and
// the lease API's last answer. It is a value: every change is a pure
// transition below that returns the next tenure, and the I/O around it
// (observe, call, dropTerm) only reads the world, sends the request and
// logs what the transition reports.
type tenure struct {
	// started: status was consulted once for a term to recover.
	started bool
	// term is never changed in place: a transition that changes it makes a
	// new one, so Facts taken earlier keep what they saw.
	term         *Term
	recoverToken int32
	// recoverDeadline is Facts.RecoverDeadline.
	recoverDeadline time.Time
	releaseToken    int32
	// releaseSent is a token whose release was sent without a known
	// outcome (an error other than a conflict): the release may still land
	// at the lease API at any time (a request delayed, or retried, past the
	// call's timeout), and would free the term then. So the term it names
	// never runs Pods again: renewed, it stays a token to release.
	releaseSent int32
	// observed is the lease API's last answer, for status.
	observed client.AcquireResult
	// apiErr is the last lease API error, cleared by the next success.
	apiErr error
	// selfFenced records that the local deadline passed without a renewal.
	selfFenced bool
	// revoked: the lease API said the term (or the token to release) was
	// revoked; the cluster hands it over.
	revoked bool
	// handedOver is the last revoked (or moved) term this agent released
	// itself, once its Pods had stopped: given up on purpose, not lost.
	handedOver int32
}

// read is the tenure as it is now.
func (m *memory) read() tenure {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tenure
}

// update replaces the tenure with what transition makes of it, atomically
// with respect to the renewer.
func (m *memory) update(transition func(tenure) tenure) tenure {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tenure = transition(m.tenure)
	return m.tenure
}

// holds reports whether the tenure keeps a term or a token the cluster may
// still hold at the lease API.
func (t tenure) holds() bool {
	return t.term != nil || t.recoverToken > 0 || t.releaseToken > 0
}

// intoFacts fills in the facts the tenure knows: the term, the tokens held
// without one, and whether what is held was revoked.
func (t tenure) intoFacts(f Facts) Facts {
	f.Revoked = t.revoked && (t.term != nil || t.releaseToken > 0)
	f.ReleaseSent = t.releaseSent != 0 && t.holds()
	f.Term = t.term
	f.RecoverToken = t.recoverToken
	f.RecoverDeadline = t.recoverDeadline
	f.ReleaseToken = t.releaseToken
	return f
}

// recoverFromStatus is the tenure on the first look at a BerthLease after
// the agent started: when status says this holder held a token, the token
// is to be recovered. The predecessor's local deadline is unknown to this
// process; the term's last renewal (renewedAt: the lease API's record of
// it, read on the wall clock) bounds it: the validity from that renewal,
// carried onto the monotonic clock by now. Without one (the lease API could
// not be read, or the term is no longer this holder's) the deadline stays
// zero, so the Pods stop first. Later looks change nothing.
func (t tenure) recoverFromStatus(st berthv1alpha1.BerthLeaseStatus, holder string, ttl time.Duration, renewedAt, now time.Time) tenure {
	if t.started {
		return t
	}
	t.started = true
	// Only this cluster's agent records a release in its status, so the
	// token is this cluster's whatever holder status shows: a status write
	// that failed before the release was recorded leaves an older holder.
	if tok := st.ReleasingToken; tok > 0 {
		// A release of this token was sent and never confirmed: it may
		// still land, so the term is only kept while Pods stop, then
		// released again, never run on.
		t.releaseToken, t.releaseSent = tok, tok
		return t
	}
	if st.LeaseState == StateHeld && st.CurrentHolder == holder && st.FencingToken > 0 {
		t.recoverToken = st.FencingToken
		if !renewedAt.IsZero() {
			t.recoverDeadline = now.Add(renewedAt.Add(LocalValidity(ttl)).Sub(now))
		}
	}
	return t
}

// checkDeadline marks the tenure self-fenced once its term's local deadline
// has passed without a renewal, and reports whether that happened now (once
// per term: a renewal clears the mark).
func (t tenure) checkDeadline(now time.Time) (tenure, bool) {
	if t.term == nil || now.Before(t.term.Deadline) || t.selfFenced {
		return t, false
	}
	t.selfFenced = true
	return t, true
}

// callDeadline is the local deadline a lease API call must not outlast: the
// term's, or a recovery's while no term is known (zero for none).
func (t tenure) callDeadline() time.Time {
	if t.term != nil {
		return t.term.Deadline
	}
	return t.recoverDeadline
}

// tokenFor is the fencing token call c presents: the term's for a renew;
// the token to recover, else the one to release, for a recovery; for a
// release the term's, else the token to release, else the one to recover.
// An acquire presents none.
func (t tenure) tokenFor(c Call) int32 {
	switch c {
	case CallRenew:
		return t.term.Token
	case CallRecover:
		if t.recoverToken > 0 {
			return t.recoverToken
		}
		return t.releaseToken
	case CallRelease:
		switch {
		case t.term != nil:
			return t.term.Token
		case t.releaseToken > 0:
			return t.releaseToken
		}
		return t.recoverToken
	}
	return 0
}

// request is one lease API call as it was sent.
type request struct {
	call   Call
	holder string
	// token is the fencing token presented (tokenFor).
	token          int32
	ttl, heartbeat time.Duration
	// sent is when the request was sent, on the monotonic clock: a granted
	// term's local deadline is measured from it.
	sent time.Time
	// bound is the local deadline of the term whose token the call
	// presented, when it had not passed at sent: the call is bounded by it
	// (call), so an answer means the lease API handled the call while that
	// term was live. Zero otherwise.
	bound time.Time
}

// boundFor is a request's bound (see request.bound) for a call presenting
// token, sent at sent.
func (t tenure) boundFor(token int32, sent time.Time) time.Time {
	if t.term == nil || t.term.Token != token || !sent.Before(t.term.Deadline) {
		return time.Time{}
	}
	return t.term.Deadline
}

// change is what a transition did that the caller logs or counts; the
// zero change is nothing to tell.
type change int

const (
	_ change = iota
	// changeFailed: the call failed; the tenure keeps what it may still hold.
	changeFailed
	// changeRevoked: the lease API revoked this cluster's term.
	changeRevoked
	// changeLost: a term this cluster held has another holder, or none.
	changeLost
	// changeReleased: the release succeeded (or the lease was no longer
	// this cluster's to release).
	changeReleased
)

// outcome is what afterAnswer reports for the caller to log.
type outcome struct {
	change change
	// token is the token concerned: the one released or failed to release,
	// the one revoked, the one lost.
	token int32
	// holder is the lease's holder after a loss.
	holder string
	// expiresAt is a revoked term's end at the lease API.
	expiresAt time.Time
}

// afterAnswer is the tenure after the lease API answered req at now with
// res, or failed with err.
//
// Acquire, renew and recover: an error keeps the term (retrying the renew
// soon) and turns a token being recovered into one to release. A grant is a
// term whose local deadline is measured from when the request was sent; a
// term known revoked stays revoked whatever a renewal answers. A
// revocation of a renewed or recovered term keeps it, revoked, renewed while
// the Pods stop; a revocation found by an acquire keeps only its token, to
// release. Anything else loses the term. A token whose release went out
// without a known outcome (releaseSent) is never made a term again: renewed,
// it stays a token to release.
//
// Release: an error other than a conflict keeps the token to release again
// first, and marks it releaseSent; success, or a conflict (the lease is no
// longer this cluster's), forgets every term and token.
func (t tenure) afterAnswer(req request, res client.AcquireResult, err error, now time.Time) (tenure, outcome) {
	if req.call == CallRelease {
		return t.afterRelease(req, err)
	}
	if req.call == CallRecover {
		t.recoverToken = 0
		if err != nil {
			t.releaseToken = req.token
		}
	}
	if err != nil {
		t.apiErr = err
		if t.term != nil {
			retry := *t.term
			retry.RenewDue = now.Add(retryInterval(req.heartbeat))
			t.term = &retry
		}
		return t, outcome{change: changeFailed, token: req.token}
	}
	t.apiErr = nil
	t.observed = res
	if req.token != 0 && req.token == t.releaseSent && res.Holder == req.holder && res.FencingToken == req.token && (res.Acquired || res.Revoked) {
		// Renewed (revoked or not) while a release of it may still land:
		// the term outlasts the Pods, but is never run on again.
		var o outcome
		if res.Revoked && !t.revoked {
			o = outcome{change: changeRevoked, token: res.FencingToken, expiresAt: res.ExpiresAt}
		}
		t.releaseToken = req.token
		t.revoked = t.revoked || res.Revoked
		return t, o
	}
	granted := func() *Term {
		return &Term{Holder: req.holder, Token: res.FencingToken, Deadline: req.sent.Add(LocalValidity(req.ttl)), RenewDue: req.sent.Add(req.heartbeat)}
	}
	if res.Acquired && res.Holder == req.holder {
		// The lease API never takes a revocation back: an answer that shows
		// the revoked term plain left before the revocation (or this
		// agent's own move) landed, and keeps it revoked.
		stale := t.revoked && t.term != nil && t.term.Token == res.FencingToken
		t.term = granted()
		t.selfFenced, t.revoked, t.releaseToken = false, stale, 0
		return t, outcome{}
	}
	if res.Revoked && res.Holder == req.holder {
		// An administrator revoked this cluster's term: hand it over. A
		// renew of it still extends it (its Pods may not be gone yet), so
		// the term is kept, revoked, and renewed while they stop; an
		// acquire does not, so only its token is kept. Decide stops the
		// Pods first, then releases. It is news once per term.
		var o outcome
		if t.term == nil || !t.revoked {
			o = outcome{change: changeRevoked, token: res.FencingToken, expiresAt: res.ExpiresAt}
		}
		t.revoked = true
		if req.call != CallAcquire && res.FencingToken == req.token {
			t.term = granted()
			t.releaseToken = 0
			return t, o
		}
		t.releaseToken = res.FencingToken
		t.term = nil
		return t, o
	}
	var o outcome
	if t.term != nil {
		o = outcome{change: changeLost, token: t.term.Token, holder: res.Holder}
	}
	t.term, t.revoked = nil, false
	return t, o
}

// moved is the tenure after this agent moved its term of token at the
// lease API (placement): revoked, as a renewal would next answer, so that
// it is handed over at once.
func (t tenure) moved(token int32) tenure {
	if t.term != nil && t.term.Token == token {
		t.revoked = true
	}
	return t
}

// afterRelease is afterAnswer for a release of req.token.
func (t tenure) afterRelease(req request, err error) (tenure, outcome) {
	token := req.token
	if err != nil && !errors.Is(err, client.ErrConflict) {
		// Keep the token: the release is retried before anything else,
		// and the term is never run on again (releaseSent).
		t.apiErr = err
		t.releaseToken, t.releaseSent = token, token
		t.term = nil
		return t, outcome{change: changeFailed, token: token}
	}
	if err == nil && t.revoked && !req.bound.IsZero() {
		// Handed over on purpose. The lease API also answers a release of
		// a term that has already expired (the lease is free) with
		// success: only a release answered within the term's local
		// deadline landed on a live term. Anything else (sent past the
		// deadline, or of a token without a known term) may have expired
		// first, and is reported lost.
		t.handedOver = token
	}
	t.apiErr = nil
	t.term, t.recoverToken, t.releaseToken, t.releaseSent, t.revoked = nil, 0, 0, 0, false
	t.observed = client.AcquireResult{FencingToken: token}
	return t, outcome{change: changeReleased, token: token}
}

// dropTerm forgets the term and every token without releasing them
// (another BerthLease names the same lease and keeps renewing it, or it
// expires). It reports the token let go of, for the log.
func (t tenure) dropTerm() (tenure, int32) {
	token := t.releaseToken
	if t.term != nil {
		token = t.term.Token
	}
	token = max(token, t.recoverToken)
	t.term, t.recoverToken, t.releaseToken, t.releaseSent, t.revoked = nil, 0, 0, 0, false
	t.observed = client.AcquireResult{}
	return t, token
}

// carriedOver is what a BerthLease made anew under an earlier one's name
// takes over of the earlier one's tenure of the same lease: its term and
// tokens, whether they were revoked, and the last answer. It counts as
// started (status is the earlier one's story, already told), and its
// failures and self-fencing start afresh. A token to recover loses its
// deadline, so that the Pods stop before it is renewed.
func (t tenure) carriedOver() tenure {
	return tenure{
		started:      true,
		term:         t.term,
		recoverToken: t.recoverToken,
		releaseToken: t.releaseToken,
		releaseSent:  t.releaseSent,
		revoked:      t.revoked,
		observed:     t.observed,
	}
}

// gaveUp records that this cluster gave up the fenced term of token by
// revoking it, and holds its next acquire off until until.
func (m *memory) gaveUp(token int32, until time.Time) {
	m.givenUp.Store(token)
	m.holdOffUntil.Store(until.UnixNano())
}

// holdingOff reports whether this cluster lets the others take the lease
// first at now (holdOffUntil).
func (m *memory) holdingOff(now time.Time) bool {
	return now.UnixNano() < m.holdOffUntil.Load()
}
