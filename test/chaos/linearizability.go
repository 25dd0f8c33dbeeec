package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"

	leaseclient "github.com/berthfleet/berth/leaseapi/client"
)

// OpKind is a lease API call the test clients make.
type OpKind string

// The calls.
const (
	OpAcquire OpKind = "acquire"
	OpRenew   OpKind = "renew"
	OpRelease OpKind = "release"
)

// LeaseInput is one call as it was sent. Call is repeated here because the
// model judges expiry from it.
type LeaseInput struct {
	Key    string
	Kind   OpKind
	Holder string
	Token  int32 // renew and release
	TTL    time.Duration
	Call   int64 // nanoseconds since the recording began
}

// Outcome classes of a call.
const (
	// Answered: a 200 or 204 whose body is in LeaseOutput.
	Answered = iota
	// Refused: a release answered 409 (not the holder).
	Refused
	// NotSent: the call never reached the server (connection refused
	// on a direct connection): it did nothing.
	NotSent
	// Unknown: a timeout, a dropped connection or a 5xx; it may or may not
	// have taken effect, at any time after it was sent.
	Unknown
)

// LeaseOutput is what a call returned.
type LeaseOutput struct {
	Outcome  int
	Acquired bool
	Holder   string
	Token    int32
	Return   int64 // math.MaxInt64 when Unknown
}

// leaseState is the model's view of one key: who holds it, with which
// token, and the earliest instant its term may have ended (the call time of
// the request that granted or extended it, plus its TTL).
type leaseState struct {
	Holder         string
	Token          int32
	EarliestExpiry int64
}

// expirySlack absorbs the rounding of the server's clock against the test's.
const expirySlack = int64(50 * time.Millisecond)

// LeaseModel is the sequential specification of one lease key, with expiry
// nondeterministic: before a call that may have arrived after the term's
// earliest end, the term may or may not have ended (a restart's grace may
// also have extended it). Everything else follows the wire contract: tokens
// grow by one per new term and are kept by release and expiry, a holder's
// acquire of its own term renews it, release of a free lease succeeds and of
// another's is refused.
var LeaseModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(LeaseInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{leaseState{}} },
	Step: func(state, input, output any) []any {
		return stepLease(state.(leaseState), input.(LeaseInput), output.(LeaseOutput))
	},
	Equal: func(a, b any) bool { return a.(leaseState) == b.(leaseState) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(LeaseInput), output.(LeaseOutput)
		call := fmt.Sprintf("%s(%s", in.Kind, in.Holder)
		if in.Kind != OpAcquire {
			call += fmt.Sprintf(", %d", in.Token)
		}
		call += ")"
		switch out.Outcome {
		case Refused:
			return call + " → 409"
		case NotSent:
			return call + " → not sent"
		case Unknown:
			return call + " → ?"
		case Answered:
			if in.Kind == OpRelease {
				return call + " → 204"
			}
			return fmt.Sprintf("%s → acquired=%t %s/%d", call, out.Acquired, out.Holder, out.Token)
		}
		return call
	},
	DescribeState: func(state any) string {
		s := state.(leaseState)
		if s.Holder == "" {
			return fmt.Sprintf("free (token %d)", s.Token)
		}
		return fmt.Sprintf("%s/%d", s.Holder, s.Token)
	},
}

// stepLease returns the states the lease may be in after the call, given
// that it was in s before and answered out; none when the answer is
// impossible.
func stepLease(s leaseState, in LeaseInput, out LeaseOutput) []any {
	before := []leaseState{s}
	if s.Holder != "" && out.Return >= s.EarliestExpiry-expirySlack {
		expired := s
		expired.Holder = ""
		before = append(before, expired)
	}
	var next []any
	for _, b := range before {
		after, answer := applyLease(b, in)
		switch out.Outcome {
		case NotSent:
			next = append(next, s)
		case Unknown:
			next = append(next, b, after)
		default:
			answer.Return = out.Return
			if answer == out {
				next = append(next, after)
			}
		}
	}
	return next
}

// applyLease is one call on a lease, sequentially: the state after it and
// its answer (Return left zero).
func applyLease(s leaseState, in LeaseInput) (leaseState, LeaseOutput) {
	extend := func(s leaseState) leaseState {
		s.EarliestExpiry = in.Call + int64(in.TTL)
		return s
	}
	switch in.Kind {
	case OpAcquire:
		switch s.Holder {
		case in.Holder:
			return extend(s), LeaseOutput{Acquired: true, Holder: s.Holder, Token: s.Token}
		case "":
			n := extend(leaseState{Holder: in.Holder, Token: s.Token + 1})
			return n, LeaseOutput{Acquired: true, Holder: n.Holder, Token: n.Token}
		}
		return s, LeaseOutput{Holder: s.Holder, Token: s.Token}
	case OpRenew:
		if s.Holder == in.Holder && s.Token == in.Token {
			return extend(s), LeaseOutput{Acquired: true, Holder: s.Holder, Token: s.Token}
		}
		return s, LeaseOutput{Holder: s.Holder, Token: s.Token}
	case OpRelease:
		switch {
		case s.Holder == "":
			return s, LeaseOutput{}
		case s.Holder == in.Holder && s.Token == in.Token:
			s.Holder = ""
			return s, LeaseOutput{}
		}
		return s, LeaseOutput{Outcome: Refused}
	}
	panic("unknown call " + in.Kind)
}

// OpLog records the calls of the test clients with their times.
type OpLog struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

// NewOpLog starts a recording.
func NewOpLog() *OpLog { return &OpLog{start: time.Now()} }

func (l *OpLog) now() int64 { return int64(time.Since(l.start)) }

func (l *OpLog) add(clientID int, in LeaseInput, out LeaseOutput) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, porcupine.Operation{ClientId: clientID, Input: in, Call: in.Call, Output: out, Return: out.Return})
}

// Operations returns the calls recorded so far.
func (l *OpLog) Operations() []porcupine.Operation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]porcupine.Operation(nil), l.ops...)
}

// LinResult is the verdict on a recording.
type LinResult struct {
	Result  porcupine.CheckResult
	Ops     int
	Unknown int
	// Detail describes the longest linearizable prefix when Illegal.
	Detail string
}

// CheckLinearizable checks the recording against LeaseModel.
func (l *OpLog) CheckLinearizable(timeout time.Duration) LinResult {
	ops := l.Operations()
	r := LinResult{Ops: len(ops)}
	for _, op := range ops {
		if op.Output.(LeaseOutput).Outcome == Unknown {
			r.Unknown++
		}
	}
	r.Result = porcupine.CheckOperationsTimeout(LeaseModel.ToModel(), ops, timeout)
	if r.Result == porcupine.Illegal {
		r.Detail = describeIllegal(ops)
	}
	return r
}

// describeIllegal lists, in call order, the calls on every key whose
// history cannot be linearized.
func describeIllegal(ops []porcupine.Operation) string {
	var b strings.Builder
	m := LeaseModel.ToModel()
	for _, part := range m.Partition(ops) {
		if porcupine.CheckOperations(m, part) {
			continue
		}
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		fmt.Fprintf(&b, "key %s:\n", part[0].Input.(LeaseInput).Key)
		for _, op := range part {
			ret := "∞"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprintf("%.3fs", time.Duration(op.Return).Seconds())
			}
			fmt.Fprintf(&b, "  client %d [%.3fs, %s] %s\n", op.ClientId, time.Duration(op.Call).Seconds(), ret, m.DescribeOperation(op.Input, op.Output))
		}
	}
	return b.String()
}

// Hammer is a few clients calling the lease API on keys of their own, with
// random acquires, renewals (of their current token or a stale one) and
// releases, recording every call in Log.
type Hammer struct {
	Log *OpLog
	// Clients call through these lease API clients, one each.
	Clients []*leaseclient.Client
	// Keys are "namespace/name" keys no one else uses.
	Keys []string
	// Subject is the clients' subject: they act as Subject/c<i>.
	Subject string
	TTL     time.Duration
}

// Run calls until ctx ends; seed makes each client's choices reproducible.
func (h *Hammer) Run(ctx context.Context, seed uint64) {
	var wg sync.WaitGroup
	for i, c := range h.Clients {
		wg.Go(func() { h.client(ctx, i, c, rand.New(rand.NewPCG(seed, uint64(i)))) })
	}
	wg.Wait()
}

func (h *Hammer) client(ctx context.Context, id int, c *leaseclient.Client, rng *rand.Rand) {
	holder := fmt.Sprintf("%s/c%d", h.Subject, id)
	tokens := map[string]int32{} // the last token this client was granted, per key
	for ctx.Err() == nil {
		key := h.Keys[rng.IntN(len(h.Keys))]
		ns, name, _ := strings.Cut(key, "/")
		in := LeaseInput{Key: key, Holder: holder, TTL: h.TTL}
		switch n := rng.IntN(10); {
		case n < 4:
			in.Kind = OpAcquire
		case n < 7:
			in.Kind = OpRenew
			in.Token = tokens[key] - int32(rng.IntN(2)) // now and then a stale token
		default:
			in.Kind = OpRelease
			in.Token = tokens[key]
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		in.Call = h.Log.now()
		var res leaseclient.AcquireResult
		var err error
		switch in.Kind {
		case OpAcquire:
			res, err = c.Acquire(cctx, ns, name, holder, h.TTL)
		case OpRenew:
			res, err = c.Renew(cctx, ns, name, holder, in.Token, h.TTL)
		case OpRelease:
			err = c.Release(cctx, ns, name, holder, in.Token)
		}
		ret := h.Log.now()
		cancel()
		out := LeaseOutput{Outcome: Answered, Return: ret}
		switch {
		case err == nil && in.Kind != OpRelease:
			out.Acquired, out.Holder, out.Token = res.Acquired, res.Holder, res.FencingToken
			if res.Acquired {
				tokens[key] = res.FencingToken
			}
		case err == nil:
		case in.Kind == OpRelease && errors.Is(err, leaseclient.ErrConflict):
			out.Outcome = Refused
		case errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, context.DeadlineExceeded):
			out.Outcome = NotSent
		default:
			out = LeaseOutput{Outcome: Unknown, Return: math.MaxInt64}
		}
		h.Log.add(id, in, out)
		pause := 20 + rng.IntN(150)
		if out.Outcome == Unknown || out.Outcome == NotSent {
			pause += 300
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(pause) * time.Millisecond):
		}
	}
}
