package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// stored reads key straight from the store, and checks that a list shows
// the same record.
func (f *fixture) stored(t *testing.T) store.Lease {
	t.Helper()
	l, err := f.store.GetLease(f.ctx, key.Namespace, key.Name)
	if err != nil {
		t.Fatal(err)
	}
	page, _, err := f.store.ListLeases(f.ctx, store.ListOptions{Namespace: key.Namespace})
	if err != nil || len(page) != 1 {
		t.Fatalf("list shows %+v, %v; want the one lease", page, err)
	}
	if diff := cmp.Diff(l, page[0]); diff != "" {
		t.Fatalf("list and get differ (-get +list):\n%s", diff)
	}
	return l
}

func (f *fixture) register(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := f.svc.RegisterCluster(f.ctx, id, leaseapi.ClusterRegistration{Fingerprint: "fp-" + id}); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
}

// testMove: a move marks the live term (every field kept by the store),
// withholds nothing while the term lives, and its end reserves the lease
// for the destination for one TTL, which the sweep clears with a write.
func testMove(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const ttl = 10 * time.Second
	f.register(t, "east", "west", "south")
	if _, err := f.svc.SetCordoned(f.ctx, "south", true); err != nil {
		t.Fatal(err)
	}
	a := f.acquire(t, "east", ttl)
	token := a.Next.FencingToken

	for to, want := range map[string]error{"north": lease.ErrMoveTarget, "south": lease.ErrMoveTarget} {
		if d, err := f.svc.Move(f.ctx, key, "east", token, to); !errors.Is(err, want) || d.Write {
			t.Fatalf("move to %s: %s, %v; want %v and no write", to, d.Outcome, err, want)
		}
	}
	if l := f.stored(t); l.Moving || l.Revoked {
		t.Fatalf("a refused move marked the term: %+v", l)
	}
	d, err := f.svc.Move(f.ctx, key, "east", token, "west")
	if err != nil || d.Outcome != lease.OutcomeMoved {
		t.Fatalf("move to west: %s, %v", d.Outcome, err)
	}
	l := f.stored(t)
	if !l.Moving || l.MoveTo != "west" || !l.Revoked || l.Holder != "east" || l.FencingToken != token || !l.ExpiresAt.Equal(a.Next.ExpiresAt) {
		t.Fatalf("stored after the move: %+v, want east's term %d revoked and moving to west, expiry kept", l, token)
	}
	if _, err := f.svc.Move(f.ctx, key, "east", token, "north"); !errors.Is(err, lease.ErrMoving) {
		t.Fatalf("a second move elsewhere: %v, want ErrMoving", err)
	}
	// The moving term is held: nobody, the destination included, is granted it.
	for _, h := range []string{"west", "east"} {
		if d := f.acquire(t, h, ttl); d.Held() {
			t.Fatalf("%s was granted a moving term", h)
		}
	}

	f.clock.Step(time.Second)
	released := f.clock.Now().UTC()
	f.release(t, "east", token)
	l = f.stored(t)
	wantReserved := store.Reservation{For: "west", Until: released.Add(ttl)}
	if l.Holder != "" || l.Moving || l.MoveTo != "" || l.Revoked || l.Reserved != wantReserved {
		t.Fatalf("stored after the release: %+v, want free, unmarked, reserved %+v", l, wantReserved)
	}
	for _, h := range []string{"east", "south/x"} {
		d := f.acquire(t, h, ttl)
		if d.Held() || d.Outcome != lease.OutcomeHeldByOther || d.Next.Reserved != wantReserved {
			t.Fatalf("acquire by %s while reserved for west: %s %+v; want held-by-other showing the reservation", h, d.Outcome, d.Next)
		}
	}
	got := f.acquire(t, "west/app", ttl)
	if !got.Held() || got.Next.FencingToken != token+1 {
		t.Fatalf("acquire by the destination: %s %+v; want the next term", got.Outcome, got.Next)
	}
	if l := f.stored(t); !l.Reserved.IsZero() || l.Holder != "west/app" {
		t.Fatalf("stored after the destination's grant: %+v, want its term without the reservation", l)
	}

	// Moved anywhere and left to expire: reserved for all but the holder's
	// cluster from the expiry; the sweep writes the end, then clears the
	// reservation once it runs out, with a write (the version moves).
	if _, err := f.svc.Move(f.ctx, key, "west/app", token+1, ""); err != nil {
		t.Fatal(err)
	}
	expires := f.stored(t).ExpiresAt
	f.clock.SetTime(expires)
	if _, err := f.svc.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	l = f.stored(t)
	if want := (store.Reservation{Except: "west", Until: expires.Add(ttl)}); l.Holder != "" || l.Reserved != want {
		t.Fatalf("stored after the moved term expired: %+v, want free and reserved %+v", l, want)
	}
	f.clock.SetTime(expires.Add(ttl))
	if _, err := f.svc.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	if cleared := f.stored(t); !cleared.Reserved.IsZero() || cleared.Version == l.Version {
		t.Fatalf("stored after the reservation ran out and the sweep ran: %+v, want it cleared by a write", cleared)
	}
	if d := f.acquire(t, "west", ttl); !d.Held() {
		t.Fatalf("acquire by the old holder's cluster after the reservation: %s", d.Outcome)
	}
}

// testHistory: every way a term ends is recorded with the write that ends
// it, newest first, bounded by the service's HistoryTerms; a write that
// loses its compare-and-swap records nothing.
func testHistory(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	if _, ok := f.store.(store.TermStore); !ok {
		t.Fatal("the store keeps no terms (store.TermStore)")
	}
	const ttl = 10 * time.Second
	f.register(t, "east", "west")
	svc := lease.NewService(f.store, lease.Options{Clock: f.clock, HistoryTerms: 4})
	history := func(t *testing.T, limit int) []lease.HistoryEntry {
		t.Helper()
		h, err := svc.History(f.ctx, key, limit)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if _, err := svc.History(f.ctx, key, 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("history of a lease never seen: %v, want ErrNotFound", err)
	}
	acquire := func(holder string) (int32, time.Time) {
		t.Helper()
		d, err := svc.Acquire(f.ctx, key, holder, ttl)
		if err != nil || !d.Held() {
			t.Fatalf("acquire by %s: %s, %v", holder, d.Outcome, err)
		}
		return d.Next.FencingToken, d.Next.AcquiredAt
	}
	var want []store.Term
	ended := func(holder string, token int32, acquired, at time.Time, how store.Ending) {
		want = append([]store.Term{{Holder: holder, FencingToken: token, AcquiredAt: acquired, EndedAt: at, Ending: how}}, want...)
	}

	// Released.
	t1, at1 := acquire("east")
	f.clock.Step(time.Second)
	if _, err := svc.Release(f.ctx, key, "east", t1); err != nil {
		t.Fatal(err)
	}
	ended("east", t1, at1, f.clock.Now().UTC(), store.EndReleased)
	// Expired, and taken over by an acquire before the sweep ran.
	t2, at2 := acquire("west")
	exp2 := f.stored(t).ExpiresAt
	f.clock.SetTime(exp2.Add(time.Second))
	if live := history(t, 0); live[0].Live || live[0].FencingToken != t2 || live[0].Ending != store.EndExpired || !live[0].EndedAt.Equal(exp2) {
		t.Fatalf("history of an expired, unswept term: %+v, want it ended by expiry at %s", live[0], exp2)
	}
	t3, at3 := acquire("east")
	ended("west", t2, at2, exp2, store.EndExpired)
	// Revoked, then released by its holder (the handover).
	if _, err := svc.Revoke(f.ctx, key, "east", t3); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Release(f.ctx, key, "east", t3); err != nil {
		t.Fatal(err)
	}
	ended("east", t3, at3, f.clock.Now().UTC(), store.EndRevoked)
	// Moved, then swept at its expiry.
	t4, at4 := acquire("east")
	if _, err := svc.Move(f.ctx, key, "east", t4, "west"); err != nil {
		t.Fatal(err)
	}
	exp4 := f.stored(t).ExpiresAt
	f.clock.SetTime(exp4)
	if _, err := svc.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	ended("east", t4, at4, exp4, store.EndMoved)
	// The live term comes first, without an end.
	t5, at5 := acquire("west")
	h := history(t, 0)
	if len(h) == 0 || !h[0].Live || h[0].FencingToken != t5 || !h[0].AcquiredAt.Equal(at5) || !h[0].EndedAt.IsZero() {
		t.Fatalf("history starts with %+v, want west's live term %d", h, t5)
	}
	var got []store.Term
	for _, e := range h[1:] {
		got = append(got, e.Term)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("ended terms (-want +got):\n%s", diff)
	}
	if h := history(t, 2); len(h) != 2 || h[1].FencingToken != t4 {
		t.Fatalf("history limited to 2: %+v, want the live term and term %d", h, t4)
	}

	// A write that loses its compare-and-swap records nothing.
	cur := f.stored(t)
	stale := cur
	stale.Version--
	stale.Holder = ""
	stale.Ended = &store.EndedTerm{Term: store.Term{Holder: "west", FencingToken: t5, EndedAt: f.clock.Now(), Ending: store.EndReleased}, Keep: 4}
	if _, err := f.store.PutLease(f.ctx, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("write at a stale version: %v, want ErrConflict", err)
	}
	if h := history(t, 0); !h[0].Live || h[0].FencingToken != t5 || len(h) != 5 {
		t.Fatalf("history after a refused write: %+v, want the live term and four ended ones", h)
	}

	// Bounded on write: the fifth ended term pushes the oldest out.
	if _, err := svc.Release(f.ctx, key, "west", t5); err != nil {
		t.Fatal(err)
	}
	ended("west", t5, at5, f.clock.Now().UTC(), store.EndReleased)
	got = got[:0]
	for _, e := range history(t, 0) {
		got = append(got, e.Term)
	}
	if diff := cmp.Diff(want[:4], got); diff != "" {
		t.Fatalf("ended terms kept at a bound of 4 (-want +got):\n%s", diff)
	}

	// Disabled: nothing more is recorded.
	off := lease.NewService(f.store, lease.Options{Clock: f.clock, HistoryTerms: -1})
	d, err := off.Acquire(f.ctx, key, "east", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := off.Release(f.ctx, key, "east", d.Next.FencingToken); err != nil {
		t.Fatal(err)
	}
	if h := history(t, 0); len(h) != 4 || h[0].FencingToken != t5 {
		t.Fatalf("history after a term with recording off: %+v, want the same four terms", h)
	}
}
