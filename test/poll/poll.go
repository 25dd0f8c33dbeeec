// Package poll waits for a condition in tests and in the environments tests
// run (clusters, fleets, servers): one helper on apimachinery's wait package,
// one interval, one failure message, and the time it took for callers that log
// how long something took. It does not judge timing; callers that bound a
// duration log the measured value and keep the bound generous.
package poll

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval is how often a condition is checked; the first check is at once.
const Interval = 100 * time.Millisecond

// Until checks cond every Interval until it holds, returns an error, ctx ends
// or timeout passes, and returns how long it waited.
func Until(ctx context.Context, timeout time.Duration, what string, cond wait.ConditionWithContextFunc) (time.Duration, error) {
	start := time.Now()
	if err := wait.PollUntilContextTimeout(ctx, Interval, timeout, true, cond); err != nil {
		return time.Since(start), fmt.Errorf("%s: not within %s: %w", what, timeout, err)
	}
	return time.Since(start), nil
}

// Condition adapts a check without a context or an error to Until.
func Condition(cond func() bool) wait.ConditionWithContextFunc {
	return func(context.Context) (bool, error) { return cond(), nil }
}

// For waits until cond holds, failing the test after timeout, and returns how
// long it took.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return ForCondition(t, timeout, what, Condition(cond))
}

// ForCondition is For with a condition that takes a context and may end the
// wait early with an error.
func ForCondition(t testing.TB, timeout time.Duration, what string, cond wait.ConditionWithContextFunc) time.Duration {
	t.Helper()
	took, err := Until(t.Context(), timeout, what, cond)
	if err != nil {
		t.Fatal(err)
	}
	return took
}

// ForNoError calls f until it returns nil, failing the test with f's last
// error after timeout, and returns how long it took.
func ForNoError(t testing.TB, timeout time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	var last error
	took, err := Until(t.Context(), timeout, what, func(context.Context) (bool, error) {
		last = f()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%v; last error: %v", err, last)
	}
	return took
}
