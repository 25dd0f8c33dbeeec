package chaos

import (
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op builds one recorded call on key "k" by client c during [call, ret] (in
// milliseconds; ret < 0 for an unknown outcome).
func op(c int, kind OpKind, holder string, token int32, call, ret int64, out LeaseOutput) porcupine.Operation {
	in := LeaseInput{Key: "k", Kind: kind, Holder: holder, Token: token, TTL: 2 * time.Second, Call: call * int64(time.Millisecond)}
	out.Return = ret * int64(time.Millisecond)
	if ret < 0 {
		out = LeaseOutput{Outcome: Unknown, Return: math.MaxInt64}
	}
	return porcupine.Operation{ClientId: c, Input: in, Call: in.Call, Output: out, Return: out.Return}
}

func granted(holder string, token int32) LeaseOutput {
	return LeaseOutput{Acquired: true, Holder: holder, Token: token}
}

func heldBy(holder string, token int32) LeaseOutput {
	return LeaseOutput{Holder: holder, Token: token}
}

func TestLeaseModel(t *testing.T) {
	cases := map[string]struct {
		ops  []porcupine.Operation
		want bool
	}{
		"acquire, renew, release, acquire: next token": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, granted("a", 1)),
				op(0, OpRenew, "a", 1, 20, 30, granted("a", 1)),
				op(0, OpRelease, "a", 1, 40, 50, LeaseOutput{}),
				op(1, OpAcquire, "b", 0, 60, 70, granted("b", 2)),
			},
			want: true,
		},
		"two holders at once": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, granted("a", 1)),
				op(1, OpAcquire, "b", 0, 20, 30, granted("b", 2)),
			},
			want: false,
		},
		"another takes over after the TTL": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, granted("a", 1)),
				op(1, OpAcquire, "b", 0, 2100, 2110, granted("b", 2)),
				op(0, OpRenew, "a", 1, 2200, 2210, heldBy("b", 2)),
			},
			want: true,
		},
		"the holder may still renew after the TTL (expiry is loose)": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, granted("a", 1)),
				op(0, OpRenew, "a", 1, 2500, 2510, granted("a", 1)),
			},
			want: true,
		},
		"a token reused after a release": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, granted("a", 1)),
				op(0, OpRelease, "a", 1, 20, 30, LeaseOutput{}),
				op(1, OpAcquire, "b", 0, 40, 50, granted("b", 1)),
			},
			want: false,
		},
		"release by another is refused while held": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, granted("a", 1)),
				op(1, OpRelease, "b", 1, 20, 30, LeaseOutput{}),
			},
			want: false,
		},
		"concurrent acquires: either may win": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 100, heldBy("b", 1)),
				op(1, OpAcquire, "b", 0, 10, 50, granted("b", 1)),
			},
			want: true,
		},
		"an unknown acquire may have taken effect": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, -1, LeaseOutput{}),
				op(1, OpAcquire, "b", 0, 500, 510, heldBy("a", 1)),
			},
			want: true,
		},
		"an unknown acquire may not have taken effect": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, -1, LeaseOutput{}),
				op(1, OpAcquire, "b", 0, 500, 510, granted("b", 1)),
			},
			want: true,
		},
		"a call not sent did nothing": {
			ops: []porcupine.Operation{
				op(0, OpAcquire, "a", 0, 0, 10, LeaseOutput{Outcome: NotSent}),
				op(1, OpAcquire, "b", 0, 500, 510, heldBy("a", 1)),
			},
			want: false,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := porcupine.CheckOperations(LeaseModel.ToModel(), tc.ops); got != tc.want {
				t.Errorf("linearizable = %t, want %t\n%s", got, tc.want, describeIllegal(tc.ops))
			}
		})
	}
}
