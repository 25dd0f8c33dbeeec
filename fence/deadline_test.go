package fence

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/berthfleet/berth/reconciler"
)

func TestDeadline(t *testing.T) {
	const sent = 1000 * time.Second
	cases := map[string]struct {
		remainingMillis int64
		ttlSeconds      int32
		want            time.Duration
	}{
		"full term of 30 s":       {remainingMillis: 30000, ttlSeconds: 30, want: sent + 19700*time.Millisecond},
		"full term of 6 s":        {remainingMillis: 6000, ttlSeconds: 6, want: sent + 3940*time.Millisecond},
		"half a term":             {remainingMillis: 15000, ttlSeconds: 30, want: sent + 14850*time.Millisecond - 10*time.Second},
		"remaining below budget":  {remainingMillis: 5000, ttlSeconds: 30, want: sent + 4950*time.Millisecond - 10*time.Second},
		"remaining above the TTL": {remainingMillis: 3_600_000, ttlSeconds: 30, want: sent + 19700*time.Millisecond},
		"zero remaining":          {remainingMillis: 0, ttlSeconds: 30, want: sent - 10*time.Second},
		"negative remaining":      {remainingMillis: -2000, ttlSeconds: 30, want: sent - 12*time.Second},
		"most negative remaining": {remainingMillis: math.MinInt64, ttlSeconds: 30, want: sent + math.MinInt64},
		"huge remaining":          {remainingMillis: math.MaxInt64, ttlSeconds: math.MaxInt32, want: sent + maxTTL - maxTTL/100 - (maxTTL+2)/3},
		"no TTL":                  {remainingMillis: 30000, ttlSeconds: 0, want: math.MinInt64},
		"negative TTL":            {remainingMillis: 30000, ttlSeconds: -5, want: math.MinInt64},
		"TTL of one second":       {remainingMillis: 1000, ttlSeconds: 1, want: sent + 990*time.Millisecond - 333333334},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := Deadline(sent, tc.remainingMillis, tc.ttlSeconds); got != tc.want {
				t.Errorf("Deadline(%s, %d ms, %d s) = %s, want %s", sent, tc.remainingMillis, tc.ttlSeconds, got, tc.want)
			}
		})
	}
}

// TestValidityAgreesWithTheAgent: a term confirmed in full gives the fence
// the agent's local validity (reconciler.LocalValidity), never more, and
// at most a nanosecond of rounding less.
func TestValidityAgreesWithTheAgent(t *testing.T) {
	if DriftRate != reconciler.DriftRate {
		t.Fatalf("DriftRate %v, the agent's %v", DriftRate, reconciler.DriftRate)
	}
	for _, ttl := range []time.Duration{time.Second, 3 * time.Second, 6 * time.Second, 30 * time.Second, 7 * time.Minute, time.Hour, 24 * time.Hour} {
		got, agent := Validity(ttl, ttl), reconciler.LocalValidity(ttl)
		if got > agent || agent-got > time.Nanosecond {
			t.Errorf("TTL %s: fence validity %s, agent's %s", ttl, got, agent)
		}
		if StopBudget(ttl) != reconciler.StopBudget(ttl) {
			t.Errorf("TTL %s: stop budget %s, agent's %s", ttl, StopBudget(ttl), reconciler.StopBudget(ttl))
		}
	}
}

func TestIntervals(t *testing.T) {
	cases := map[string]struct {
		ttl                    time.Duration
		wantConfirm, wantRetry time.Duration
	}{
		"30 s": {ttl: 30 * time.Second, wantConfirm: 5 * time.Second, wantRetry: time.Second},
		"6 s":  {ttl: 6 * time.Second, wantConfirm: time.Second, wantRetry: 200 * time.Millisecond},
		"1 s":  {ttl: time.Second, wantConfirm: 250 * time.Millisecond, wantRetry: 200 * time.Millisecond},
		"24 h": {ttl: 24 * time.Hour, wantConfirm: 5 * time.Second, wantRetry: time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ConfirmInterval(tc.ttl); got != tc.wantConfirm {
				t.Errorf("ConfirmInterval = %s, want %s", got, tc.wantConfirm)
			}
			if got := RetryInterval(tc.ttl); got != tc.wantRetry {
				t.Errorf("RetryInterval = %s, want %s", got, tc.wantRetry)
			}
		})
	}
}

// exactBound is sent + remaining·(1 − DriftRate) − ttl/3 in exact
// arithmetic, with remaining capped at the TTL as Deadline caps it.
func exactBound(sent time.Duration, remainingMillis int64, ttlSeconds int32) *big.Rat {
	ttl := new(big.Rat).SetInt64(int64(ttlSeconds) * int64(time.Second))
	r := new(big.Rat).SetInt64(remainingMillis)
	r.Mul(r, big.NewRat(int64(time.Millisecond), 1))
	if r.Cmp(ttl) > 0 {
		r = ttl
	}
	b := new(big.Rat).Mul(r, big.NewRat(99, 100))
	b.Sub(b, new(big.Rat).Quo(ttl, big.NewRat(3, 1)))
	return b.Add(b, new(big.Rat).SetInt64(int64(sent)))
}

func FuzzDeadline(f *testing.F) {
	f.Add(int64(1000*time.Second), int64(30000), int32(30), int64(1), int64(1))
	f.Add(int64(0), int64(0), int32(1), int64(0), int64(0))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int32(math.MaxInt32), int64(-1), int64(5))
	f.Add(int64(math.MinInt64), int64(math.MinInt64), int32(math.MinInt32), int64(7), int64(-3))
	f.Fuzz(func(t *testing.T, sent, remainingMillis int64, ttlSeconds int32, dSent, dRemaining int64) {
		d := Deadline(time.Duration(sent), remainingMillis, ttlSeconds)
		if ttlSeconds <= 0 {
			if d != math.MinInt64 {
				t.Fatalf("TTL %d s: deadline %d, want none", ttlSeconds, d)
			}
			return
		}
		// Never past the bound (a saturated deadline is at the range's
		// end, and the bound past it only when the bound is beyond the
		// range).
		bound := exactBound(time.Duration(sent), remainingMillis, ttlSeconds)
		if new(big.Rat).SetInt64(int64(d)).Cmp(bound) > 0 {
			t.Fatalf("Deadline(%d, %d ms, %d s) = %d, above the bound %s", sent, remainingMillis, ttlSeconds, d, bound.FloatString(1))
		}
		// Monotone in remaining and in sent.
		if dRemaining >= 0 && remainingMillis <= math.MaxInt64-dRemaining {
			if d2 := Deadline(time.Duration(sent), remainingMillis+dRemaining, ttlSeconds); d2 < d {
				t.Fatalf("more remaining (%d ms more) moved the deadline back: %d < %d", dRemaining, d2, d)
			}
		}
		if dSent >= 0 && sent <= math.MaxInt64-dSent {
			if d2 := Deadline(time.Duration(sent+dSent), remainingMillis, ttlSeconds); d2 < d {
				t.Fatalf("a later send (%d ns later) moved the deadline back: %d < %d", dSent, d2, d)
			}
		}
	})
}
