package history

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func sweep(at int, ungated map[string]int, tokens map[string][]int32) Sweep {
	return Sweep{At: time.Unix(int64(at), 0), Ungated: ungated, Running: ungated, Tokens: tokens}
}

func TestCheck(t *testing.T) {
	cases := map[string]struct {
		h         History
		wantTerms int
		wantErr   string
	}{
		"clean handover": {
			h: History{
				sweep(1, map[string]int{"a": 2}, map[string][]int32{"a": {1, 1}}),
				sweep(2, map[string]int{}, nil),
				sweep(3, map[string]int{"b": 2}, map[string][]int32{"b": {2, 2}}),
			},
			wantTerms: 2,
		},
		"overlap": {
			h: History{
				sweep(1, map[string]int{"a": 1, "b": 1}, map[string][]int32{"a": {1}, "b": {2}}),
			},
			wantTerms: 2,
			wantErr:   "two clusters ran at once",
		},
		"token reused by another cluster": {
			h: History{
				sweep(1, map[string]int{"a": 1}, map[string][]int32{"a": {2}}),
				sweep(2, map[string]int{"b": 1}, map[string][]int32{"b": {2}}),
			},
			wantTerms: 2,
			wantErr:   "b ran with token 2 after a with token 2",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.h.Check()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Check() = %v, want error containing %q", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantTerms, len(tc.h.Terms())); diff != "" {
				t.Errorf("terms (-want +got):\n%s", diff)
			}
		})
	}
}
