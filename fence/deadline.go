package fence

import (
	"math"
	"time"
)

// DriftRate bounds how much slower the fence's clock may run than the lease
// API's store clock: the agent's bound (reconciler.DriftRate), 1%.
const DriftRate = 0.01

// driftDivisor is 1/DriftRate, so that the arithmetic stays in integers.
const driftDivisor = 100

// StopBudget is the time reserved at the end of a term for stopping the
// workload: TTL/3, the agent's (reconciler.StopBudget). Non-positive TTLs
// have none.
func StopBudget(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return 0
	}
	return ttl / 3
}

// KillDelay is how long after SIGTERM the process group gets SIGKILL: half
// the stop budget, so the other half is left for the kernel to tear it down.
func KillDelay(ttl time.Duration) time.Duration { return StopBudget(ttl) / 2 }

// maxConfirmInterval bounds the time between confirmations at long TTLs, so
// that a revoked or released term is noticed within seconds, not hours.
const maxConfirmInterval = 5 * time.Second

// ConfirmInterval is how often a running workload's term is confirmed:
// every TTL/6, at least 250 ms and at most 5 s apart.
func ConfirmInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/6, 250*time.Millisecond), maxConfirmInterval)
}

// RetryInterval is how soon a failed confirmation of a running workload is
// tried again: TTL/30, at least 200 ms and at most 1 s apart.
func RetryInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/30, 200*time.Millisecond), time.Second)
}

// maxTTL bounds the TTL the arithmetic accepts: an int32 of seconds, the
// widest the wire carries.
const maxTTL = math.MaxInt32 * time.Second

// Validity is how long after sending a confirmation request the workload
// may keep running, given the answer's remaining time and the term's TTL:
//
//	remaining·(1 − DriftRate) − StopBudget(ttl)
//
// rounded towards the earlier side, so never above the exact value.
// remaining is capped at ttl (a term never has more than its TTL left; a
// larger answer is not trusted). A TTL that is not positive gives no
// validity at all (math.MinInt64): without a TTL there is no stop budget.
// The result is not positive when the workload may not run.
func Validity(remaining, ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return math.MinInt64
	}
	ttl = min(ttl, maxTTL)
	r := min(remaining, ttl)
	// ceil(ttl/3): the stop budget rounded up.
	stop := (ttl + 2) / 3
	if r <= 0 {
		return addSaturating(r, -stop)
	}
	// ceil(r/100): the drift allowance rounded up.
	drift := (r + driftDivisor - 1) / driftDivisor
	return r - drift - stop
}

// Deadline is the local deadline of one confirmation on the fence's
// monotonic clock (CLOCK_BOOTTIME, as a duration since boot): sent, the
// moment the request was sent, plus Validity. The lease API answered
// remainingMillis (its least bound of the time left on the store's clock)
// no earlier than the request arrived, which is no earlier than sent; so
// by sent + remaining on the fence's clock, slowed by at most DriftRate,
// the term cannot have ended on the store's clock, and the stop budget is
// taken off that. Saturates instead of overflowing.
func Deadline(sent time.Duration, remainingMillis int64, ttlSeconds int32) time.Duration {
	if ttlSeconds <= 0 {
		return math.MinInt64
	}
	v := Validity(millis(remainingMillis), time.Duration(ttlSeconds)*time.Second)
	return addSaturating(sent, v)
}

// millis converts milliseconds to a duration, saturating.
func millis(ms int64) time.Duration {
	const limit = math.MaxInt64 / int64(time.Millisecond)
	switch {
	case ms > limit:
		return math.MaxInt64
	case ms < -limit:
		return math.MinInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// addSaturating is a+b clamped to the range of a duration.
func addSaturating(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}
