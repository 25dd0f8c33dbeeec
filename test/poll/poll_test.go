package poll_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthfleet/berth/test/poll"
)

func TestUntil(t *testing.T) {
	stop := errors.New("stop")
	cases := map[string]struct {
		cond        func(calls int) (bool, error)
		wantErr     string // substring; "" for none
		wantCalls   int    // at least
		wantErrIsOf error
	}{
		"holds at once":          {cond: func(int) (bool, error) { return true, nil }, wantCalls: 1},
		"holds on the third":     {cond: func(n int) (bool, error) { return n >= 3, nil }, wantCalls: 3},
		"never holds":            {cond: func(int) (bool, error) { return false, nil }, wantErr: "the thing: not within 300ms", wantCalls: 2},
		"an error ends the wait": {cond: func(int) (bool, error) { return false, stop }, wantErr: "stop", wantCalls: 1, wantErrIsOf: stop},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			calls := 0
			took, err := poll.Until(t.Context(), 300*time.Millisecond, "the thing", func(context.Context) (bool, error) {
				calls++
				return tc.cond(calls)
			})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if tc.wantErrIsOf != nil && !errors.Is(err, tc.wantErrIsOf) {
				t.Errorf("error %v does not wrap %v", err, tc.wantErrIsOf)
			}
			if calls < tc.wantCalls {
				t.Errorf("%d calls, want at least %d", calls, tc.wantCalls)
			}
			if took < 0 || took > 5*time.Second {
				t.Errorf("took %s", took)
			}
		})
	}
}

func TestForReturnsTheTimeItTook(t *testing.T) {
	start := time.Now()
	took := poll.For(t, 10*time.Second, "a quarter second passes", func() bool { return time.Since(start) > 250*time.Millisecond })
	if took < 250*time.Millisecond {
		t.Errorf("took %s, want at least 250ms", took)
	}
}
