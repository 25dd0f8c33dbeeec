package reconciler

import (
	"context"
	"time"
)

// leadershipRetry is how soon a process that is not certainly the leader looks again.
const leadershipRetry = time.Second

// whileLeading bounds ctx by this process's certain leadership (LeadingUntil), and
// reports false, with nothing to do, when that has ended.
//
// Two replicas of one cluster's agent are one holder to the lease API: it cannot tell
// their calls apart. A leader frozen (SIGSTOP, a stalled node) for longer than the leader
// election's lease wakes believing it still leads, while the replica elected meanwhile
// runs the same term; client-go tells the woken one only at its next failed renewal,
// seconds later (kubernetes#44887). Whatever it did then, it did with stale memory: a
// self-fence that releases the term the other replica's Pods run under, Pods stopped or
// ungated under a term it no longer follows. So every reconcile, every batch of
// renewals and every acquire happens within the leadership, and every call it makes is
// cut off at its end: what the woken replica sends can only have been sent while no
// other replica led.
func (r *BerthLeaseReconciler) whileLeading(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if r.LeadingUntil == nil {
		return ctx, func() {}, true
	}
	until := r.LeadingUntil()
	if !r.Clock.Now().Before(until) {
		return ctx, func() {}, false
	}
	ctx, cancel := context.WithDeadline(ctx, r.wallDeadline(until))
	return ctx, cancel, true
}
