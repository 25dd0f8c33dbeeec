package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/store"
)

// Confirm tells whether holder holds the lease key now with exactly token,
// and how long its term has left at least: what berth-fence asks before it
// starts a managed Pod's workload and while it runs (see DecideConfirmation).
// The lease is read before the clock, so that the time remaining is measured
// at an instant no earlier than the record it is about. A never-seen lease
// is store.ErrNotFound, as Get answers it.
func (s *Service) Confirm(ctx context.Context, key leaseapi.Key, holder string, token int32) (leaseapi.Confirmation, error) {
	l, err := s.store.GetLease(ctx, key.Namespace, key.Name)
	if err != nil {
		return leaseapi.Confirmation{}, fmt.Errorf("get lease %s: %w", key, err)
	}
	at, err := s.now(ctx)
	if err != nil {
		return leaseapi.Confirmation{}, err
	}
	return DecideConfirmation(l, holder, token, at.earliest, at.latest), nil
}

// DecideConfirmation is the confirmation of cur for holder with token, on a
// clock reading known to lie in [earliest, latest].
//
// The term is confirmed only while it is holder's, carries token, is not
// revoked, and has at least a millisecond left after the latest time the
// clock may show: RemainingMillis is ExpiresAt - latest, floored to whole
// milliseconds, so a caller that counts it down on its own monotonic clock
// from when it sent the request never believes it has more time than the
// term has. Everything else is not confirmed, with RemainingMillis 0. The
// other fields describe the lease as Get shows it at earliest (an expired
// term shows no holder), so a term confirmed is always one Get shows held.
func DecideConfirmation(cur store.Lease, holder string, token int32, earliest, latest time.Time) leaseapi.Confirmation {
	shown := visible(cur, earliest)
	c := leaseapi.Confirmation{
		Holder:       shown.Holder,
		FencingToken: shown.FencingToken,
		Revoked:      shown.Revoked,
		TTLSeconds:   int32(cur.TTL / time.Second),
	}
	if shown.Holder != holder || shown.FencingToken != token || shown.Revoked {
		return c
	}
	if ms := cur.ExpiresAt.Sub(latest).Milliseconds(); ms > 0 {
		c.Confirmed, c.RemainingMillis = true, ms
	}
	return c
}
