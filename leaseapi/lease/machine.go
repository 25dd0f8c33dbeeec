package lease

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// Outcome is what an operation did; it is also the metric label.
type Outcome string

const (
	// OutcomeAcquired: a new term began with a new fencing token.
	OutcomeAcquired Outcome = "acquired"
	// OutcomeRenewed: the caller's current term was extended.
	OutcomeRenewed Outcome = "renewed"
	// OutcomeHeldByOther: acquire found the lease held by someone else.
	OutcomeHeldByOther Outcome = "held-by-other"
	// OutcomeLost: renew by a caller that no longer holds the lease.
	OutcomeLost Outcome = "lost"
	// OutcomeReleased: the holder gave the lease up (or it was already free).
	OutcomeReleased Outcome = "released"
	// OutcomeRevoked: an administrator revoked the holder's live term (or it
	// was already revoked); the term ends when its holder releases it or at
	// its expiry.
	OutcomeRevoked Outcome = "revoked"
	// OutcomeMoved: the holder's live term was moved: revoked, and the
	// lease reserved for the move's destination once the term ends (or it
	// was already moving there).
	OutcomeMoved Outcome = "moved"
	// OutcomeUnreserved: the sweep cleared a reservation that ran out, so
	// that watches and long polls wake the clusters it held back.
	OutcomeUnreserved Outcome = "unreserved"
	// OutcomeConflict: the request contradicts the lease's state (release by
	// a non-holder, tokens exhausted, cordoned cluster).
	OutcomeConflict Outcome = "conflict"
	// OutcomeExpired: the sweep freed a lease whose term ended.
	OutcomeExpired Outcome = "expired"
	// OutcomeGraced: a restart extended a holder's term.
	OutcomeGraced Outcome = "graced"
)

var (
	// ErrNotHolder: a release named a holder or token that does not hold the lease.
	ErrNotHolder = errors.New("lease is not held by this holder and token")
	// ErrTokensExhausted: the fencing token reached its int32 maximum, so
	// the lease can never be granted again without reusing a token.
	ErrTokensExhausted = errors.New("fencing tokens exhausted")
	// ErrCordoned: the holder's cluster is cordoned and may not take new leases.
	ErrCordoned = errors.New("cluster is cordoned")
	// ErrMoving: a move named another destination than the one the term is
	// already moving to.
	ErrMoving = errors.New("term is already moving to another cluster")
	// ErrMoveTarget: a move's destination is not registered or is cordoned.
	ErrMoveTarget = errors.New("cluster may not take the lease")
)

// MinReservation is the least time a moved term's end reserves the lease
// for its destination, however short the term's TTL.
const MinReservation = 5 * time.Second

// Decision is what the state machine decided: whether to write, what, and why.
type Decision struct {
	Next    store.Lease
	Write   bool
	Outcome Outcome
	// Ended is the term the write ends, for the lease's history.
	Ended *store.Term
}

// Held reports whether the decision leaves the lease with the caller.
func (d Decision) Held() bool {
	return d.Outcome == OutcomeAcquired || d.Outcome == OutcomeRenewed
}

// DecideAcquire decides an acquire by holder at now. cur has Version zero when
// the key was never seen. A holder's acquire of its own unexpired lease
// renews it and keeps the token, unless the term was revoked: then it is
// refused like anyone else's. A free or expired lease goes to anyone with the
// next token, unless a reservation withholds it from holder: then the answer
// is as for a held lease, with the reservation in Next. A lease held by
// another is left alone. The reservation is checked only after the lease
// is known to be free, so it can refuse a grant but never make one.
func DecideAcquire(cur store.Lease, holder string, ttl time.Duration, now time.Time) (Decision, error) {
	switch {
	case cur.Held(now) && cur.Holder == holder && !cur.Revoked:
		return extend(cur, ttl, now), nil
	case cur.Held(now):
		return Decision{Next: cur, Outcome: OutcomeHeldByOther}, nil
	}
	// Free, or a term that expired and was not swept yet: its end (and the
	// reservation a move leaves) is written down with the new term.
	freed, ended := cur, (*store.Term)(nil)
	if cur.Holder != "" {
		freed, ended = end(cur, now)
	}
	switch {
	case cur.FencingToken == math.MaxInt32:
		return Decision{Next: cur, Outcome: OutcomeConflict}, fmt.Errorf("%w at %d", ErrTokensExhausted, cur.FencingToken)
	case !Admits(freed.Reserved, holder, now):
		return Decision{Next: freed, Outcome: OutcomeHeldByOther}, nil
	}
	next := freed
	next.Reserved = store.Reservation{}
	next.Holder = holder
	next.FencingToken = cur.FencingToken + 1
	next.TTL = ttl
	next.AcquiredAt = now
	next.RenewedAt = now
	next.ExpiresAt = now.Add(ttl)
	next.Revoked = false
	return Decision{Next: next, Write: true, Outcome: OutcomeAcquired, Ended: ended}, nil
}

// Admits reports whether reservation r lets holder be granted a free lease
// at now: always once r has run out, else only a holder of r.For's cluster,
// or of any cluster but r.Except's.
func Admits(r store.Reservation, holder string, now time.Time) bool {
	if !now.Before(r.Until) {
		return true
	}
	switch c := leaseapi.HolderCluster(holder); {
	case r.For != "":
		return c == r.For
	case r.Except != "":
		return c != r.Except
	}
	return true
}

// DecideRenew decides a renew. Only the holder of the current, unexpired term
// with its token renews; anyone else learns that the lease is lost and who
// holds it now. A revoked term is still extended for its holder, because its
// Pods may not be gone yet (a node that cannot confirm their deletion) and
// the term must outlast them, but the answer never says it is held: it shows
// the holder its own term and the revocation, its cue to stop and release.
// The mark stays, so the term never becomes a plain one again.
func DecideRenew(cur store.Lease, holder string, token int32, ttl time.Duration, now time.Time) Decision {
	if !cur.Held(now) || cur.Holder != holder || cur.FencingToken != token {
		return Decision{Next: visible(cur, now), Outcome: OutcomeLost}
	}
	d := extend(cur, ttl, now)
	if cur.Revoked {
		d.Outcome = OutcomeRevoked
	}
	return d
}

// DecideRelease decides a release at now. Releasing the caller's own term,
// even one that expired but was not yet swept, frees it and keeps the token.
// Releasing a free lease (never seen, released, or expired) succeeds without a
// write, whether or not the sweep has run. Anything else is ErrNotHolder.
func DecideRelease(cur store.Lease, holder string, token int32, now time.Time) (Decision, error) {
	own := cur.Holder == holder && cur.FencingToken == token
	switch {
	case cur.Holder != "" && own:
		next, ended := end(cur, now)
		return Decision{Next: next, Write: true, Outcome: OutcomeReleased, Ended: ended}, nil
	case !cur.Held(now):
		return Decision{Next: visible(cur, now), Outcome: OutcomeReleased}, nil
	}
	return Decision{Next: cur, Outcome: OutcomeConflict}, ErrNotHolder
}

// DecideRevoke decides a revocation of holder's term with token (an
// administrator's release). A live term is not freed: its holder may still
// be running, and only the holder knows when it has stopped. The term is
// marked revoked instead, keeping its holder, token and expiry; only its
// holder may extend it further (DecideRenew), never be granted it again, and
// it ends when its holder releases it (a handover) or at its expiry. Revoking a revoked
// term changes nothing. A term that has already ended is freed as
// DecideRelease frees it; a free lease or another term is as DecideRelease
// has it.
func DecideRevoke(cur store.Lease, holder string, token int32, now time.Time) (Decision, error) {
	if !cur.Held(now) || cur.Holder != holder || cur.FencingToken != token {
		return DecideRelease(cur, holder, token, now)
	}
	if cur.Revoked {
		return Decision{Next: cur, Outcome: OutcomeRevoked}, nil
	}
	next := cur
	next.Revoked = true
	return Decision{Next: next, Write: true, Outcome: OutcomeRevoked}, nil
}

// DecideMove decides a move of holder's term with token, to cluster to
// (empty: any cluster but the holder's). A live term is revoked as
// DecideRevoke revokes it, so that its holder stops and hands it over, and
// marked moving: when it ends (its holder's release, or its expiry), the
// lease is reserved for the destination for one TTL (end). A move never
// ends a term itself, so it can never free one early.
//
// A term already moving keeps its destination: a move naming the same one,
// or none, changes nothing, and one naming another is ErrMoving, so that an
// agent's automatic move cannot redirect an administrator's (or the other
// way round) and a retried request is harmless. The one change allowed is
// to name a destination for a term moving to any other cluster: that only
// narrows the first move. A revoked term that is not moving yet may be
// moved: it was ending anyway, and the move adds the reservation.
//
// Anything but the live term of holder with token is answered as
// DecideRevoke answers it: nothing to move on a free lease, ErrNotHolder
// for another term.
func DecideMove(cur store.Lease, holder string, token int32, to string, now time.Time) (Decision, error) {
	if !cur.Held(now) || cur.Holder != holder || cur.FencingToken != token {
		return DecideRevoke(cur, holder, token, now)
	}
	switch {
	case to != "" && to == leaseapi.HolderCluster(holder):
		return Decision{Next: cur, Outcome: OutcomeConflict}, fmt.Errorf("%w: %s is the holder's own cluster", ErrMoveTarget, to)
	case cur.Moving && (to == "" || to == cur.MoveTo):
		return Decision{Next: cur, Outcome: OutcomeMoved}, nil
	case cur.Moving && cur.MoveTo != "":
		return Decision{Next: cur, Outcome: OutcomeConflict}, fmt.Errorf("%w: moving to %s", ErrMoving, cur.MoveTo)
	}
	next := cur
	next.Revoked = true
	next.Moving = true
	next.MoveTo = to
	return Decision{Next: next, Write: true, Outcome: OutcomeMoved}, nil
}

// DecideExpire frees a lease whose term has ended, so that lists and metrics
// tell the truth, and clears a reservation that has run out, so that the
// clusters it held back hear of it (watches and long polls wake at
// writes); it leaves every other lease alone.
func DecideExpire(cur store.Lease, now time.Time) Decision {
	switch {
	case cur.Holder != "" && !cur.Held(now):
		next, ended := end(cur, now)
		return Decision{Next: next, Write: true, Outcome: OutcomeExpired, Ended: ended}
	case cur.Holder == "" && !cur.Reserved.IsZero() && !now.Before(cur.Reserved.Until):
		next := cur
		next.Reserved = store.Reservation{}
		return Decision{Next: next, Write: true, Outcome: OutcomeUnreserved}
	}
	return Decision{Next: cur}
}

// DecideGrace extends a held lease to at least one TTL past now. A server
// calls it for every held lease when it starts, so that its own downtime never
// moves a lease: the holder gets one full term to renew again. A revoked term
// gets it too: its holder may be stopping Pods it renews the term for.
func DecideGrace(cur store.Lease, now time.Time) Decision {
	if cur.Holder == "" || cur.TTL <= 0 || !cur.ExpiresAt.Before(now.Add(cur.TTL)) {
		return Decision{Next: cur}
	}
	next := cur
	next.ExpiresAt = now.Add(cur.TTL)
	return Decision{Next: next, Write: true, Outcome: OutcomeGraced}
}

// extend renews cur for ttl from now, but never ends the term earlier than it
// already ends: a renewal with a shorter TTL (spec.ttlSeconds lowered on a
// live BerthLease) would otherwise pull the expiry in under whoever was told
// the old one, such as a fenced Pod whose deadline came from a confirmation
// (docs/fencing.md), and another cluster could be granted the lease while it
// still runs. The shorter TTL applies from the next renewal that reaches past
// the old expiry.
func extend(cur store.Lease, ttl time.Duration, now time.Time) Decision {
	next := cur
	next.TTL = ttl
	next.RenewedAt = now
	if until := now.Add(ttl); until.After(cur.ExpiresAt) {
		next.ExpiresAt = until
	}
	return Decision{Next: next, Write: true, Outcome: OutcomeRenewed}
}

// end ends cur's term at now: by its holder's release while it is live,
// else by its expiry, at its ExpiresAt. It returns the freed record, with
// the reservation a moving term leaves (unless that has run out by now),
// and the term as history records it.
func end(cur store.Lease, now time.Time) (store.Lease, *store.Term) {
	ending, at := store.EndReleased, now
	if !cur.Held(now) {
		ending, at = store.EndExpired, cur.ExpiresAt
	}
	switch {
	case cur.Moving:
		ending = store.EndMoved
	case cur.Revoked:
		ending = store.EndRevoked
	}
	next := cur
	next.Holder = ""
	next.Revoked = false
	next.Moving = false
	next.MoveTo = ""
	next.Reserved = store.Reservation{}
	if r := reservationAfter(cur, at); now.Before(r.Until) {
		next.Reserved = r
	}
	return next, &store.Term{Holder: cur.Holder, FencingToken: cur.FencingToken, AcquiredAt: cur.AcquiredAt, EndedAt: at, Ending: ending}
}

// reservationAfter is the reservation a term leaves when it ends at at:
// none unless it was moving; else one TTL of the term (at least
// MinReservation) for the move's destination, or for any cluster but the
// one it moved from. A TTL is long enough for a waiting agent to hear of
// the free lease and ask for it, short enough that a destination that
// never asks delays the others by no more than one expiry would.
func reservationAfter(cur store.Lease, at time.Time) store.Reservation {
	if !cur.Moving {
		return store.Reservation{}
	}
	r := store.Reservation{Until: at.Add(max(cur.TTL, MinReservation))}
	if cur.MoveTo != "" {
		r.For = cur.MoveTo
	} else {
		r.Except = leaseapi.HolderCluster(cur.Holder)
	}
	return r
}

// visible is the record as a caller should see it at now: an expired term
// shows no holder (and the reservation its end leaves) even before the
// sweep has written that down, and a reservation that has run out shows
// no more.
func visible(cur store.Lease, now time.Time) store.Lease {
	if cur.Holder != "" && !cur.Held(now) {
		cur, _ = end(cur, now)
	}
	if !cur.Reserved.IsZero() && !now.Before(cur.Reserved.Until) {
		cur.Reserved = store.Reservation{}
	}
	return cur
}
