package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
)

// ClockMaxUncertainty is the widest reading of the database's clock the
// store serves with: about one round trip to the database in practice.
const ClockMaxUncertainty = time.Second

var _ store.Clock = (*Store)(nil)

// readClock reads the database's clock: clock_timestamp() is the time at the
// call, not at the start of a transaction as now() is.
func (s *Store) readClock(ctx context.Context) (time.Time, time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("read clock_timestamp(): %w", err)
	}
	return t, t.Add(time.Microsecond), nil
}

// Now implements store.Clock: every replica on this database judges lease
// terms by the database's clock, sampled in the background and carried
// forward on the local monotonic clock.
func (s *Store) Now(ctx context.Context) (store.Reading, error) { return s.clock.Now(ctx) }

// Clock is the store's clock, for its metrics.
func (s *Store) Clock() *refclock.Clock { return s.clock }

// startClock samples the database's clock until stopClock.
func (s *Store) startClock(opts refclock.Options) {
	if opts.MaxUncertainty <= 0 {
		opts.MaxUncertainty = ClockMaxUncertainty
	}
	s.clock, s.stopClock = refclock.Start(s.readClock, opts)
}
