package reconciler

import "time"

// The timing bounds of self-fencing (docs/safety.md argues them).
//
// A holder measures its term on its own monotonic clock from the moment it
// sent the request that granted or renewed it; the lease API measures it from
// when that request arrived, which is later. The holder's local deadline is
//
//	deadline = sent + ttl·(1 − DriftRate) − StopBudget(ttl)
//
// At the deadline it starts deleting its Pods, with grace periods bounded so
// that they are gone within StopBudget, that is before sent + ttl·(1 −
// DriftRate): before the lease API could give the lease to anyone else, even
// if the holder's clock runs DriftRate slower than the server's.
const (
	// DriftRate bounds how much slower the agent's clock may run than the
	// lease API's. NTP-disciplined clocks drift by about 1e-5; 1% is a wide
	// margin.
	DriftRate = 0.01
)

// StopBudget is the time reserved at the end of a term for stopping Pods.
func StopBudget(ttl time.Duration) time.Duration { return ttl / 3 }

// LocalValidity is how long after sending a successful acquire or renew the
// holder may consider itself the holder.
func LocalValidity(ttl time.Duration) time.Duration {
	return ttl - time.Duration(float64(ttl)*DriftRate) - StopBudget(ttl)
}

// podGracePeriod bounds a stopped Pod's termination grace period so that the
// kubelet has killed it well within the stop budget, leaving the rest for
// the API round trips. It is never below one second: the API server removes
// a Pod deleted with a grace period of 0 at once, without waiting for the
// kubelet to stop it, so the agent would see it gone and release the lease
// while its containers may still run.
func podGracePeriod(ttl time.Duration, podGrace *int64) int64 {
	limit := max(int64(StopBudget(ttl)/2/time.Second), 1)
	if podGrace != nil && *podGrace < limit {
		return max(*podGrace, 1)
	}
	return limit
}

// retryInterval is how soon a failed renew is retried: often enough for
// several tries before the deadline, never in a tight loop.
func retryInterval(heartbeat time.Duration) time.Duration {
	return max(heartbeat/5, 200*time.Millisecond)
}
