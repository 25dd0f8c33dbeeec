package fence

import (
	"time"

	"golang.org/x/sys/unix"
)

// Clock is the supervisor's time: Now on a monotonic clock that keeps
// counting through system suspend, and timers. The supervisor never trusts
// a timer alone for a deadline: it wakes at least every PollInterval and
// compares Now with the deadline.
type Clock interface {
	// Now is the time since an arbitrary, fixed origin (boot).
	Now() time.Duration
	// After fires once, about d from now.
	After(d time.Duration) <-chan time.Time
}

// PollInterval is the longest the supervisor waits without reading the
// clock while a deadline is pending.
const PollInterval = 100 * time.Millisecond

// BootClock reads CLOCK_BOOTTIME: monotonic, and unlike CLOCK_MONOTONIC
// (which Go's timers and contexts use) it counts the time the system was
// suspended, so a deadline measured on it passes during a suspend too.
type BootClock struct{}

var _ Clock = BootClock{}

// Now reads CLOCK_BOOTTIME.
func (BootClock) Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// CLOCK_BOOTTIME exists on every Linux since 2.6.39; without it
		// nothing here can be trusted.
		panic("berth-fence: read CLOCK_BOOTTIME: " + err.Error())
	}
	return time.Duration(ts.Nano())
}

// After is time.After.
func (BootClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
