package refclock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/berthfleet/berth/leaseapi/store"
)

// DriftRate bounds how much the rates of the local monotonic clock and the
// remote clock may differ. Free-running quartz is within 1e-4 and NTP slews
// a clock by at most 5e-4; samples are carried forward for at most MaxAge.
const DriftRate = 1e-3

// Defaults of Options.
const (
	DefaultInterval       = 2 * time.Second
	DefaultMaxAge         = 30 * time.Second
	DefaultMaxUncertainty = time.Second
	DefaultSampleTimeout  = 5 * time.Second
)

// maxSamples bounds the samples kept, whatever their age.
const maxSamples = 64

// ReadFunc reads the remote clock once: it showed a time in [earliest,
// latest] while the call was under way (latest is after earliest by the
// clock's resolution: a microsecond for a database timestamp, a second for
// an HTTP Date header).
type ReadFunc func(ctx context.Context) (earliest, latest time.Time, err error)

// Options configures a Clock.
type Options struct {
	// Clock is the local clock. Only differences of its readings are used,
	// which on the real clock are monotonic. Defaults to the real clock.
	Clock clock.Clock
	// Interval is the time between background samples (Run). With a clock
	// of coarse resolution, samples are timed to fall on its ticks, between
	// half and one and a half Intervals apart.
	Interval time.Duration
	// MaxAge is how long a sample is used; with none younger, Now samples
	// again before answering.
	MaxAge time.Duration
	// MaxUncertainty is the widest reading Now returns; wider, it fails.
	MaxUncertainty time.Duration
	// SampleTimeout bounds one sample.
	SampleTimeout time.Duration
}

func (o *Options) defaults() {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.MaxUncertainty <= 0 {
		o.MaxUncertainty = DefaultMaxUncertainty
	}
	if o.SampleTimeout <= 0 {
		o.SampleTimeout = DefaultSampleTimeout
	}
}

// sample is one reading of the remote clock, anchored to the local clock.
type sample struct {
	// sent and received are local readings around the remote one.
	sent, received time.Time
	// earliest and latest bound the remote reading.
	earliest, latest time.Time
}

// at bounds the remote clock at local time now from this sample alone.
func (s sample) at(now time.Time) store.Reading {
	return store.Reading{
		Earliest: s.earliest.Add(scale(max(now.Sub(s.received), 0), 1-DriftRate)),
		Latest:   s.latest.Add(scale(max(now.Sub(s.sent), 0), 1+DriftRate)),
	}
}

func scale(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// Clock follows a remote clock. Its methods may be called concurrently.
type Clock struct {
	read ReadFunc
	opts Options

	mu       sync.Mutex
	samples  []sample // oldest first, consistent with each other
	lastErr  error
	inFlight chan struct{} // closed when the sample under way ends
	resets   int
}

var _ store.Clock = (*Clock)(nil)

// New returns a Clock that reads the remote clock with read. It samples only
// when asked (Now) until Run is started.
func New(read ReadFunc, opts Options) *Clock {
	opts.defaults()
	return &Clock{read: read, opts: opts}
}

// Now implements store.Clock: the remote clock's reading now, from recent
// samples, sampling first when none is recent enough.
func (c *Clock) Now(ctx context.Context) (store.Reading, error) {
	if r, err := c.current(); err == nil {
		return r, nil
	}
	if err := c.Sample(ctx); err != nil {
		return store.Reading{}, err
	}
	return c.current()
}

// Estimate is the reading Now would give, without sampling: for metrics.
// local is the local wall clock at the same moment; ok is false when Now
// would fail.
func (c *Clock) Estimate() (r store.Reading, local time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	local = c.opts.Clock.Now()
	r, ok = c.boundsLocked(local)
	return r, local, ok
}

// Resets counts the samples that contradicted every earlier one, so that
// those were dropped: the remote clock was stepped, or a different server
// with a different clock answered.
func (c *Clock) Resets() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resets
}

// current returns the reading now, or why there is none.
func (c *Clock) current() (store.Reading, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Clock.Now()
	r, ok := c.boundsLocked(now)
	switch {
	case !ok && c.lastErr != nil:
		return store.Reading{}, fmt.Errorf("no usable sample of the store's clock in the last %s: %w", c.opts.MaxAge, c.lastErr)
	case !ok:
		return store.Reading{}, fmt.Errorf("no usable sample of the store's clock in the last %s", c.opts.MaxAge)
	case r.Uncertainty() > c.opts.MaxUncertainty:
		return store.Reading{}, fmt.Errorf("the store's clock is known only to within %s, more than the limit of %s", r.Uncertainty(), c.opts.MaxUncertainty)
	}
	return r, nil
}

// boundsLocked intersects the bounds of the samples younger than MaxAge.
func (c *Clock) boundsLocked(now time.Time) (store.Reading, bool) {
	var (
		out store.Reading
		ok  bool
	)
	for _, s := range c.samples {
		if now.Sub(s.received) > c.opts.MaxAge {
			continue
		}
		r := s.at(now)
		if !ok || r.Earliest.After(out.Earliest) {
			out.Earliest = r.Earliest
		}
		if !ok || r.Latest.Before(out.Latest) {
			out.Latest = r.Latest
		}
		ok = true
	}
	// Crossed bounds: the clocks' rates differed by more than DriftRate.
	// None of the samples can be trusted until a new one is taken.
	return out, ok && !out.Earliest.After(out.Latest)
}

// Sample reads the remote clock once and keeps the sample. Concurrent
// callers share one read; each waits at most until its ctx ends.
func (c *Clock) Sample(ctx context.Context) error {
	c.mu.Lock()
	wait := c.inFlight
	if wait == nil {
		c.inFlight = make(chan struct{})
		c.mu.Unlock()
		c.sampleOnce(ctx)
		c.mu.Lock()
		close(c.inFlight)
		c.inFlight = nil
		err := c.lastErr
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// sampleOnce reads the remote clock, detached from the caller's
// cancellation so that callers sharing the read are not failed by one of
// them going away.
func (c *Clock) sampleOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SampleTimeout)
	defer cancel()
	sent := c.opts.Clock.Now()
	earliest, latest, err := c.read(ctx)
	received := c.opts.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && latest.Before(earliest) {
		err = errors.New("the store's clock answered a reading that ends before it begins")
	}
	if err != nil {
		c.lastErr = fmt.Errorf("read the store's clock: %w", err)
		return
	}
	c.lastErr = nil
	c.addLocked(sample{sent: sent, received: received, earliest: earliest, latest: latest})
}

// addLocked keeps s and the earlier samples that agree with it; those that
// do not bound the remote clock as s does are dropped.
func (c *Clock) addLocked(s sample) {
	kept := c.samples[:0]
	for _, old := range c.samples {
		if s.received.Sub(old.received) <= c.opts.MaxAge {
			kept = append(kept, old)
		}
	}
	c.samples = kept
	if prev, ok := c.boundsLocked(s.received); ok {
		// s bounds the remote clock at s.received too, as widely as it can.
		now := s.at(s.received)
		if prev.Earliest.After(now.Latest) || now.Earliest.After(prev.Latest) {
			c.samples = c.samples[:0]
			c.resets++
		}
	}
	if len(c.samples) == maxSamples {
		c.samples = append(c.samples[:0], c.samples[1:]...)
	}
	c.samples = append(c.samples, s)
}

// Start returns a Clock that samples read in the background until stop is
// called (stop waits until sampling has ended).
func Start(read ReadFunc, opts Options) (c *Clock, stop func()) {
	c = New(read, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	return c, func() {
		cancel()
		<-done
	}
}

// Run samples the remote clock in the background until ctx ends.
func (c *Clock) Run(ctx context.Context) {
	for {
		_ = c.Sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-c.opts.Clock.After(c.nextSampleIn()):
		}
	}
}

// nextSampleIn is the wait before the next background sample. A remote clock
// of coarse resolution (an HTTP Date: whole seconds) is sampled when, by the
// middle of the current bounds, it is about to tick: then the tick falls
// inside the bounds and the answer halves them, down to about one round
// trip. A fine clock is sampled every Interval.
func (c *Clock) nextSampleIn() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.samples) == 0 {
		return c.opts.Interval
	}
	last := c.samples[len(c.samples)-1]
	res := last.latest.Sub(last.earliest)
	now := c.opts.Clock.Now()
	r, ok := c.boundsLocked(now)
	if !ok || res < time.Millisecond {
		return c.opts.Interval
	}
	mid := r.Earliest.Add(r.Uncertainty() / 2)
	tick := mid.Add(c.opts.Interval / 2).Truncate(res).Add(res)
	return max(tick.Sub(mid)-last.received.Sub(last.sent)/2, c.opts.Interval/4)
}
