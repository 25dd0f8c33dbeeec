package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// batchStore is the fixture's store as a store.LeaseBatchStore; the test
// is skipped for a store that does not offer it.
func (f *fixture) batchStore(t *testing.T) store.LeaseBatchStore {
	t.Helper()
	b, ok := f.store.(store.LeaseBatchStore)
	if !ok {
		t.Skipf("%T does not implement store.LeaseBatchStore", f.store)
	}
	return b
}

// testBatchReadWrite reads and writes leases of several namespaces, some
// never written, in one call each: the answers come in the order of the
// input, and every write is a compare-and-swap of its own.
func testBatchReadWrite(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	b := f.batchStore(t)
	existing := []store.Lease{
		{Namespace: "team-b", Name: "b", Holder: "east", FencingToken: 3, TTL: time.Minute, ExpiresAt: epoch.Add(time.Minute)},
		{Namespace: "team", Name: "a", Holder: "west", FencingToken: 1, TTL: time.Second, ExpiresAt: epoch.Add(time.Second)},
	}
	for i, l := range existing {
		var err error
		if existing[i], err = f.store.PutLease(f.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	// Out of key order, new and existing mixed.
	keys := []store.LeaseKey{{Namespace: "team-b", Name: "b"}, {Namespace: "zeta", Name: "new-1"}, {Namespace: "team", Name: "a"}, {Namespace: "alpha", Name: "new-2"}}
	got, err := b.GetLeases(f.ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Lease{existing[0], {Namespace: "zeta", Name: "new-1"}, existing[1], {Namespace: "alpha", Name: "new-2"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("GetLeases (-want +got):\n%s", diff)
	}

	// Every lease changed from what was read; the third is stale.
	next := make([]store.Lease, len(got))
	for i, l := range got {
		l.Holder = fmt.Sprintf("holder-%d", i)
		l.FencingToken++
		l.RenewedAt = epoch.Add(time.Duration(i) * time.Second)
		next[i] = l
	}
	if _, err := f.store.PutLease(f.ctx, existing[1]); err != nil {
		t.Fatal(err)
	}
	written, errs, err := b.PutLeases(f.ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != len(next) || len(errs) != len(next) {
		t.Fatalf("PutLeases of %d answered %d leases and %d errors", len(next), len(written), len(errs))
	}
	for i, l := range next {
		if i == 2 {
			if !errors.Is(errs[i], store.ErrConflict) {
				t.Errorf("write of %s/%s at a stale version: %v, want ErrConflict", l.Namespace, l.Name, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("write of %s/%s: %v", l.Namespace, l.Name, errs[i])
			continue
		}
		if written[i].Version == 0 || written[i].Version == l.Version {
			t.Errorf("write of %s/%s: version %d after %d; the store must give a new non-zero one", l.Namespace, l.Name, written[i].Version, l.Version)
		}
		stored, err := f.store.GetLease(f.ctx, l.Namespace, l.Name)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(written[i], stored); diff != "" {
			t.Errorf("stored %s/%s (-written +stored):\n%s", l.Namespace, l.Name, diff)
		}
		if diff := cmp.Diff(l, stored, cmpopts.IgnoreFields(store.Lease{}, "Version")); diff != "" {
			t.Errorf("stored %s/%s (-sent +stored):\n%s", l.Namespace, l.Name, diff)
		}
	}
	stale, err := f.store.GetLease(f.ctx, "team", "a")
	if err != nil {
		t.Fatal(err)
	}
	if stale.Holder != "west" {
		t.Errorf("the refused write landed: team/a held by %q, want west", stale.Holder)
	}
}

// testBatchOneVersion has writes prepared from one state race, inside one
// call and across concurrent calls: of the writes of one key from one
// version, exactly one lands.
func testBatchOneVersion(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	b := f.batchStore(t)
	base, err := f.store.PutLease(f.ctx, store.Lease{Namespace: key.Namespace, Name: key.Name, FencingToken: 1})
	if err != nil {
		t.Fatal(err)
	}
	twice := []store.Lease{base, base}
	twice[0].Holder, twice[1].Holder = "first", "second"
	_, errs, err := b.PutLeases(f.ctx, twice)
	if err != nil {
		t.Fatal(err)
	}
	if landed := countNil(errs); landed != 1 {
		t.Fatalf("two writes of one key from one version in one call: %d landed (%v), want 1", landed, errs)
	}

	// Many callers read the same leases (one new, one existing) and write
	// them at once.
	const writers = 8
	read, err := b.GetLeases(f.ctx, []store.LeaseKey{{Namespace: key.Namespace, Name: key.Name}, {Namespace: "other", Name: "new"}})
	if err != nil {
		t.Fatal(err)
	}
	landed := make([][]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			next := []store.Lease{read[0], read[1]}
			for i := range next {
				next[i].Holder = fmt.Sprintf("writer-%d", w)
			}
			_, errs, err := b.PutLeases(f.ctx, next)
			if err != nil {
				t.Errorf("writer %d: %v", w, err)
				return
			}
			landed[w] = errs
		})
	}
	wg.Wait()
	for i, k := range []string{key.String(), "other/new"} {
		n := 0
		for _, errs := range landed {
			if errs != nil && errs[i] == nil {
				n++
			} else if errs != nil && !errors.Is(errs[i], store.ErrConflict) {
				t.Errorf("write of %s: %v, want nil or ErrConflict", k, errs[i])
			}
		}
		if n != 1 {
			t.Errorf("%d writers' writes of %s from one version landed, want exactly 1", n, k)
		}
	}
}

func countNil(errs []error) int {
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	return n
}

// testBatchRenewal renews leases in every state through RenewBatch and the
// same leases' twins, in another namespace, one by one through Renew: each
// batch decision is the single one, and the batch's writes are the single
// ones' writes. It runs on every store, through the per-lease path on a
// store without store.LeaseBatchStore.
func testBatchRenewal(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	const ttl = 10 * time.Second
	type state struct {
		name  string
		setup func(k leaseapi.Key) // at epoch
		token int32
	}
	acquire := func(k leaseapi.Key, holder string, ttl time.Duration) {
		if _, err := f.svc.Acquire(f.ctx, k, holder, ttl); err != nil {
			t.Fatal(err)
		}
	}
	states := []state{
		{name: "held", setup: func(k leaseapi.Key) { acquire(k, "east", ttl) }, token: 1},
		{name: "held-wrong-token", setup: func(k leaseapi.Key) { acquire(k, "east", ttl) }, token: 2},
		{name: "held-by-other", setup: func(k leaseapi.Key) { acquire(k, "west", ttl) }, token: 1},
		{name: "expired", setup: func(k leaseapi.Key) { acquire(k, "east", time.Second) }, token: 1},
		{name: "never-seen", setup: func(leaseapi.Key) {}, token: 1},
		{name: "revoked", setup: func(k leaseapi.Key) {
			acquire(k, "east", ttl)
			if _, err := f.svc.Revoke(f.ctx, k, "east", 1); err != nil {
				t.Fatal(err)
			}
		}, token: 1},
		{name: "released", setup: func(k leaseapi.Key) {
			acquire(k, "east", ttl)
			if _, err := f.svc.Release(f.ctx, k, "east", 1); err != nil {
				t.Fatal(err)
			}
		}, token: 1},
	}
	var renewals []lease.Renewal
	for _, ns := range []string{"batch", "single"} {
		for _, s := range states {
			k := leaseapi.Key{Namespace: ns, Name: s.name}
			s.setup(k)
			if ns == "batch" {
				renewals = append(renewals, lease.Renewal{Key: k, Token: s.token, TTL: time.Duration(len(renewals)+5) * time.Second})
			}
		}
	}
	f.clock.Step(2 * time.Second)
	batch, err := f.svc.RenewBatch(f.ctx, "east", renewals)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != len(renewals) {
		t.Fatalf("RenewBatch of %d answered %d decisions", len(renewals), len(batch))
	}
	ignoreVersion := cmpopts.IgnoreFields(store.Lease{}, "Version", "Namespace")
	for i, r := range renewals {
		twin := leaseapi.Key{Namespace: "single", Name: r.Key.Name}
		single, err := f.svc.Renew(f.ctx, twin, "east", r.Token, r.TTL)
		if err != nil {
			t.Fatal(err)
		}
		if batch[i].Next.Namespace != "batch" || batch[i].Next.Name != r.Key.Name {
			t.Errorf("decision %d is of %s/%s, want %s", i, batch[i].Next.Namespace, batch[i].Next.Name, r.Key)
		}
		if diff := cmp.Diff(single, batch[i], ignoreVersion); diff != "" {
			t.Errorf("%s: batch decision differs from Renew's (-single +batch):\n%s", r.Key.Name, diff)
		}
		stored, err := f.store.GetLease(f.ctx, r.Key.Namespace, r.Key.Name)
		switch {
		case errors.Is(err, store.ErrNotFound) && !batch[i].Write:
		case err != nil:
			t.Fatal(err)
		case batch[i].Write:
			if diff := cmp.Diff(batch[i].Next, stored); diff != "" {
				t.Errorf("%s: stored after the batch (-decided +stored):\n%s", r.Key.Name, diff)
			}
		}
	}
	want := map[string]lease.Outcome{"held": lease.OutcomeRenewed, "revoked": lease.OutcomeRevoked}
	for i, r := range renewals {
		if got, w := batch[i].Outcome, cmpOr(want[r.Key.Name], lease.OutcomeLost); got != w {
			t.Errorf("%s: outcome %s, want %s", r.Key.Name, got, w)
		}
		// The batch's instant plus its own TTL, or the term's old end when
		// that is later: a renewal never pulls a term's end in.
		if want := epoch.Add(max(2*time.Second+r.TTL, ttl)); batch[i].Write && !batch[i].Next.ExpiresAt.Equal(want) {
			t.Errorf("%s: expires at %s, want the later of the batch's instant plus its own TTL and the old expiry, %s", r.Key.Name, batch[i].Next.ExpiresAt, want)
		}
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// testBatchMany writes more leases in one call than a store may put in one
// statement, twice: created, then updated with one stale write among them.
func testBatchMany(t *testing.T, open OpenFunc) {
	f := newFixture(t, open)
	b := f.batchStore(t)
	const n = 150
	leases := make([]store.Lease, n)
	for i := range leases {
		leases[i] = store.Lease{Namespace: fmt.Sprintf("ns-%d", i%3), Name: fmt.Sprintf("lease-%03d", i), Holder: "east", FencingToken: 1, TTL: time.Minute}
	}
	created, errs, err := b.PutLeases(f.ctx, leases)
	if err != nil || countNil(errs) != n {
		t.Fatalf("create %d leases: %v, %d landed", n, err, countNil(errs))
	}
	const stale = 100
	if _, err := f.store.PutLease(f.ctx, created[stale]); err != nil {
		t.Fatal(err)
	}
	next := make([]store.Lease, n)
	for i, l := range created {
		l.RenewedAt = epoch.Add(time.Duration(i) * time.Millisecond)
		next[i] = l
	}
	written, errs, err := b.PutLeases(f.ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	for i := range next {
		if (errs[i] == nil) == (i == stale) {
			t.Fatalf("update %d: %v; want only %d refused", i, errs[i], stale)
		}
	}
	got, err := b.GetLeases(f.ctx, keysOf(next))
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		want := written[i]
		if i == stale {
			if want, err = f.store.GetLease(f.ctx, next[i].Namespace, next[i].Name); err != nil {
				t.Fatal(err)
			}
		}
		if diff := cmp.Diff(want, got[i]); diff != "" {
			t.Fatalf("lease %d read back (-want +got):\n%s", i, diff)
		}
	}
}

func keysOf(leases []store.Lease) []store.LeaseKey {
	keys := make([]store.LeaseKey, len(leases))
	for i, l := range leases {
		keys[i] = store.LeaseKey{Namespace: l.Namespace, Name: l.Name}
	}
	return keys
}
