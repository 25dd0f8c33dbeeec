package reconciler

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// TestNothingOutsideLeadership: a replica that is no longer certainly the
// leader (woken from a freeze after another replica took over) sends no
// renewal and reconciles nothing, however due its terms are; while it leads,
// every call it makes is cut off where its leadership ends.
func TestNothingOutsideLeadership(t *testing.T) {
	var until time.Time
	b := &batches{}
	b.answer = func(renewals []leaseclient.Renewal) ([]leaseclient.AcquireResult, error) {
		out := make([]leaseclient.AcquireResult, len(renewals))
		for i, rn := range renewals {
			out[i] = leaseclient.AcquireResult{Acquired: true, Holder: us, FencingToken: rn.FencingToken}
		}
		return out, nil
	}
	r, _, clk := renewing(b)
	r.LeadingUntil = func() time.Time { return until }
	handed(r, "due", -time.Second, 10*time.Second)

	// Lost (zero): nothing is sent, and the renewer looks again soon.
	next := r.renewDue(t.Context(), b, r.Log)
	if sent := b.take(); len(sent) != 0 {
		t.Fatalf("sent %v outside leadership", sent)
	}
	if want := clk.Now().Add(leadershipRetry); !next.Equal(want) {
		t.Errorf("looks again %v after t0, want %v", next.Sub(t0), want.Sub(t0))
	}
	res, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "payments", Name: "due"}})
	if err != nil || res.RequeueAfter != leadershipRetry {
		t.Errorf("Reconcile outside leadership: %+v, %v; want nothing done and a look %v later", res, err, leadershipRetry)
	}

	// Past its end: the same.
	until = clk.Now()
	r.renewDue(t.Context(), b, r.Log)
	if sent := b.take(); len(sent) != 0 {
		t.Fatalf("sent %v at the end of leadership", sent)
	}

	// Leading for 3 s more: the batch goes out, bounded by it.
	until = clk.Now().Add(3 * time.Second)
	ctx, cancel, ok := r.whileLeading(context.Background())
	defer cancel()
	if !ok {
		t.Fatal("whileLeading: not leading, want leading")
	}
	callDeadline, _ := ctx.Deadline()
	if d := time.Until(callDeadline); d > 3*time.Second || d < 2*time.Second {
		t.Errorf("a call within leadership is bounded %v from now, want its end, 3 s away", d)
	}
	r.renewDue(t.Context(), b, r.Log)
	if sent := b.take(); len(sent) != 1 {
		t.Errorf("sent %v while leading, want the due term's batch", sent)
	}
}
