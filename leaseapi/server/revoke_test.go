package server

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthfleet/berth/leaseapi"
)

// TestAdminReleaseRevokes: an administrator's release of another subject's
// live term must not free it while its holder may still run. The term is
// revoked: its holder cannot re-acquire it and is never told it holds it
// (its renew only extends it while it stops), nobody else gets it, and it
// moves only when its holder releases it (a handover) or when it ends.
func TestAdminReleaseRevokes(t *testing.T) {
	const ttlSeconds = 10
	post := func(f *fixture, token, name, verb, body string) response {
		return f.do(request{method: http.MethodPost, path: leasePath("ns", name, verb), token: token, body: body})
	}
	// revoke acquires name for cluster-a, lets the administrator release it
	// one second later and checks that every path to the lease is refused
	// while the term lasts. It returns the term as granted.
	revoke := func(t *testing.T, f *fixture, name string) leaseapi.AcquireResponse {
		t.Helper()
		term := f.acquire(tokenA, "ns", name, "cluster-a", ttlSeconds)
		f.clock.Step(time.Second)
		release := fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, term.FencingToken)
		for range 2 { // a second revocation changes nothing
			if res := post(f, tokenAdmin, name, "release", release); res.code != http.StatusNoContent {
				t.Fatalf("admin release: %d %s, want 204", res.code, res.body)
			}
		}
		want := leaseapi.AcquireResponse{Holder: "cluster-a", FencingToken: term.FencingToken,
			AcquiredAt: term.AcquiredAt, RenewedAt: term.RenewedAt, ExpiresAt: term.ExpiresAt, Revoked: true}

		var l leaseapi.Lease
		f.do(request{method: http.MethodGet, path: leasePath("ns", name, ""), token: tokenB}).decode(t, &l)
		wantLease := leaseapi.Lease{Namespace: "ns", Name: name, Holder: "cluster-a", FencingToken: term.FencingToken,
			TTLSeconds: ttlSeconds, AcquiredAt: term.AcquiredAt, RenewedAt: term.RenewedAt, ExpiresAt: term.ExpiresAt, Revoked: true}
		if diff := cmp.Diff(wantLease, l); diff != "" {
			t.Fatalf("lease after the admin's release (-want +got):\n%s", diff)
		}
		for what, res := range map[string]response{
			"another's acquire":    post(f, tokenB, name, "acquire", `{"holder":"cluster-b","ttlSeconds":10}`),
			"the holder's acquire": post(f, tokenA, name, "acquire", `{"holder":"cluster-a","ttlSeconds":10}`),
		} {
			var got leaseapi.AcquireResponse
			res.decode(t, &got)
			if diff := cmp.Diff(want, got); res.code != http.StatusOK || diff != "" {
				t.Errorf("%s of a revoked term: %d (-want +got):\n%s", what, res.code, diff)
			}
		}
		// The holder's renew extends the revoked term (its Pods may not be
		// gone yet) but never tells it that it holds the lease.
		var renewed leaseapi.AcquireResponse
		res := post(f, tokenA, name, "renew", fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d,"ttlSeconds":10}`, term.FencingToken))
		res.decode(t, &renewed)
		wantRenewed := want
		wantRenewed.RenewedAt, wantRenewed.ExpiresAt = f.clock.Now().UTC(), f.clock.Now().UTC().Add(ttlSeconds*time.Second)
		if diff := cmp.Diff(wantRenewed, renewed); res.code != http.StatusOK || diff != "" {
			t.Errorf("the holder's renew of a revoked term: %d (-want +got):\n%s", res.code, diff)
		}
		return leaseapi.AcquireResponse{Acquired: true, Holder: renewed.Holder, FencingToken: renewed.FencingToken,
			AcquiredAt: renewed.AcquiredAt, RenewedAt: renewed.RenewedAt, ExpiresAt: renewed.ExpiresAt}
	}

	t.Run("the holder's release hands over", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{})
		term := revoke(t, f, "handover")
		if res := post(f, tokenA, "handover", "release", fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, term.FencingToken)); res.code != http.StatusNoContent {
			t.Fatalf("holder's release of its revoked term: %d %s, want 204", res.code, res.body)
		}
		got := f.acquire(tokenB, "ns", "handover", "cluster-b", ttlSeconds)
		if !got.Acquired || got.Holder != "cluster-b" || got.FencingToken != term.FencingToken+1 || got.Revoked {
			t.Fatalf("acquire after the handover: %+v, want cluster-b's unrevoked term %d", got, term.FencingToken+1)
		}
		if n := testutil.ToFloat64(f.srv.Metrics.outcomes.WithLabelValues("revoked")); n != 3 {
			t.Errorf("revoked outcomes = %v, want 3 (two releases, the second writing nothing, and the holder's renew)", n)
		}
	})

	t.Run("the term ends at its expiry", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{})
		term := revoke(t, f, "lapse")
		f.clock.SetTime(term.ExpiresAt.Add(-time.Millisecond))
		if got := f.acquire(tokenB, "ns", "lapse", "cluster-b", ttlSeconds); got.Acquired {
			t.Fatalf("acquire a millisecond before the revoked term ends: %+v, want refused", got)
		}
		f.srv.sweep(t.Context())
		f.clock.SetTime(term.ExpiresAt)
		f.srv.sweep(t.Context())
		var l leaseapi.Lease
		f.do(request{method: http.MethodGet, path: leasePath("ns", "lapse", ""), token: tokenB}).decode(t, &l)
		if l.Holder != "" || l.Revoked {
			t.Fatalf("lease after its revoked term ended and the sweep ran: %+v, want free without the mark", l)
		}
		got := f.acquire(tokenB, "ns", "lapse", "cluster-b", ttlSeconds)
		if !got.Acquired || got.FencingToken != term.FencingToken+1 || got.Revoked {
			t.Fatalf("acquire after the revoked term ended: %+v, want cluster-b's unrevoked term %d", got, term.FencingToken+1)
		}
	})

	t.Run("the holder's own subject releases at once", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{})
		term := f.acquire(tokenA, "ns", "own", "cluster-a", ttlSeconds)
		if res := post(f, tokenA, "own", "release", fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, term.FencingToken)); res.code != http.StatusNoContent {
			t.Fatalf("holder's release: %d %s", res.code, res.body)
		}
		if got := f.acquire(tokenB, "ns", "own", "cluster-b", ttlSeconds); !got.Acquired {
			t.Fatalf("acquire after the holder's own release: %+v, want acquired", got)
		}
	})

	t.Run("revoke never frees a live term, whoever asks", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{})
		term := f.acquire(tokenA, "ns", "asked", "cluster-a", ttlSeconds)
		body := fmt.Sprintf(`{"holder":"cluster-a","fencingToken":%d}`, term.FencingToken)
		if res := post(f, tokenB, "asked", "revoke", body); res.code != http.StatusForbidden {
			t.Errorf("another cluster's revoke: %d %s, want 403", res.code, res.body)
		}
		for who, token := range map[string]string{"the holder's own subject": tokenA, "an administrator": tokenAdmin} {
			if res := post(f, token, "asked", "revoke", body); res.code != http.StatusNoContent {
				t.Fatalf("revoke by %s: %d %s, want 204", who, res.code, res.body)
			}
			if got := f.acquire(tokenB, "ns", "asked", "cluster-b", ttlSeconds); got.Acquired || got.Holder != "cluster-a" || !got.Revoked {
				t.Fatalf("acquire after a revoke by %s: %+v, want cluster-a's revoked term", who, got)
			}
		}
		if res := post(f, tokenAdmin, "asked", "revoke", `{"holder":"cluster-a","fencingToken":99}`); res.code != http.StatusConflict {
			t.Errorf("revoke of another term: %d %s, want 409", res.code, res.body)
		}
	})
}
