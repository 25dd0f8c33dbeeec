package lease

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// t0 is the instant every table case is decided at, unless it says otherwise.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const ttl = 10 * time.Second

// neverSeen is the record the service hands the machine for a key the store
// does not know: version zero, no holder, no token.
func neverSeen() store.Lease { return store.Lease{Namespace: "ns", Name: "lease"} }

// released is a record whose last term (token 3) was released.
func released() store.Lease {
	l := neverSeen()
	l.FencingToken = 3
	l.TTL = ttl
	l.AcquiredAt = t0.Add(-time.Minute)
	l.RenewedAt = t0.Add(-50 * time.Second)
	l.ExpiresAt = t0.Add(-40 * time.Second)
	l.Version = 7
	return l
}

// heldBy is a record whose term with token 3 began at t0-5s and ends at expiresAt.
func heldBy(holder string, expiresAt time.Time) store.Lease {
	l := neverSeen()
	l.Holder = holder
	l.FencingToken = 3
	l.TTL = ttl
	l.AcquiredAt = t0.Add(-5 * time.Second)
	l.RenewedAt = t0.Add(-5 * time.Second)
	l.ExpiresAt = expiresAt
	l.Version = 7
	return l
}

func withToken(l store.Lease, token int32) store.Lease {
	l.FencingToken = token
	return l
}

// newTerm is cur granted to holder at now with token.
func newTerm(cur store.Lease, holder string, token int32, ttl time.Duration, now time.Time) store.Lease {
	cur.Holder = holder
	cur.FencingToken = token
	cur.TTL = ttl
	cur.AcquiredAt = now
	cur.RenewedAt = now
	cur.ExpiresAt = now.Add(ttl)
	return cur
}

// extended is cur's term extended at now by ttl, keeping token and AcquiredAt;
// it ends at now+ttl or at its old expiry, whichever is later.
func extended(cur store.Lease, ttl time.Duration, now time.Time) store.Lease {
	cur.TTL = ttl
	cur.RenewedAt = now
	if now.Add(ttl).After(cur.ExpiresAt) {
		cur.ExpiresAt = now.Add(ttl)
	}
	return cur
}

func freed(cur store.Lease) store.Lease {
	cur.Holder = ""
	cur.Revoked = false
	return cur
}

// endedTerm is cur's term as history records it, ended at at.
func endedTerm(cur store.Lease, ending store.Ending, at time.Time) *store.Term {
	return &store.Term{Holder: cur.Holder, FencingToken: cur.FencingToken, AcquiredAt: cur.AcquiredAt, EndedAt: at, Ending: ending}
}

// revoked is cur with its term revoked.
func revoked(cur store.Lease) store.Lease {
	cur.Revoked = true
	return cur
}

func TestDecideAcquire(t *testing.T) {
	live := t0.Add(5 * time.Second)
	cases := map[string]struct {
		cur      store.Lease
		holder   string
		ttl      time.Duration
		now      time.Time
		want     Decision
		wantErr  error
		wantHeld bool
	}{
		"never seen: token 1": {
			cur: neverSeen(), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(neverSeen(), "a", 1, ttl, t0), Write: true, Outcome: OutcomeAcquired},
			wantHeld: true,
		},
		"released: next token": {
			cur: released(), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(released(), "a", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired},
			wantHeld: true,
		},
		"held by self: renews and keeps token": {
			cur: heldBy("a", live), holder: "a", ttl: 30 * time.Second, now: t0,
			want:     Decision{Next: extended(heldBy("a", live), 30*time.Second, t0), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
		"held by self one nanosecond before expiry: renews": {
			cur: heldBy("a", t0.Add(time.Nanosecond)), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: extended(heldBy("a", t0.Add(time.Nanosecond)), ttl, t0), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
		"held by self, expired exactly at the boundary: new term": {
			cur: heldBy("a", t0), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(heldBy("a", t0), "a", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired, Ended: endedTerm(heldBy("a", t0), store.EndExpired, t0)},
			wantHeld: true,
		},
		"held by other: left alone": {
			cur: heldBy("b", live), holder: "a", ttl: ttl, now: t0,
			want: Decision{Next: heldBy("b", live), Outcome: OutcomeHeldByOther},
		},
		"held by other one nanosecond before expiry: left alone": {
			cur: heldBy("b", t0.Add(time.Nanosecond)), holder: "a", ttl: ttl, now: t0,
			want: Decision{Next: heldBy("b", t0.Add(time.Nanosecond)), Outcome: OutcomeHeldByOther},
		},
		"held by other, expired exactly at the boundary: taken with next token": {
			cur: heldBy("b", t0), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(heldBy("b", t0), "a", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired, Ended: endedTerm(heldBy("b", t0), store.EndExpired, t0)},
			wantHeld: true,
		},
		"held by other, long expired and not swept: taken": {
			cur: heldBy("b", t0.Add(-time.Hour)), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(heldBy("b", t0.Add(-time.Hour)), "a", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired, Ended: endedTerm(heldBy("b", t0.Add(-time.Hour)), store.EndExpired, t0.Add(-time.Hour))},
			wantHeld: true,
		},
		"holder that only shares a prefix is another holder": {
			cur: heldBy("a/x", live), holder: "a", ttl: ttl, now: t0,
			want: Decision{Next: heldBy("a/x", live), Outcome: OutcomeHeldByOther},
		},
		"free at one below the ceiling: granted the maximum": {
			cur: withToken(released(), math.MaxInt32-1), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(released(), "a", math.MaxInt32, ttl, t0), Write: true, Outcome: OutcomeAcquired},
			wantHeld: true,
		},
		"free at the ceiling: refused, never wrapped": {
			cur: withToken(released(), math.MaxInt32), holder: "a", ttl: ttl, now: t0,
			want:    Decision{Next: withToken(released(), math.MaxInt32), Outcome: OutcomeConflict},
			wantErr: ErrTokensExhausted,
		},
		"expired at the ceiling: refused": {
			cur: withToken(heldBy("b", t0), math.MaxInt32), holder: "a", ttl: ttl, now: t0,
			want:    Decision{Next: withToken(heldBy("b", t0), math.MaxInt32), Outcome: OutcomeConflict},
			wantErr: ErrTokensExhausted,
		},
		"held by self at the ceiling: still renews": {
			cur: withToken(heldBy("a", live), math.MaxInt32), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: extended(withToken(heldBy("a", live), math.MaxInt32), ttl, t0), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
		"revoked, by its holder: refused, shows the revoked term": {
			cur: revoked(heldBy("a", live)), holder: "a", ttl: ttl, now: t0,
			want: Decision{Next: revoked(heldBy("a", live)), Outcome: OutcomeHeldByOther},
		},
		"revoked, by another before it ends: held by other": {
			cur: revoked(heldBy("b", live)), holder: "a", ttl: ttl, now: t0,
			want: Decision{Next: revoked(heldBy("b", live)), Outcome: OutcomeHeldByOther},
		},
		"revoked, ended and not swept: a new term without the mark": {
			cur: revoked(heldBy("b", t0)), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(heldBy("b", t0), "a", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired, Ended: endedTerm(heldBy("b", t0), store.EndRevoked, t0)},
			wantHeld: true,
		},
		"revoked, ended: its old holder begins a new term": {
			cur: revoked(heldBy("a", t0)), holder: "a", ttl: ttl, now: t0,
			want:     Decision{Next: newTerm(heldBy("a", t0), "a", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired, Ended: endedTerm(heldBy("a", t0), store.EndRevoked, t0)},
			wantHeld: true,
		},
		"held by other at the ceiling: held by other, not exhausted": {
			cur: withToken(heldBy("b", live), math.MaxInt32), holder: "a", ttl: ttl, now: t0,
			want: Decision{Next: withToken(heldBy("b", live), math.MaxInt32), Outcome: OutcomeHeldByOther},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecideAcquire(tc.cur, tc.holder, tc.ttl, tc.now)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if got.Held() != tc.wantHeld {
				t.Errorf("Held() = %v, want %v", got.Held(), tc.wantHeld)
			}
		})
	}
}

func TestDecideRenew(t *testing.T) {
	live := t0.Add(5 * time.Second)
	cases := map[string]struct {
		cur      store.Lease
		holder   string
		token    int32
		ttl      time.Duration
		want     Decision
		wantHeld bool
	}{
		"holder with its token: extended, token kept": {
			cur: heldBy("a", live), holder: "a", token: 3, ttl: 20 * time.Second,
			want:     Decision{Next: extended(heldBy("a", live), 20*time.Second, t0), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
		"a shorter TTL: the expiry is not pulled in": {
			cur: heldBy("a", t0.Add(time.Minute)), holder: "a", token: 3, ttl: 6 * time.Second,
			want: Decision{Next: func() store.Lease {
				l := heldBy("a", t0.Add(time.Minute))
				l.TTL, l.RenewedAt = 6*time.Second, t0
				return l
			}(), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
		"one nanosecond before expiry: extended": {
			cur: heldBy("a", t0.Add(time.Nanosecond)), holder: "a", token: 3, ttl: ttl,
			want:     Decision{Next: extended(heldBy("a", t0.Add(time.Nanosecond)), ttl, t0), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
		"expired exactly at the boundary: lost, shown free": {
			cur: heldBy("a", t0), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: freed(heldBy("a", t0)), Outcome: OutcomeLost},
		},
		"long expired: lost, shown free with token kept": {
			cur: heldBy("a", t0.Add(-time.Hour)), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: freed(heldBy("a", t0.Add(-time.Hour))), Outcome: OutcomeLost},
		},
		"mismatched token (an older term): lost": {
			cur: heldBy("a", live), holder: "a", token: 2, ttl: ttl,
			want: Decision{Next: heldBy("a", live), Outcome: OutcomeLost},
		},
		"token from the future: lost": {
			cur: heldBy("a", live), holder: "a", token: 4, ttl: ttl,
			want: Decision{Next: heldBy("a", live), Outcome: OutcomeLost},
		},
		"held by other: lost, shows the current holder": {
			cur: heldBy("b", live), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: heldBy("b", live), Outcome: OutcomeLost},
		},
		"released: lost": {
			cur: released(), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: released(), Outcome: OutcomeLost},
		},
		"never seen: lost": {
			cur: neverSeen(), holder: "a", token: 1, ttl: ttl,
			want: Decision{Next: neverSeen(), Outcome: OutcomeLost},
		},
		"revoked, its holder with its token: extended while it stops, never held, the mark kept": {
			cur: revoked(heldBy("a", live)), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: extended(revoked(heldBy("a", live)), ttl, t0), Write: true, Outcome: OutcomeRevoked},
		},
		"revoked, another with its token: lost": {
			cur: revoked(heldBy("b", live)), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: revoked(heldBy("b", live)), Outcome: OutcomeLost},
		},
		"revoked and ended: lost, shown free without the mark": {
			cur: revoked(heldBy("a", t0)), holder: "a", token: 3, ttl: ttl,
			want: Decision{Next: freed(heldBy("a", t0)), Outcome: OutcomeLost},
		},
		"at the ceiling: extended": {
			cur: withToken(heldBy("a", live), math.MaxInt32), holder: "a", token: math.MaxInt32, ttl: ttl,
			want:     Decision{Next: extended(withToken(heldBy("a", live), math.MaxInt32), ttl, t0), Write: true, Outcome: OutcomeRenewed},
			wantHeld: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := DecideRenew(tc.cur, tc.holder, tc.token, tc.ttl, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if got.Held() != tc.wantHeld {
				t.Errorf("Held() = %v, want %v", got.Held(), tc.wantHeld)
			}
		})
	}
}

func TestDecideRelease(t *testing.T) {
	live := t0.Add(5 * time.Second)
	cases := map[string]struct {
		cur     store.Lease
		holder  string
		token   int32
		want    Decision
		wantErr error
	}{
		"never seen: released without a write": {
			cur: neverSeen(), holder: "a", token: 1,
			want: Decision{Next: neverSeen(), Outcome: OutcomeReleased},
		},
		"already released: released without a write": {
			cur: released(), holder: "a", token: 3,
			want: Decision{Next: released(), Outcome: OutcomeReleased},
		},
		"own live term: freed, token kept": {
			cur: heldBy("a", live), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("a", live)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(heldBy("a", live), store.EndReleased, t0)},
		},
		"own term expired but not swept: freed": {
			cur: heldBy("a", t0.Add(-time.Hour)), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("a", t0.Add(-time.Hour))), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(heldBy("a", t0.Add(-time.Hour)), store.EndExpired, t0.Add(-time.Hour))},
		},
		"own term at the ceiling: freed, token kept": {
			cur: withToken(heldBy("a", live), math.MaxInt32), holder: "a", token: math.MaxInt32,
			want: Decision{Next: freed(withToken(heldBy("a", live), math.MaxInt32)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(withToken(heldBy("a", live), math.MaxInt32), store.EndReleased, t0)},
		},
		"own revoked term: freed (the handover), mark cleared": {
			cur: revoked(heldBy("a", live)), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("a", live)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(heldBy("a", live), store.EndRevoked, t0)},
		},
		"revoked term of another: not holder": {
			cur: revoked(heldBy("b", live)), holder: "a", token: 3,
			want:    Decision{Next: revoked(heldBy("b", live)), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"mismatched token: not holder": {
			cur: heldBy("a", live), holder: "a", token: 2,
			want:    Decision{Next: heldBy("a", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"held by other: not holder": {
			cur: heldBy("b", live), holder: "a", token: 3,
			want:    Decision{Next: heldBy("b", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"prefix of the holder: not holder": {
			cur: heldBy("a/x", live), holder: "a", token: 3,
			want:    Decision{Next: heldBy("a/x", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"held by other, expired but not swept: free, released without a write": {
			cur: heldBy("b", t0.Add(-time.Hour)), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("b", t0.Add(-time.Hour))), Outcome: OutcomeReleased},
		},
		"held by other, expiring exactly now: free": {
			cur: heldBy("b", t0), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("b", t0)), Outcome: OutcomeReleased},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecideRelease(tc.cur, tc.holder, tc.token, t0)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if got.Held() {
				t.Errorf("Held() = true after a release")
			}
		})
	}
}

func TestDecideRevoke(t *testing.T) {
	live := t0.Add(5 * time.Second)
	cases := map[string]struct {
		cur     store.Lease
		holder  string
		token   int32
		want    Decision
		wantErr error
	}{
		"live term: marked revoked, holder, token and expiry kept": {
			cur: heldBy("a", live), holder: "a", token: 3,
			want: Decision{Next: revoked(heldBy("a", live)), Write: true, Outcome: OutcomeRevoked},
		},
		"live term one nanosecond before expiry: revoked": {
			cur: heldBy("a", t0.Add(time.Nanosecond)), holder: "a", token: 3,
			want: Decision{Next: revoked(heldBy("a", t0.Add(time.Nanosecond))), Write: true, Outcome: OutcomeRevoked},
		},
		"already revoked: no write": {
			cur: revoked(heldBy("a", live)), holder: "a", token: 3,
			want: Decision{Next: revoked(heldBy("a", live)), Outcome: OutcomeRevoked},
		},
		"ended exactly now, not swept: freed like a release": {
			cur: heldBy("a", t0), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("a", t0)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(heldBy("a", t0), store.EndExpired, t0)},
		},
		"revoked and ended, not swept: freed, mark cleared": {
			cur: revoked(heldBy("a", t0)), holder: "a", token: 3,
			want: Decision{Next: freed(heldBy("a", t0)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(heldBy("a", t0), store.EndRevoked, t0)},
		},
		"never seen: released without a write": {
			cur: neverSeen(), holder: "a", token: 1,
			want: Decision{Next: neverSeen(), Outcome: OutcomeReleased},
		},
		"already released: released without a write": {
			cur: released(), holder: "a", token: 3,
			want: Decision{Next: released(), Outcome: OutcomeReleased},
		},
		"an older token: not holder": {
			cur: heldBy("a", live), holder: "a", token: 2,
			want:    Decision{Next: heldBy("a", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"another holder: not holder": {
			cur: heldBy("b", live), holder: "a", token: 3,
			want:    Decision{Next: heldBy("b", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecideRevoke(tc.cur, tc.holder, tc.token, t0)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if got.Held() {
				t.Errorf("Held() = true after a revocation")
			}
		})
	}
}

// moving is cur's term moved to to (empty: anywhere): revoked and marked.
func moving(cur store.Lease, to string) store.Lease {
	cur.Revoked = true
	cur.Moving = true
	cur.MoveTo = to
	return cur
}

// reservedFor is cur freed, with a reservation for cluster to (or, with
// to empty, for any cluster but except's) until until.
func reservedFor(cur store.Lease, to, except string, until time.Time) store.Lease {
	cur = freed(cur)
	cur.Moving, cur.MoveTo = false, ""
	cur.Reserved = store.Reservation{For: to, Except: except, Until: until}
	return cur
}

func TestDecideMove(t *testing.T) {
	live := t0.Add(5 * time.Second)
	cases := map[string]struct {
		cur     store.Lease
		holder  string
		token   int32
		to      string
		want    Decision
		wantErr error
	}{
		"live term to a cluster: revoked and moving, holder, token and expiry kept": {
			cur: heldBy("a", live), holder: "a", token: 3, to: "b",
			want: Decision{Next: moving(heldBy("a", live), "b"), Write: true, Outcome: OutcomeMoved},
		},
		"live term anywhere: revoked and moving": {
			cur: heldBy("a/x", live), holder: "a/x", token: 3,
			want: Decision{Next: moving(heldBy("a/x", live), ""), Write: true, Outcome: OutcomeMoved},
		},
		"revoked term: moving too": {
			cur: revoked(heldBy("a", live)), holder: "a", token: 3, to: "b",
			want: Decision{Next: moving(heldBy("a", live), "b"), Write: true, Outcome: OutcomeMoved},
		},
		"moving to the same cluster: no write": {
			cur: moving(heldBy("a", live), "b"), holder: "a", token: 3, to: "b",
			want: Decision{Next: moving(heldBy("a", live), "b"), Outcome: OutcomeMoved},
		},
		"moving to a cluster, moved anywhere: no write, destination kept": {
			cur: moving(heldBy("a", live), "b"), holder: "a", token: 3,
			want: Decision{Next: moving(heldBy("a", live), "b"), Outcome: OutcomeMoved},
		},
		"moving anywhere, moved to a cluster: narrowed": {
			cur: moving(heldBy("a", live), ""), holder: "a", token: 3, to: "b",
			want: Decision{Next: moving(heldBy("a", live), "b"), Write: true, Outcome: OutcomeMoved},
		},
		"moving to one cluster, moved to another: refused": {
			cur: moving(heldBy("a", live), "b"), holder: "a", token: 3, to: "c",
			want:    Decision{Next: moving(heldBy("a", live), "b"), Outcome: OutcomeConflict},
			wantErr: ErrMoving,
		},
		"to the holder's own cluster: refused": {
			cur: heldBy("a/x", live), holder: "a/x", token: 3, to: "a",
			want:    Decision{Next: heldBy("a/x", live), Outcome: OutcomeConflict},
			wantErr: ErrMoveTarget,
		},
		"another holder: not holder": {
			cur: heldBy("b", live), holder: "a", token: 3, to: "c",
			want:    Decision{Next: heldBy("b", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"an older token: not holder": {
			cur: heldBy("a", live), holder: "a", token: 2, to: "b",
			want:    Decision{Next: heldBy("a", live), Outcome: OutcomeConflict},
			wantErr: ErrNotHolder,
		},
		"free lease: nothing to move, no write": {
			cur: released(), holder: "a", token: 3, to: "b",
			want: Decision{Next: released(), Outcome: OutcomeReleased},
		},
		"own term ended, not swept: freed as a revocation frees it, no move recorded": {
			cur: heldBy("a", t0), holder: "a", token: 3, to: "b",
			want: Decision{Next: freed(heldBy("a", t0)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(heldBy("a", t0), store.EndExpired, t0)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecideMove(tc.cur, tc.holder, tc.token, tc.to, t0)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMovedTermEnds: how each way a moved term ends leaves the lease
// reserved, and what the reservation lets acquire do.
func TestMovedTermEnds(t *testing.T) {
	live := t0.Add(5 * time.Second)
	toB := moving(heldBy("a", live), "b")
	anywhere := moving(heldBy("a", live), "")
	short := moving(heldBy("a", live), "b")
	short.TTL = time.Second
	cases := map[string]struct {
		decide func() (Decision, error)
		want   Decision
	}{
		"released by its holder: reserved for the destination one TTL from now": {
			decide: func() (Decision, error) { return DecideRelease(toB, "a", 3, t0) },
			want:   Decision{Next: reservedFor(toB, "b", "", t0.Add(ttl)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(toB, store.EndMoved, t0)},
		},
		"released, moved anywhere: reserved for every cluster but the holder's": {
			decide: func() (Decision, error) { return DecideRelease(anywhere, "a", 3, t0) },
			want:   Decision{Next: reservedFor(anywhere, "", "a", t0.Add(ttl)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(anywhere, store.EndMoved, t0)},
		},
		"released with a TTL under the floor: reserved for MinReservation": {
			decide: func() (Decision, error) { return DecideRelease(short, "a", 3, t0) },
			want:   Decision{Next: reservedFor(short, "b", "", t0.Add(MinReservation)), Write: true, Outcome: OutcomeReleased, Ended: endedTerm(short, store.EndMoved, t0)},
		},
		"revoked by its holder (a fenced handover): still live, still moving": {
			decide: func() (Decision, error) { return DecideRevoke(toB, "a", 3, t0) },
			want:   Decision{Next: toB, Outcome: OutcomeRevoked},
		},
		"expired and swept: reserved one TTL from its expiry": {
			decide: func() (Decision, error) { return DecideExpire(toB, live), nil },
			want:   Decision{Next: reservedFor(toB, "b", "", live.Add(ttl)), Write: true, Outcome: OutcomeExpired, Ended: endedTerm(toB, store.EndMoved, live)},
		},
		"swept after the reservation would have run out: freed without one": {
			decide: func() (Decision, error) { return DecideExpire(toB, live.Add(ttl)), nil },
			want:   Decision{Next: reservedFor(toB, "", "", time.Time{}), Write: true, Outcome: OutcomeExpired, Ended: endedTerm(toB, store.EndMoved, live)},
		},
		"the destination acquires over the expired, unswept term: granted": {
			decide: func() (Decision, error) { return DecideAcquire(toB, "b", ttl, live) },
			want: Decision{Next: newTerm(reservedFor(toB, "", "", time.Time{}), "b", 4, ttl, live), Write: true, Outcome: OutcomeAcquired,
				Ended: endedTerm(toB, store.EndMoved, live)},
		},
		"another cluster acquires over the expired, unswept term: refused, reservation shown": {
			decide: func() (Decision, error) { return DecideAcquire(toB, "c", ttl, live) },
			want:   Decision{Next: reservedFor(toB, "b", "", live.Add(ttl)), Outcome: OutcomeHeldByOther},
		},
		"the old holder acquires while reserved for others: refused": {
			decide: func() (Decision, error) {
				return DecideAcquire(reservedFor(anywhere, "", "a", live), "a/x", ttl, t0)
			},
			want: Decision{Next: reservedFor(anywhere, "", "a", live), Outcome: OutcomeHeldByOther},
		},
		"another cluster acquires while reserved for any but the holder's: granted, reservation cleared": {
			decide: func() (Decision, error) {
				return DecideAcquire(reservedFor(anywhere, "", "a", live), "b", ttl, t0)
			},
			want: Decision{Next: newTerm(reservedFor(anywhere, "", "", time.Time{}), "b", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired},
		},
		"anyone acquires once the reservation ran out: granted": {
			decide: func() (Decision, error) {
				return DecideAcquire(reservedFor(toB, "b", "", t0), "c", ttl, t0)
			},
			want: Decision{Next: newTerm(reservedFor(toB, "", "", time.Time{}), "c", 4, ttl, t0), Write: true, Outcome: OutcomeAcquired},
		},
		"the sweep clears a reservation that ran out": {
			decide: func() (Decision, error) { return DecideExpire(reservedFor(toB, "b", "", t0), t0), nil },
			want:   Decision{Next: reservedFor(toB, "", "", time.Time{}), Write: true, Outcome: OutcomeUnreserved},
		},
		"the sweep leaves a reservation that lasts": {
			decide: func() (Decision, error) { return DecideExpire(reservedFor(toB, "b", "", live), t0), nil },
			want:   Decision{Next: reservedFor(toB, "b", "", live)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.decide()
			if err != nil {
				t.Fatalf("error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideExpire(t *testing.T) {
	cases := map[string]struct {
		cur  store.Lease
		want Decision
	}{
		"never seen: left alone": {
			cur:  neverSeen(),
			want: Decision{Next: neverSeen()},
		},
		"released: left alone": {
			cur:  released(),
			want: Decision{Next: released()},
		},
		"live: left alone": {
			cur:  heldBy("a", t0.Add(5*time.Second)),
			want: Decision{Next: heldBy("a", t0.Add(5*time.Second))},
		},
		"one nanosecond before expiry: left alone": {
			cur:  heldBy("a", t0.Add(time.Nanosecond)),
			want: Decision{Next: heldBy("a", t0.Add(time.Nanosecond))},
		},
		"expired exactly at the boundary: freed, token kept": {
			cur:  heldBy("a", t0),
			want: Decision{Next: freed(heldBy("a", t0)), Write: true, Outcome: OutcomeExpired, Ended: endedTerm(heldBy("a", t0), store.EndExpired, t0)},
		},
		"long expired: freed": {
			cur:  heldBy("a", t0.Add(-time.Hour)),
			want: Decision{Next: freed(heldBy("a", t0.Add(-time.Hour))), Write: true, Outcome: OutcomeExpired, Ended: endedTerm(heldBy("a", t0.Add(-time.Hour)), store.EndExpired, t0.Add(-time.Hour))},
		},
		"revoked and live: left alone until it ends": {
			cur:  revoked(heldBy("a", t0.Add(time.Nanosecond))),
			want: Decision{Next: revoked(heldBy("a", t0.Add(time.Nanosecond)))},
		},
		"revoked and ended: freed, mark cleared": {
			cur:  revoked(heldBy("a", t0)),
			want: Decision{Next: freed(heldBy("a", t0)), Write: true, Outcome: OutcomeExpired, Ended: endedTerm(heldBy("a", t0), store.EndRevoked, t0)},
		},
		"expired at the ceiling: freed, token kept": {
			cur:  withToken(heldBy("a", t0), math.MaxInt32),
			want: Decision{Next: freed(withToken(heldBy("a", t0), math.MaxInt32)), Write: true, Outcome: OutcomeExpired, Ended: endedTerm(withToken(heldBy("a", t0), math.MaxInt32), store.EndExpired, t0)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := DecideExpire(tc.cur, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideGrace(t *testing.T) {
	graced := func(l store.Lease, expiresAt time.Time) store.Lease {
		l.ExpiresAt = expiresAt
		return l
	}
	noTTL := heldBy("a", t0.Add(time.Second))
	noTTL.TTL = 0
	cases := map[string]struct {
		cur  store.Lease
		want Decision
	}{
		"never seen: left alone": {
			cur:  neverSeen(),
			want: Decision{Next: neverSeen()},
		},
		"released: left alone": {
			cur:  released(),
			want: Decision{Next: released()},
		},
		"held, ending before a full term from now: extended to now+ttl": {
			cur:  heldBy("a", t0.Add(time.Second)),
			want: Decision{Next: graced(heldBy("a", t0.Add(time.Second)), t0.Add(ttl)), Write: true, Outcome: OutcomeGraced},
		},
		"expired during the downtime, not swept: holder keeps it": {
			cur:  heldBy("a", t0.Add(-time.Hour)),
			want: Decision{Next: graced(heldBy("a", t0.Add(-time.Hour)), t0.Add(ttl)), Write: true, Outcome: OutcomeGraced},
		},
		"already ending exactly a full term from now: left alone": {
			cur:  heldBy("a", t0.Add(ttl)),
			want: Decision{Next: heldBy("a", t0.Add(ttl))},
		},
		"ending later than a full term from now: never shortened": {
			cur:  heldBy("a", t0.Add(time.Hour)),
			want: Decision{Next: heldBy("a", t0.Add(time.Hour))},
		},
		"revoked, ending before a full term from now: graced too, the mark kept (its holder may be stopping)": {
			cur:  revoked(heldBy("a", t0.Add(time.Second))),
			want: Decision{Next: graced(revoked(heldBy("a", t0.Add(time.Second))), t0.Add(ttl)), Write: true, Outcome: OutcomeGraced},
		},
		"no recorded ttl: left alone": {
			cur:  noTTL,
			want: Decision{Next: noTTL},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := DecideGrace(tc.cur, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

// reservationOf is the reservation the model expects term cur to leave when
// it ends at endedAt: none unless it is the term last moved (movedToken, to
// movedTo).
func reservationOf(cur store.Lease, movedToken int32, movedTo string, endedAt time.Time) store.Reservation {
	if cur.Holder == "" || cur.FencingToken != movedToken {
		return store.Reservation{}
	}
	r := store.Reservation{Until: endedAt.Add(max(cur.TTL, MinReservation))}
	if movedTo != "" {
		r.For = movedTo
	} else {
		r.Except = leaseapi.HolderCluster(cur.Holder)
	}
	return r
}

// FuzzMachine drives one lease record through a fuzzed sequence of acquire,
// renew, release, revocation, move, expiry sweeps and restart graces by
// three holders of two clusters (a revocation or move names one of them as
// an administrator would; a move names no destination or either cluster), on a
// clock that moves in half-second steps against whole-second TTLs (so terms
// end exactly at the instant of an operation), and checks after every step the
// invariants the wire contract promises.
//
// The first byte picks the starting token (zero or near the int32 ceiling);
// every later pair of bytes is one operation: op and holder from the first,
// TTL, clock step and the token the caller presents from the second.
func FuzzMachine(f *testing.F) {
	f.Add([]byte{0, 0, 0, 5, 0, 1, 3, 10, 0})
	f.Add([]byte{1, 0, 0, 1, 0, 2, 0, 3, 0xff, 1, 0})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0x1c, 1, 0, 4, 0x1c, 3, 0})
	f.Add([]byte{0, 0, 1, 6, 0x1f, 11, 0x3c, 2, 0x40, 7, 0x80, 14, 0x1c})
	// a's term revoked, its renew and acquire refused, b refused until a releases.
	f.Add([]byte{0, 0, 0, 5, 0x20, 1, 0, 0, 4, 6, 4, 4, 0, 2, 0, 6, 0})
	// a's term moved to b, c... b refused until a releases; a's release reserves for b;
	// a refused, b granted.
	f.Add([]byte{0, 0, 0, 6, 0x60, 7, 0, 2, 0, 0, 0, 7, 0})
	// a moved anywhere, expires; the reservation shuts a out for a TTL, the sweep clears it.
	f.Add([]byte{0, 0, 1, 6, 0x20, 3, 0x1c, 0, 0x04, 3, 0x1c, 0, 0x1c, 3, 0x1c, 0, 0})
	f.Fuzz(func(t *testing.T, program []byte) {
		if len(program) == 0 {
			return
		}
		starts := []int32{0, math.MaxInt32 - 2, math.MaxInt32 - 1, math.MaxInt32}
		cur := store.Lease{Namespace: "ns", Name: "lease", FencingToken: starts[int(program[0])%len(starts)]}
		holders := []string{"a", "b", "a/x"}
		// remembered is the token each holder was last granted.
		remembered := map[string]int32{}
		// revokedToken is the token of the last term the model saw revoked,
		// kept apart from the record's own mark.
		var revokedToken int32
		// movedToken and movedTo: the last term the model saw moved, and
		// where; reserved: the reservation the model expects its end to
		// leave, kept apart from the record's.
		var (
			movedToken int32
			movedTo    string
			reserved   store.Reservation
		)
		destinations := []string{"", "a", "b"}
		now := t0
		for i := 1; i+1 < len(program); i += 2 {
			opByte, arg := program[i], program[i+1]
			op := opByte % 7
			holder := holders[int(opByte/7)%len(holders)]
			to := destinations[int(arg>>5)/3%len(destinations)]
			opTTL := time.Duration(1+arg&3) * time.Second
			now = now.Add(time.Duration((arg>>2)&7) * 500 * time.Millisecond)
			var token int32
			switch (arg >> 5) % 3 {
			case 0:
				token = remembered[holder]
			case 1:
				token = cur.FencingToken
			case 2:
				token = cur.FencingToken - 1
			}

			var (
				d    Decision
				err  error
				name string
			)
			switch op {
			case 0:
				name = "acquire"
				d, err = DecideAcquire(cur, holder, opTTL, now)
			case 1:
				name = "renew"
				d = DecideRenew(cur, holder, token, opTTL, now)
			case 2:
				name = "release"
				d, err = DecideRelease(cur, holder, token, now)
			case 3:
				name = "expire"
				d = DecideExpire(cur, now)
			case 4:
				name = "grace"
				d = DecideGrace(cur, now)
			case 5:
				name = "revoke"
				d, err = DecideRevoke(cur, holder, token, now)
			case 6:
				name = "move to " + to
				d, err = DecideMove(cur, holder, token, to, now)
			}
			step := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("step %d, %s by %q token %d ttl %s at +%s on %+v -> %+v (err %v): "+format,
					append([]any{i / 2, name, holder, token, opTTL, now.Sub(t0), cur, d, err}, args...)...)
			}

			next := cur
			if d.Write {
				next = d.Next
			}
			if err != nil && d.Write {
				step("an error must not write")
			}
			if !d.Write && d.Next.FencingToken != cur.FencingToken {
				step("a decision without a write shows another token")
			}
			if d.Next.Version != cur.Version || d.Next.Namespace != cur.Namespace || d.Next.Name != cur.Name {
				step("the machine must not touch the key or the store's version")
			}

			// Tokens: never down, +1 exactly for a new term, never past the ceiling.
			switch {
			case d.Outcome == OutcomeAcquired:
				if cur.FencingToken == math.MaxInt32 {
					step("acquired past the int32 ceiling")
				}
				if next.FencingToken != cur.FencingToken+1 {
					step("new term has token %d, want %d", next.FencingToken, cur.FencingToken+1)
				}
				if cur.Held(now) {
					step("a new term began while the lease was live")
				}
			case next.FencingToken != cur.FencingToken:
				step("token moved from %d to %d without a new term", cur.FencingToken, next.FencingToken)
			}
			if next.FencingToken < 0 {
				step("token wrapped to %d", next.FencingToken)
			}
			if errors.Is(err, ErrTokensExhausted) && cur.FencingToken != math.MaxInt32 {
				step("tokens reported exhausted below the ceiling")
			}
			if op == 0 && cur.FencingToken == math.MaxInt32 && !cur.Held(now) && !errors.Is(err, ErrTokensExhausted) {
				step("acquire of a free lease at the ceiling must report exhaustion")
			}

			// One holder: a live lease changes hands only by its holder's release.
			if next.Holder != "" && next.Holder != "a" && next.Holder != "b" && next.Holder != "a/x" {
				step("unknown holder %q", next.Holder)
			}
			if cur.Held(now) && next.Holder != cur.Holder && (op != 2 || holder != cur.Holder || next.Holder != "") {
				step("live lease of %q passed to %q", cur.Holder, next.Holder)
			}
			if (op == 0 || op == 1) && cur.Held(now) && cur.Holder != holder {
				if d.Write || d.Held() {
					step("a non-holder changed a live lease")
				}
			}

			// Revocation: a live term is marked, never freed or moved by it;
			// a revoked term is never granted again, to its holder or anyone,
			// until it is released or ends; only its holder's renew with its
			// token (the holder may still be stopping) and a restart's grace
			// extend it, and both keep the mark; the mark never outlives its
			// term.
			if op == 5 && cur.Held(now) && (next.Holder != cur.Holder || next.FencingToken != cur.FencingToken || !next.ExpiresAt.Equal(cur.ExpiresAt)) {
				step("revocation moved, freed or changed the expiry of a live term")
			}
			if op == 5 && err == nil && cur.Held(now) && (cur.Holder != holder || cur.FencingToken != token) {
				step("revocation of another term succeeded")
			}
			if op == 5 && err != nil && !errors.Is(err, ErrNotHolder) {
				step("revocation failed with %v", err)
			}
			if op == 5 && err == nil && cur.Held(now) && !next.Revoked {
				step("revocation left the live term unrevoked")
			}
			if cur.Held(now) && cur.FencingToken == revokedToken {
				if !cur.Revoked {
					step("the record lost the mark of revoked term %d", revokedToken)
				}
				if d.Held() {
					step("revoked term %d granted to %q", revokedToken, holder)
				}
				if next.Holder == cur.Holder && next.FencingToken == cur.FencingToken && !next.Revoked {
					step("revoked term %d unrevoked", revokedToken)
				}
				holderRenews := op == 1 && holder == cur.Holder && token == cur.FencingToken
				if next.Holder == cur.Holder && next.FencingToken == cur.FencingToken && !next.ExpiresAt.Equal(cur.ExpiresAt) && !holderRenews && op != 4 {
					step("revoked term %d extended by op %d of %q", revokedToken, op, holder)
				}
			}
			if next.Revoked && (next.Holder == "" || d.Outcome == OutcomeAcquired) {
				step("the mark outlived its term")
			}
			if next.Revoked && !cur.Revoked && op != 5 && op != 6 {
				step("only a revocation or a move marks a term")
			}

			// Moves: a live term is revoked and marked moving, never freed,
			// passed on or changed in length; only the live term of the
			// caller's holder and token moves; a term keeps its first named
			// destination; the mark never outlives its term.
			if op == 6 && cur.Held(now) && (next.Holder != cur.Holder || next.FencingToken != cur.FencingToken || !next.ExpiresAt.Equal(cur.ExpiresAt)) {
				step("move passed on, freed or changed the expiry of a live term")
			}
			own := cur.Held(now) && cur.Holder == holder && cur.FencingToken == token
			if op == 6 && err == nil && cur.Held(now) && !own {
				step("move of another term succeeded")
			}
			if op == 6 && err != nil && !errors.Is(err, ErrNotHolder) && !errors.Is(err, ErrMoving) && !errors.Is(err, ErrMoveTarget) {
				step("move failed with %v", err)
			}
			if op == 6 && err == nil && own && (!next.Revoked || !next.Moving) {
				step("move left the live term unrevoked or not moving")
			}
			if op == 6 && own && to != "" && to == leaseapi.HolderCluster(holder) && err == nil {
				step("a term moved to its own cluster")
			}
			if cur.Moving && cur.MoveTo != "" && next.FencingToken == cur.FencingToken && next.Holder != "" && next.MoveTo != cur.MoveTo {
				step("a moving term's destination changed from %q to %q", cur.MoveTo, next.MoveTo)
			}
			if next.Moving && !cur.Moving && op != 6 {
				step("only a move marks a term moving")
			}
			if (next.Moving || next.MoveTo != "") && (next.Holder == "" || d.Outcome == OutcomeAcquired) {
				step("the move mark outlived its term")
			}
			if next.Moving && !next.Revoked {
				step("a moving term is not revoked")
			}

			// Reservations: left only by the end of a moved term, for one
			// TTL (at least MinReservation) from that end, on a free lease;
			// while one lasts, only a holder it admits is granted the lease.
			if !next.Reserved.IsZero() && next.Holder != "" {
				step("a reservation on a held lease")
			}
			// The moved term left it, or leaves it when the sweep writes
			// down its expiry.
			effective := reserved
			if cur.Holder != "" && !cur.Held(now) {
				effective = reservationOf(cur, movedToken, movedTo, cur.ExpiresAt)
			}
			if d.Outcome == OutcomeAcquired && now.Before(effective.Until) {
				c := leaseapi.HolderCluster(holder)
				if (effective.For != "" && c != effective.For) || (effective.Except != "" && c == effective.Except) {
					step("granted to %q against reservation %+v", holder, effective)
				}
			}
			if d.Outcome == OutcomeHeldByOther && !cur.Held(now) && !now.Before(effective.Until) {
				step("refused with no live reservation")
			}
			if d.Write && next.Holder == "" && now.Before(effective.Until) && next.Reserved != effective {
				step("reservation %+v, want %+v", next.Reserved, effective)
			}

			// History: a write that ends a term says how, once.
			endsTerm := d.Write && cur.Holder != "" && (next.Holder == "" || next.FencingToken != cur.FencingToken)
			switch {
			case endsTerm && d.Ended == nil:
				step("a term ended with nothing for its history")
			case !endsTerm && d.Ended != nil:
				step("history recorded a term that did not end")
			case endsTerm:
				want := store.Term{Holder: cur.Holder, FencingToken: cur.FencingToken, AcquiredAt: cur.AcquiredAt, EndedAt: now, Ending: store.EndReleased}
				if !cur.Held(now) {
					want.EndedAt, want.Ending = cur.ExpiresAt, store.EndExpired
				}
				switch cur.FencingToken {
				case movedToken:
					want.Ending = store.EndMoved
				case revokedToken:
					want.Ending = store.EndRevoked
				}
				if diff := cmp.Diff(want, *d.Ended); diff != "" {
					step("ended term (-want +got):\n%s", diff)
				}
			}

			// A caller told it holds the lease really holds it, for ttl from now
			// or until its term's old expiry, whichever is later: a renewal never
			// pulls a term's end in under whoever was told it.
			if d.Held() {
				until := now.Add(opTTL)
				if d.Outcome == OutcomeRenewed && cur.ExpiresAt.After(until) {
					until = cur.ExpiresAt
				}
				if !d.Write || next.Holder != holder || !next.ExpiresAt.Equal(until) || next.TTL != opTTL || !next.Held(now) {
					step("held decision does not leave the caller holding until the later of now+ttl and its old expiry")
				}
				if d.Outcome == OutcomeRenewed && (next.FencingToken != cur.FencingToken || !next.AcquiredAt.Equal(cur.AcquiredAt)) {
					step("renewal started a new term")
				}
			}

			// Release, expiry and grace keep the token; release and expiry
			// leave no live holder (a release of an expired term need not
			// write: the lease already reads as free).
			switch d.Outcome {
			case OutcomeReleased, OutcomeExpired:
				if next.Held(now) {
					step("%s left holder %q", d.Outcome, next.Holder)
				}
				if d.Outcome == OutcomeExpired && cur.Held(now) {
					step("expired a live lease")
				}
			case OutcomeGraced:
				if next.Holder != cur.Holder || next.ExpiresAt.Before(cur.ExpiresAt) {
					step("grace moved or shortened the lease")
				}
			}
			if op == 2 && err == nil && cur.Held(now) && (cur.Holder != holder || cur.FencingToken != token) {
				step("release of a live lease by a non-holder succeeded")
			}
			if op == 2 && d.Write && (cur.Holder != holder || cur.FencingToken != token) {
				step("release by a non-holder wrote")
			}
			if op == 2 && err != nil && !errors.Is(err, ErrNotHolder) {
				step("release failed with %v", err)
			}

			if d.Held() {
				remembered[holder] = next.FencingToken
			}
			if d.Outcome == OutcomeRevoked || (d.Outcome == OutcomeMoved && next.Holder != "") {
				revokedToken = next.FencingToken
			}
			if d.Outcome == OutcomeMoved && next.Moving {
				movedToken, movedTo = next.FencingToken, next.MoveTo
			}
			if endsTerm {
				reserved = reservationOf(cur, movedToken, movedTo, d.Ended.EndedAt)
			}
			if d.Outcome == OutcomeAcquired {
				reserved = store.Reservation{}
			}
			if d.Write {
				next.Version++ // as a store would
			}
			cur = next
		}
	})
}
