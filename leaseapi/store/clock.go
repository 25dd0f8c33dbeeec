package store

import (
	"context"
	"time"
)

// Reading is a clock reading known only within bounds: the clock showed a
// time in [Earliest, Latest] at the moment it was read.
type Reading struct {
	Earliest, Latest time.Time
}

// Uncertainty is the width of the reading.
func (r Reading) Uncertainty() time.Duration { return r.Latest.Sub(r.Earliest) }

// Clock is what a store that several servers share also offers: the one
// clock all of them judge lease terms by, instead of each its own (see
// docs/safety.md, "Clocks").
type Clock interface {
	// Now reads the store's clock. It fails when the clock cannot be bounded
	// within the store's limit (no fresh sample of it); the server must then
	// not judge any term.
	Now(ctx context.Context) (Reading, error)
}
