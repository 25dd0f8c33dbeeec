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
// the API round trips.
func podGracePeriod(ttl time.Duration, podGrace *int64) int64 {
	limit := int64(StopBudget(ttl) / 2 / time.Second)
	if podGrace != nil && *podGrace < limit {
		return *podGrace
	}
	return limit
}

// retryInterval is how soon a failed renew is retried: often enough for
// several tries before the deadline, never in a tight loop.
func retryInterval(heartbeat time.Duration) time.Duration {
	return max(heartbeat/5, 200*time.Millisecond)
}
