package storetest

import (
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// testRevocation: the mark of a revoked term round-trips through the store
// (get and list) and is cleared when the term is released, when the sweep
// frees it at its end, and when a new term begins; writing the record
// without the mark removes it.
func testRevocation(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const ttl = 10 * time.Second
	stored := func(t *testing.T) store.Lease {
		t.Helper()
		l, err := f.store.GetLease(f.ctx, key.Namespace, key.Name)
		if err != nil {
			t.Fatal(err)
		}
		page, _, err := f.store.ListLeases(f.ctx, store.ListOptions{})
		if err != nil || len(page) != 1 || page[0].Revoked != l.Revoked {
			t.Fatalf("list shows %+v, %v; want the one lease, revoked %v as get shows it", page, err, l.Revoked)
		}
		return l
	}
	revoke := func(t *testing.T, holder string, token int32) {
		t.Helper()
		d, err := f.svc.Revoke(f.ctx, key, holder, token)
		if err != nil || d.Outcome != lease.OutcomeRevoked {
			t.Fatalf("revoke %s's term %d: %s, %v; want revoked", holder, token, d.Outcome, err)
		}
		if l := stored(t); !l.Revoked || l.Holder != holder || l.FencingToken != token || !l.ExpiresAt.Equal(d.Next.ExpiresAt) {
			t.Fatalf("stored after the revocation: %+v, want %s's term %d revoked, expiry kept", l, holder, token)
		}
	}

	// Released by its holder: the mark goes with the holder.
	a := f.acquire(t, "east", ttl)
	revoke(t, "east", a.Next.FencingToken)
	if d, err := f.svc.Renew(f.ctx, key, "east", a.Next.FencingToken, ttl); err != nil || d.Held() || !d.Next.Revoked {
		t.Fatalf("renew of the revoked term: %s %+v, %v; want refused, shown revoked", d.Outcome, d.Next, err)
	}
	f.release(t, "east", a.Next.FencingToken)
	if l := stored(t); l.Holder != "" || l.Revoked {
		t.Fatalf("stored after the holder's release: %+v, want free without the mark", l)
	}

	// Ended: the sweep frees it and clears the mark.
	b := f.acquire(t, "west", ttl)
	if l := stored(t); l.Revoked {
		t.Fatalf("a new term begins revoked: %+v", l)
	}
	revoke(t, "west", b.Next.FencingToken)
	f.clock.Step(ttl)
	if _, err := f.svc.Sweep(f.ctx); err != nil {
		t.Fatal(err)
	}
	if l := stored(t); l.Holder != "" || l.Revoked {
		t.Fatalf("stored after the revoked term ended and the sweep ran: %+v, want free without the mark", l)
	}

	// A record written without the mark loses it (a new term begun on a
	// revoked record that the sweep has not freed yet).
	c := f.acquire(t, "east", ttl)
	revoke(t, "east", c.Next.FencingToken)
	next := stored(t)
	next.Revoked = false
	next.Holder, next.FencingToken = "west", c.Next.FencingToken+1
	if _, err := f.store.PutLease(f.ctx, next); err != nil {
		t.Fatal(err)
	}
	if l := stored(t); l.Revoked || l.Holder != "west" {
		t.Fatalf("stored after a write without the mark: %+v, want west's term unrevoked", l)
	}
}
