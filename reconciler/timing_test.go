package reconciler

import (
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ttls spans the TTLs a BerthLease may have, the odd ones included.
var ttls = []time.Duration{
	3 * time.Second, 4 * time.Second, 5 * time.Second, 6 * time.Second, 7 * time.Second,
	10 * time.Second, 11 * time.Second, 15 * time.Second, 30 * time.Second, 31 * time.Second,
	time.Minute, 97 * time.Second, 5 * time.Minute, 17 * time.Minute, time.Hour,
	3*time.Second + time.Nanosecond, 3333333333 * time.Nanosecond,
}

// TestTimingSelfFenceBound checks the bound of docs/safety.md: a holder that
// starts stopping at its local deadline has its Pods gone before the lease
// API can give the lease to anyone else, even when the holder's clock runs
// DriftRate slower than the server's and its request took no time at all.
func TestTimingSelfFenceBound(t *testing.T) {
	// 1 − DriftRate, exactly as the float constant says.
	keep := new(big.Rat).Sub(big.NewRat(1, 1), new(big.Rat).SetFloat64(DriftRate))
	for _, ttl := range ttls {
		t.Run(ttl.String(), func(t *testing.T) {
			validity, budget := LocalValidity(ttl), StopBudget(ttl)
			if validity <= 0 || budget <= 0 {
				t.Fatalf("LocalValidity = %v, StopBudget = %v: both must be positive", validity, budget)
			}
			// On the holder's clock the Pods are gone by validity+budget
			// after the request was sent. That must not be later than
			// ttl·(1−DriftRate) at the nanosecond resolution of Duration
			// (the float 0.01 is a little above 1%, so the exact product is
			// a fraction of a nanosecond below a whole one).
			stopDone := validity + budget
			limit := new(big.Rat).Mul(big.NewRat(int64(ttl), 1), keep)
			limitNs := new(big.Int).Quo(limit.Num(), limit.Denom()) // floor, both positive
			if !limit.IsInt() {
				limitNs.Add(limitNs, big.NewInt(1)) // ceiling
			}
			if got := big.NewInt(int64(stopDone)); got.Cmp(limitNs) > 0 {
				t.Errorf("Pods gone %v after sending, later than ttl·(1−DriftRate) = %sns (rounded up)", stopDone, limitNs)
			}

			// The same seen from the lease API: the holder's clock runs
			// DriftRate slow, so its stopDone is stopDone/(1−DriftRate) on
			// the server's clock, whose term began no earlier than the send.
			serverDone := new(big.Rat).Quo(big.NewRat(int64(stopDone), 1), keep)
			// The same nanosecond of resolution.
			serverExpiry := big.NewRat(int64(ttl)+1, 1)
			if serverDone.Cmp(serverExpiry) > 0 {
				t.Errorf("on the server's clock the Pods are gone %sns after the term began, after its expiry at %v", serverDone.FloatString(3), ttl)
			}

			// The heartbeat CEL admits (at most a third of the TTL) leaves
			// room for the renew and retries of it before the deadline.
			heartbeat := ttl / 3
			if renewBy := heartbeat + 3*retryInterval(heartbeat); renewBy >= validity {
				t.Errorf("a renew and three retries take until %v, not before the local deadline %v", renewBy, validity)
			}

			// A stopped Pod's grace period fits the stop budget.
			grace := time.Duration(podGracePeriod(ttl, nil)) * time.Second
			if grace > budget {
				t.Errorf("podGracePeriod = %v, more than the stop budget %v", grace, budget)
			}
		})
	}
}

func TestTimingPodGracePeriod(t *testing.T) {
	cases := map[string]struct {
		ttl       time.Duration
		podGrace  *int64
		wantGrace int64
	}{
		"ttl 30s, no grace on the Pod: half the stop budget": {ttl: 30 * time.Second, wantGrace: 5},
		"ttl 30s, Pod grace larger: bounded":                 {ttl: 30 * time.Second, podGrace: ptr(int64(30)), wantGrace: 5},
		"ttl 30s, Pod grace smaller: kept":                   {ttl: 30 * time.Second, podGrace: ptr(int64(2)), wantGrace: 2},
		"ttl 30s, Pod grace equal: kept":                     {ttl: 30 * time.Second, podGrace: ptr(int64(5)), wantGrace: 5},
		"ttl 1h, no grace":                                   {ttl: time.Hour, wantGrace: 600},
		"ttl 1h, default Pod grace of 30s: kept":             {ttl: time.Hour, podGrace: ptr(int64(30)), wantGrace: 30},
		"ttl 10s: half the budget rounds down to 1s":         {ttl: 10 * time.Second, podGrace: ptr(int64(30)), wantGrace: 1},
		// A grace period of 0 makes the API server drop the Pod at once,
		// while its containers may still run: never below 1s.
		"ttl 3s: never 0":                        {ttl: 3 * time.Second, wantGrace: 1},
		"ttl 5s, Pod grace 30s: never 0":         {ttl: 5 * time.Second, podGrace: ptr(int64(30)), wantGrace: 1},
		"ttl 30s, Pod grace 0: raised to 1s":     {ttl: 30 * time.Second, podGrace: ptr(int64(0)), wantGrace: 1},
		"ttl 30s, negative Pod grace: raised":    {ttl: 30 * time.Second, podGrace: ptr(int64(-1)), wantGrace: 1},
		"ttl 6s, Pod grace 1s: kept":             {ttl: 6 * time.Second, podGrace: ptr(int64(1)), wantGrace: 1},
		"ttl 12s, no grace: stop budget 4s, 2s":  {ttl: 12 * time.Second, wantGrace: 2},
		"ttl 12s, Pod grace 3s: bounded to 2s":   {ttl: 12 * time.Second, podGrace: ptr(int64(3)), wantGrace: 2},
		"ttl 5m, Pod grace 120s: bounded to 50s": {ttl: 5 * time.Minute, podGrace: ptr(int64(120)), wantGrace: 50},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.wantGrace, podGracePeriod(tc.ttl, tc.podGrace)); diff != "" {
				t.Errorf("podGracePeriod(%v, %v) mismatch (-want +got):\n%s", tc.ttl, fmtGrace(tc.podGrace), diff)
			}
		})
	}
}

// TestTimingPodGracePeriodBounds: for every TTL and Pod grace period, the
// grace period is at least 1s, never more than the Pod asked for unless it
// asked for less than 1s, and within half the stop budget whenever that is
// at least 1s.
func TestTimingPodGracePeriodBounds(t *testing.T) {
	for _, ttl := range ttls {
		for _, pg := range []*int64{nil, ptr(int64(0)), ptr(int64(1)), ptr(int64(2)), ptr(int64(30)), ptr(int64(3600))} {
			got := podGracePeriod(ttl, pg)
			half := StopBudget(ttl) / 2
			switch {
			case got < 1:
				t.Errorf("podGracePeriod(%v, %s) = %d, below 1s", ttl, fmtGrace(pg), got)
			case pg != nil && *pg >= 1 && got > *pg:
				t.Errorf("podGracePeriod(%v, %s) = %d, more than the Pod asked for", ttl, fmtGrace(pg), got)
			case half >= time.Second && time.Duration(got)*time.Second > half:
				t.Errorf("podGracePeriod(%v, %s) = %d, more than half the stop budget %v", ttl, fmtGrace(pg), got, half)
			}
		}
	}
}

func TestTimingRetryInterval(t *testing.T) {
	cases := map[string]struct {
		heartbeat time.Duration
		want      time.Duration
	}{
		"10s heartbeat: a fifth":        {heartbeat: 10 * time.Second, want: 2 * time.Second},
		"1h heartbeat: a fifth":         {heartbeat: time.Hour, want: 12 * time.Minute},
		"1s heartbeat: 200ms":           {heartbeat: time.Second, want: 200 * time.Millisecond},
		"500ms heartbeat: floor":        {heartbeat: 500 * time.Millisecond, want: 200 * time.Millisecond},
		"zero heartbeat: floor":         {heartbeat: 0, want: 200 * time.Millisecond},
		"just above the floor: a fifth": {heartbeat: 1005 * time.Millisecond, want: 201 * time.Millisecond},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, retryInterval(tc.heartbeat)); diff != "" {
				t.Errorf("retryInterval(%v) mismatch (-want +got):\n%s", tc.heartbeat, diff)
			}
		})
	}
}

func TestTimingLocalValidity(t *testing.T) {
	cases := map[string]struct {
		ttl          time.Duration
		wantValidity time.Duration
		wantBudget   time.Duration
	}{
		"30s": {ttl: 30 * time.Second, wantValidity: 19700 * time.Millisecond, wantBudget: 10 * time.Second},
		"3s":  {ttl: 3 * time.Second, wantValidity: 1970 * time.Millisecond, wantBudget: time.Second},
		"1h":  {ttl: time.Hour, wantValidity: 2364 * time.Second, wantBudget: 20 * time.Minute},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := [2]time.Duration{LocalValidity(tc.ttl), StopBudget(tc.ttl)}
			if diff := cmp.Diff([2]time.Duration{tc.wantValidity, tc.wantBudget}, got); diff != "" {
				t.Errorf("[LocalValidity, StopBudget](%v) mismatch (-want +got):\n%s", tc.ttl, diff)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func fmtGrace(g *int64) string {
	if g == nil {
		return "nil"
	}
	return fmt.Sprint(*g)
}
