package refclock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi/store"
)

var epoch = time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)

// remote is a simulated remote clock: offset from the local fake clock and
// running at its own rate, read with a round trip of rtt, answering with a
// resolution of res (floored, as an HTTP Date is).
type remote struct {
	local  *testingclock.FakeClock
	offset time.Duration
	rate   float64 // remote seconds per local second, minus one
	rtt    time.Duration
	res    time.Duration
	fail   error
}

func newRemote(offset, rtt, res time.Duration) *remote {
	return &remote{local: testingclock.NewFakeClock(epoch), offset: offset, rtt: rtt, res: res}
}

// truth is what the remote clock shows now.
func (r *remote) truth() time.Time {
	elapsed := r.local.Now().Sub(epoch)
	return epoch.Add(r.offset + elapsed + time.Duration(float64(elapsed)*r.rate))
}

func (r *remote) read(context.Context) (time.Time, time.Time, error) {
	r.local.Step(r.rtt / 2)
	defer r.local.Step(r.rtt - r.rtt/2)
	if r.fail != nil {
		return time.Time{}, time.Time{}, r.fail
	}
	t := r.truth().Truncate(r.res)
	return t, t.Add(r.res), nil
}

func (r *remote) clock(maxUncertainty time.Duration) *Clock {
	return New(r.read, Options{Clock: r.local, MaxUncertainty: maxUncertainty})
}

// checkBounds fails unless the reading holds the remote clock's truth.
func checkBounds(t *testing.T, r *remote, got store.Reading) {
	t.Helper()
	if truth := r.truth(); truth.Before(got.Earliest) || truth.After(got.Latest) {
		t.Fatalf("reading [%s, %s] does not hold the remote clock's %s", got.Earliest, got.Latest, truth)
	}
}

func TestFineClock(t *testing.T) {
	r := newRemote(20*time.Second, 2*time.Millisecond, time.Microsecond)
	c := r.clock(time.Second)
	ctx := t.Context()
	got, err := c.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkBounds(t, r, got)
	if u := got.Uncertainty(); u > 2*time.Millisecond+10*time.Microsecond {
		t.Errorf("uncertainty %v after one sample, want about the round trip", u)
	}
	// Between samples, readings are carried forward and stay true.
	for range 10 {
		r.local.Step(time.Second)
		got, err := c.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkBounds(t, r, got)
	}
}

// TestCoarseClockNarrows: samples timed by nextSampleIn bring a clock read
// to whole seconds down to bounds of about a round trip.
func TestCoarseClockNarrows(t *testing.T) {
	for _, offset := range []time.Duration{0, 333 * time.Millisecond, -20*time.Second + 777*time.Millisecond, 5*time.Second + 999*time.Millisecond} {
		r := newRemote(offset, 4*time.Millisecond, time.Second)
		c := r.clock(2 * time.Second)
		ctx := t.Context()
		first, err := c.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkBounds(t, r, first)
		var widths []time.Duration
		for range 12 {
			wait := c.nextSampleIn()
			if wait < DefaultInterval/4 || wait > 2*DefaultInterval {
				t.Fatalf("next sample in %v, want between a quarter and twice the interval %v", wait, DefaultInterval)
			}
			r.local.Step(wait)
			if err := c.Sample(ctx); err != nil {
				t.Fatal(err)
			}
			got, err := c.Now(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkBounds(t, r, got)
			widths = append(widths, got.Uncertainty())
		}
		t.Logf("offset %v: uncertainty %v, then %v", offset, first.Uncertainty(), widths)
		if last := widths[len(widths)-1]; last > 25*time.Millisecond {
			t.Errorf("offset %v: uncertainty after 12 samples %v (from %v: %v), want about the round trip", offset, last, first.Uncertainty(), widths)
		}
	}
}

func TestDriftStaysBounded(t *testing.T) {
	for _, rate := range []float64{DriftRate / 2, -DriftRate / 2} {
		r := newRemote(-3*time.Second, time.Millisecond, time.Microsecond)
		r.rate = rate
		c := r.clock(time.Second)
		if err := c.Sample(t.Context()); err != nil {
			t.Fatal(err)
		}
		// Carried forward a whole MaxAge with no new sample.
		for range 29 {
			r.local.Step(time.Second)
			got, err := c.Now(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			checkBounds(t, r, got)
		}
	}
}

func TestRefusesWithoutFreshSample(t *testing.T) {
	r := newRemote(time.Second, time.Millisecond, time.Microsecond)
	c := r.clock(time.Second)
	ctx := t.Context()
	if _, err := c.Now(ctx); err != nil {
		t.Fatal(err)
	}
	r.fail = errors.New("connection refused")
	r.local.Step(DefaultMaxAge / 2)
	if _, err := c.Now(ctx); err != nil {
		t.Errorf("a sample younger than MaxAge still serves: %v", err)
	}
	r.local.Step(DefaultMaxAge)
	_, err := c.Now(ctx)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Now with no sample younger than MaxAge: %v, want a refusal naming the failure", err)
	}
	if _, _, ok := c.Estimate(); ok {
		t.Error("Estimate is ok with no fresh sample")
	}
	r.fail = nil
	got, err := c.Now(ctx)
	if err != nil {
		t.Fatalf("Now once the store answers again: %v", err)
	}
	checkBounds(t, r, got)
}

func TestRefusesTooUncertain(t *testing.T) {
	r := newRemote(0, time.Millisecond, time.Second)
	c := r.clock(500 * time.Millisecond)
	_, err := c.Now(t.Context())
	if err == nil || !strings.Contains(err.Error(), "known only to within") {
		t.Fatalf("Now on one whole-second sample with a limit of 500ms: %v, want a refusal", err)
	}
}

// TestRemoteStep: a sample that contradicts the earlier ones (the remote
// clock was stepped) replaces them.
func TestRemoteStep(t *testing.T) {
	for _, step := range []time.Duration{10 * time.Second, -10 * time.Second} {
		r := newRemote(0, time.Millisecond, time.Microsecond)
		c := r.clock(time.Second)
		ctx := t.Context()
		for range 3 {
			if err := c.Sample(ctx); err != nil {
				t.Fatal(err)
			}
			r.local.Step(time.Second)
		}
		r.offset += step
		if err := c.Sample(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := c.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkBounds(t, r, got)
		if c.Resets() != 1 {
			t.Errorf("step %v: %d resets, want 1", step, c.Resets())
		}
	}
}

// TestRunSamples: the background loop keeps the clock fresh.
func TestRunSamples(t *testing.T) {
	r := newRemote(time.Hour, time.Millisecond, time.Microsecond)
	c := r.clock(time.Second)
	reads := make(chan struct{}, 100)
	read := c.read
	c.read = func(ctx context.Context) (time.Time, time.Time, error) {
		reads <- struct{}{}
		return read(ctx)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	<-reads
	for range 3 {
		for !r.local.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		r.local.Step(DefaultInterval)
		<-reads
	}
	cancel()
	<-done
	if _, _, ok := c.Estimate(); !ok {
		t.Error("no estimate after Run sampled")
	}
}

// BenchmarkNow is the cost a lease operation pays to read a shared store's
// clock: no round trip, a lock and the samples of the last MaxAge.
func BenchmarkNow(b *testing.B) {
	r := newRemote(time.Second, time.Millisecond, time.Microsecond)
	c := New(r.read, Options{Clock: r.local})
	for range DefaultMaxAge / DefaultInterval {
		if err := c.Sample(b.Context()); err != nil {
			b.Fatal(err)
		}
		r.local.Step(DefaultInterval)
	}
	for b.Loop() {
		if _, err := c.Now(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}
