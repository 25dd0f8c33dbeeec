package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/berthfleet/berth/reconciler"
)

// Kind is one kind of fault the nemesis injects.
type Kind string

// The faults. Those with a Hold are undone after it (the agent restarted,
// SIGCONT, the partition healed, the BerthLease made again, ...); the others
// happen at once and are undone by Heal at the end of the schedule.
const (
	// Cordon cordons the target cluster at the lease API, uncordoning it
	// after Hold.
	Cordon Kind = "cordon"
	// Kill kills the target's agent with SIGKILL and starts it again after Hold.
	Kill Kind = "kill"
	// Freeze stops the target's agent with SIGSTOP and continues it after Hold.
	Freeze Kind = "freeze"
	// Cut partitions the target's agent (and the test clients) from the lease
	// API, healing after Hold.
	Cut Kind = "cut"
	// KillAPI kills the lease API with SIGKILL and starts it again on the
	// same store after Hold.
	KillAPI Kind = "kill-api"
	// Delete deletes the target's BerthLease, making it anew after Hold (a
	// GitOps prune and sync).
	Delete Kind = "delete"
	// Reuse creates, in the target cluster, a second BerthLease with the
	// first one's lease name and a Deployment it manages, deleting both after
	// Hold.
	Reuse Kind = "reuse"
	// Orphan removes the finalizer of the target's BerthLease and deletes
	// it, making it anew after Hold.
	Orphan Kind = "orphan"
	// Release releases the lease as an administrator (berthctl leases release).
	Release Kind = "release"
	// Scale sets the target's Deployment to Replicas.
	Scale Kind = "scale"
)

// kinds lists every Kind with its weight in a schedule.
var kinds = []struct {
	kind   Kind
	weight int
}{
	{Cordon, 3}, {Kill, 3}, {Freeze, 4}, {Cut, 3}, {KillAPI, 2},
	{Delete, 2}, {Reuse, 1}, {Orphan, 1}, {Release, 2}, {Scale, 2},
}

// Kinds lists every kind of fault, in a fixed order.
func Kinds() []Kind {
	out := make([]Kind, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, k.kind)
	}
	return out
}

// Holder as a Step's Target means the cluster running the workload when the
// step starts (or Index when none runs it).
const Holder = "holder"

// Step is one operation of a schedule.
type Step struct {
	// Wait is how long after the previous step this one starts.
	Wait time.Duration
	Kind Kind
	// Target is Holder or "index": which cluster the step acts on.
	Target string
	// Index picks the cluster (modulo their number) when Target is not
	// Holder, or when no cluster holds the lease.
	Index int
	// Hold is how long a fault lasts before it is undone (zero for faults
	// that happen at once).
	Hold time.Duration
	// Replicas is the Deployment's new size for Scale, or the second
	// Deployment's for Reuse.
	Replicas int32
}

func (s Step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%s %s", s.Wait.Round(time.Millisecond), s.Kind)
	if s.Kind != KillAPI && s.Kind != Release {
		if s.Target == Holder {
			b.WriteString(" holder")
		} else {
			fmt.Fprintf(&b, " #%d", s.Index)
		}
	}
	if s.Hold > 0 {
		fmt.Fprintf(&b, " for %s", s.Hold.Round(time.Millisecond))
	}
	if s.Kind == Scale || s.Kind == Reuse {
		fmt.Fprintf(&b, " replicas=%d", s.Replicas)
	}
	return b.String()
}

// Schedule is a seed's operations.
type Schedule struct {
	Seed  uint64
	Steps []Step
}

func (s Schedule) String() string {
	parts := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		parts[i] = st.String()
	}
	return fmt.Sprintf("seed %d: %s", s.Seed, strings.Join(parts, ", "))
}

// Timing is what a schedule's durations are drawn from.
type Timing struct {
	// TTL is the workload's lease TTL.
	TTL time.Duration
	// Steps bounds the number of steps (inclusive).
	MinSteps, MaxSteps int
	// MaxWait bounds the wait before a step.
	MaxWait time.Duration
}

// Plan draws the schedule of seed: the same seed and timing always give the
// same schedule.
func Plan(seed uint64, t Timing) Schedule {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := Schedule{Seed: seed}
	n := t.MinSteps + rng.IntN(t.MaxSteps-t.MinSteps+1)
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	for range n {
		pick := rng.IntN(total)
		var kind Kind
		for _, k := range kinds {
			if pick < k.weight {
				kind = k.kind
				break
			}
			pick -= k.weight
		}
		st := Step{Kind: kind, Wait: between(rng, 200*time.Millisecond, t.MaxWait), Index: rng.IntN(1 << 10), Target: "index"}
		if rng.IntN(3) < 2 {
			st.Target = Holder
		}
		short := rng.IntN(2) == 0
		switch kind {
		case Kill:
			// Shorter than the agent's remaining validity, or longer than
			// the TTL: the documented limit.
			if short {
				st.Hold = between(rng, 100*time.Millisecond, 1500*time.Millisecond)
			} else {
				st.Hold = between(rng, t.TTL, 2*t.TTL)
			}
		case Freeze:
			// Shorter than the agent's remaining validity, or longer than
			// its validity: it wakes past its local deadline with a term the
			// lease API may still hold for it (or, with two replicas, that
			// the other one took over), or past the TTL.
			if short {
				st.Hold = between(rng, 100*time.Millisecond, 1500*time.Millisecond)
			} else {
				st.Hold = between(rng, reconciler.LocalValidity(t.TTL), 2*t.TTL)
			}
		case Cut, KillAPI:
			if short {
				st.Hold = between(rng, 200*time.Millisecond, t.TTL/2)
			} else {
				st.Hold = between(rng, t.TTL/2, 2*t.TTL)
			}
		case Cordon, Delete, Orphan, Reuse:
			st.Hold = between(rng, 500*time.Millisecond, 2*t.TTL)
		}
		switch kind {
		case Scale:
			st.Replicas = int32(1 + rng.IntN(3))
		case Reuse:
			st.Replicas = int32(1 + rng.IntN(2))
		}
		s.Steps = append(s.Steps, st)
	}
	return s
}

// between draws a duration in [lo, hi], to the millisecond.
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64((hi-lo)/time.Millisecond)+1))*time.Millisecond
}
