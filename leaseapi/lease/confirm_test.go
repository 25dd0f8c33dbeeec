package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/store"
)

// TestDecideConfirmation: a term is confirmed only for its holder and token,
// unrevoked, with at least a millisecond left after the latest bound of the
// clock; the time left is measured from that bound.
func TestDecideConfirmation(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	held := store.Lease{
		Namespace: "payments", Name: "exporter", Holder: "east", FencingToken: 7, TTL: 30 * time.Second,
		AcquiredAt: t0.Add(-time.Minute), RenewedAt: t0.Add(-10 * time.Second), ExpiresAt: t0.Add(20 * time.Second),
	}
	with := func(f func(*store.Lease)) store.Lease { l := held; f(&l); return l }
	exact := func(d time.Duration) [2]time.Time { return [2]time.Time{t0.Add(d), t0.Add(d)} }
	cases := map[string]struct {
		lease  store.Lease
		holder string
		token  int32
		// at is the clock reading [earliest, latest].
		at   [2]time.Time
		want leaseapi.Confirmation
	}{
		"held: the time to expiry": {
			lease: held, holder: "east", token: 7, at: exact(0),
			want: leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 7, TTLSeconds: 30, RemainingMillis: 20000},
		},
		"measured from the latest bound": {
			lease: held, holder: "east", token: 7, at: [2]time.Time{t0, t0.Add(1500 * time.Millisecond)},
			want: leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 7, TTLSeconds: 30, RemainingMillis: 18500},
		},
		"floored to whole milliseconds": {
			lease: held, holder: "east", token: 7, at: exact(time.Second + time.Microsecond),
			want: leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 7, TTLSeconds: 30, RemainingMillis: 18999},
		},
		"less than a millisecond left": {
			lease: held, holder: "east", token: 7, at: exact(20*time.Second - 999*time.Microsecond),
			want: leaseapi.Confirmation{Holder: "east", FencingToken: 7, TTLSeconds: 30},
		},
		"held at the earliest bound, ended at the latest": {
			lease: held, holder: "east", token: 7, at: [2]time.Time{t0.Add(19 * time.Second), t0.Add(21 * time.Second)},
			want: leaseapi.Confirmation{Holder: "east", FencingToken: 7, TTLSeconds: 30},
		},
		"expired, not yet swept": {
			lease: held, holder: "east", token: 7, at: exact(20 * time.Second),
			want: leaseapi.Confirmation{FencingToken: 7, TTLSeconds: 30},
		},
		"another token of the same holder": {
			lease: held, holder: "east", token: 6, at: exact(0),
			want: leaseapi.Confirmation{Holder: "east", FencingToken: 7, TTLSeconds: 30},
		},
		"another holder": {
			lease: held, holder: "west", token: 7, at: exact(0),
			want: leaseapi.Confirmation{Holder: "east", FencingToken: 7, TTLSeconds: 30},
		},
		"a holder of the same cluster": {
			lease: held, holder: "east/other", token: 7, at: exact(0),
			want: leaseapi.Confirmation{Holder: "east", FencingToken: 7, TTLSeconds: 30},
		},
		"revoked": {
			lease: with(func(l *store.Lease) { l.Revoked = true }), holder: "east", token: 7, at: exact(0),
			want: leaseapi.Confirmation{Holder: "east", FencingToken: 7, Revoked: true, TTLSeconds: 30},
		},
		"released": {
			lease: with(func(l *store.Lease) { l.Holder = "" }), holder: "east", token: 7, at: exact(0),
			want: leaseapi.Confirmation{FencingToken: 7, TTLSeconds: 30},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := lease.DecideConfirmation(tc.lease, tc.holder, tc.token, tc.at[0], tc.at[1])
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("confirmation (-want +got):\n%s", diff)
			}
			if got.Confirmed != (got.RemainingMillis > 0) {
				t.Errorf("confirmed %t with %d ms remaining", got.Confirmed, got.RemainingMillis)
			}
			if end := tc.at[1].Add(time.Duration(got.RemainingMillis) * time.Millisecond); got.Confirmed && end.After(tc.lease.ExpiresAt) {
				t.Errorf("remaining %d ms from the latest bound ends at %s, after the term's %s", got.RemainingMillis, end, tc.lease.ExpiresAt)
			}
		})
	}
}

// TestServiceConfirm: the service confirms on the clock that judges terms
// (here a shared store's, within bounds) and not on its own, and a lease
// never seen is store.ErrNotFound.
func TestServiceConfirm(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	clk := &fixedClock{reading: store.Reading{Earliest: t0, Latest: t0.Add(time.Second)}}
	svc := lease.NewService(openSQLite(t), lease.Options{StoreClock: clk})
	key := leaseapi.Key{Namespace: "payments", Name: "exporter"}
	ctx := t.Context()
	if _, err := svc.Confirm(ctx, key, "east", 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("confirm of a lease never seen: %v, want store.ErrNotFound", err)
	}
	d, err := svc.Acquire(ctx, key, "east", 10*time.Second)
	if err != nil || d.Outcome != lease.OutcomeAcquired {
		t.Fatalf("acquire: %v, %v", d.Outcome, err)
	}
	// Granted from t0 to 11 s (a TTL past the latest bound); read at [4 s, 4.25 s].
	clk.reading = store.Reading{Earliest: t0.Add(4 * time.Second), Latest: t0.Add(4250 * time.Millisecond)}
	got, err := svc.Confirm(ctx, key, "east", d.Next.FencingToken)
	if err != nil {
		t.Fatal(err)
	}
	want := leaseapi.Confirmation{Confirmed: true, Holder: "east", FencingToken: 1, TTLSeconds: 10, RemainingMillis: 6750}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("confirmation (-want +got):\n%s", diff)
	}
	broken := errors.New("no usable sample of the store's clock")
	clk.err = broken
	if _, err := svc.Confirm(ctx, key, "east", 1); !errors.Is(err, broken) {
		t.Errorf("confirm without the store's clock: %v, want its error", err)
	}
}
