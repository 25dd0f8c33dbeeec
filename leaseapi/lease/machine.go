package lease

import (
	"errors"
	"fmt"
	"math"
	"time"

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
)

// Decision is what the state machine decided: whether to write, what, and why.
type Decision struct {
	Next    store.Lease
	Write   bool
	Outcome Outcome
}

// Held reports whether the decision leaves the lease with the caller.
func (d Decision) Held() bool {
	return d.Outcome == OutcomeAcquired || d.Outcome == OutcomeRenewed
}

// DecideAcquire decides an acquire by holder at now. cur has Version zero when
// the key was never seen. A holder's acquire of its own unexpired lease
// renews it and keeps the token, unless the term was revoked: then it is
// refused like anyone else's. A free or expired lease goes to anyone with the
// next token; a lease held by another is left alone.
func DecideAcquire(cur store.Lease, holder string, ttl time.Duration, now time.Time) (Decision, error) {
	switch {
	case cur.Held(now) && cur.Holder == holder && !cur.Revoked:
		return extend(cur, ttl, now), nil
	case cur.Held(now):
		return Decision{Next: cur, Outcome: OutcomeHeldByOther}, nil
	case cur.FencingToken == math.MaxInt32:
		return Decision{Next: cur, Outcome: OutcomeConflict}, fmt.Errorf("%w at %d", ErrTokensExhausted, cur.FencingToken)
	}
	next := cur
	next.Holder = holder
	next.FencingToken = cur.FencingToken + 1
	next.TTL = ttl
	next.AcquiredAt = now
	next.RenewedAt = now
	next.ExpiresAt = now.Add(ttl)
	next.Revoked = false
	return Decision{Next: next, Write: true, Outcome: OutcomeAcquired}, nil
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
		return Decision{Next: free(cur), Write: true, Outcome: OutcomeReleased}, nil
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

// DecideExpire frees a lease whose term has ended, so that lists and metrics
// tell the truth; it leaves every other lease alone.
func DecideExpire(cur store.Lease, now time.Time) Decision {
	if cur.Holder == "" || cur.Held(now) {
		return Decision{Next: cur}
	}
	return Decision{Next: free(cur), Write: true, Outcome: OutcomeExpired}
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

func free(cur store.Lease) store.Lease {
	next := cur
	next.Holder = ""
	next.Revoked = false
	return next
}

// visible is the record as a caller should see it at now: an expired term
// shows no holder even before the sweep has written that down.
func visible(cur store.Lease, now time.Time) store.Lease {
	if cur.Holder != "" && !cur.Held(now) {
		return free(cur)
	}
	return cur
}
