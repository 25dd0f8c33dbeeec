package server

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/berthfleet/berth/leaseapi/store/refclock"
)

func TestObserveClock(t *testing.T) {
	local := testingclock.NewFakeClock(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	offset, fail := 3*time.Second, error(nil)
	read := func(context.Context) (time.Time, time.Time, error) {
		r := local.Now().Add(offset)
		return r, r.Add(time.Millisecond), fail
	}
	c := refclock.New(read, refclock.Options{Clock: local})
	m := NewMetrics()
	m.ObserveClock(c)
	gather := func() map[string]float64 {
		t.Helper()
		families, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range families {
			switch name := f.GetName(); name {
			case "berth_leaseapi_clock_uncertainty_seconds", "berth_leaseapi_clock_offset_seconds":
				got[name] = f.GetMetric()[0].GetGauge().GetValue()
			case "berth_leaseapi_clock_resets_total":
				got[name] = f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return got
	}

	if err := c.Sample(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"berth_leaseapi_clock_uncertainty_seconds": 0.001,
		"berth_leaseapi_clock_offset_seconds":      0.0005 + offset.Seconds(),
		"berth_leaseapi_clock_resets_total":        0,
	}
	if diff := cmp.Diff(want, gather(), cmpopts.EquateApprox(0, 1e-6)); diff != "" {
		t.Errorf("clock metrics with a fresh sample (-want +got):\n%s", diff)
	}

	fail = errors.New("unreachable")
	local.Step(time.Minute)
	got := gather()
	if u := got["berth_leaseapi_clock_uncertainty_seconds"]; !math.IsInf(u, 1) {
		t.Errorf("uncertainty with no fresh sample: %v, want +Inf", u)
	}
	if o := got["berth_leaseapi_clock_offset_seconds"]; !math.IsNaN(o) {
		t.Errorf("offset with no fresh sample: %v, want NaN", o)
	}
}
