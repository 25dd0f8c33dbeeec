package chaos

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthfleet/berth/reconciler"
	"github.com/berthfleet/berth/test/history"
)

var timing = Timing{TTL: 6 * time.Second, MinSteps: 2, MaxSteps: 5, MaxWait: 2500 * time.Millisecond}

func TestPlanIsReproducible(t *testing.T) {
	for seed := range uint64(50) {
		if diff := cmp.Diff(Plan(seed, timing), Plan(seed, timing)); diff != "" {
			t.Fatalf("seed %d gives two schedules (-first +second):\n%s", seed, diff)
		}
	}
	if cmp.Equal(Plan(1, timing), Plan(2, timing)) {
		t.Error("seeds 1 and 2 give the same schedule")
	}
}

func TestPlanMixesEveryFault(t *testing.T) {
	seen := map[Kind]int{}
	short, past, long := 0, 0, 0
	for seed := range uint64(200) {
		s := Plan(seed, timing)
		if n := len(s.Steps); n < timing.MinSteps || n > timing.MaxSteps {
			t.Fatalf("seed %d: %d steps, want %d to %d", seed, n, timing.MinSteps, timing.MaxSteps)
		}
		for _, st := range s.Steps {
			seen[st.Kind]++
			if st.Wait < 200*time.Millisecond || st.Wait > timing.MaxWait {
				t.Errorf("seed %d: wait %s out of bounds", seed, st.Wait)
			}
			if st.Kind == Freeze {
				switch {
				case st.Hold <= 1500*time.Millisecond:
					short++
				case st.Hold >= timing.TTL:
					long++
				case st.Hold >= reconciler.LocalValidity(timing.TTL):
					past++
				default:
					t.Errorf("seed %d: freeze of %s, neither short nor past the local validity", seed, st.Hold)
				}
			}
		}
	}
	for _, k := range Kinds() {
		if seen[k] == 0 {
			t.Errorf("no schedule of 200 has %s", k)
		}
	}
	if short == 0 || past == 0 || long == 0 {
		t.Errorf("freezes: %d short, %d past the local validity within the TTL, %d past the TTL; want each", short, past, long)
	}
}

// sweeps builds a history, one sweep per 100 ms from t0, each naming the
// clusters with ungated Pods (token 1 for a, 2 for b).
func sweeps(t0 time.Time, holders ...[]string) history.History {
	var h history.History
	for i, hs := range holders {
		s := history.Sweep{At: t0.Add(time.Duration(i) * 100 * time.Millisecond), Ungated: map[string]int{"a": 0, "b": 0}, Tokens: map[string][]int32{}}
		for _, c := range hs {
			s.Ungated[c] = 1
			s.Tokens[c] = []int32{map[string]int32{"a": 1, "b": 2}[c]}
		}
		h = append(h, s)
	}
	return h
}

func TestJudge(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	overlap := sweeps(t0, []string{"a"}, []string{"a"}, []string{"a", "b"}, []string{"a", "b"}, []string{"b"})
	cases := map[string]struct {
		h            history.History
		faults       []Fault
		outages      []Outage
		wantEpisodes int
		wantFailures int
	}{
		"a clean handover": {
			h:            sweeps(t0, []string{"a"}, nil, []string{"b"}),
			wantEpisodes: 0,
		},
		"an overlap with no fault": {
			h: overlap, wantEpisodes: 1, wantFailures: 1,
		},
		"an overlap while a's agent was frozen past its deadline": {
			h:            overlap,
			faults:       []Fault{{Kind: Freeze, Cluster: "a", Start: at(-7000), End: at(1000)}},
			outages:      []Outage{{Cluster: "a", Start: at(-7000), End: at(1000)}},
			wantEpisodes: 1,
		},
		"an overlap while a's agent was frozen briefly": {
			h:            overlap,
			faults:       []Fault{{Kind: Freeze, Cluster: "a", Start: at(0), End: at(1000)}},
			outages:      []Outage{{Cluster: "a", Start: at(0), End: at(1000)}},
			wantEpisodes: 1, wantFailures: 1,
		},
		"an overlap while a's agent was frozen briefly, cut off before": {
			h: overlap,
			faults: []Fault{{Kind: Cut, Cluster: "a", Start: at(-3000), End: at(-100)},
				{Kind: Freeze, Cluster: "a", Start: at(0), End: at(1000)}},
			outages:      []Outage{{Cluster: "a", Start: at(0), End: at(1000)}},
			wantEpisodes: 1,
		},
		"an overlap while another cluster's agent was frozen": {
			h:            overlap,
			faults:       []Fault{{Kind: Freeze, Cluster: "c", Start: at(-7000), End: at(1000)}},
			outages:      []Outage{{Cluster: "c", Start: at(-7000), End: at(1000)}},
			wantEpisodes: 1, wantFailures: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := Judge(tc.h, tc.faults, tc.outages, 6*time.Second, 2*time.Second)
			if len(v.Episodes) != tc.wantEpisodes || v.Failures() != tc.wantFailures {
				t.Errorf("%d episodes, %d failures; want %d, %d: %+v", len(v.Episodes), v.Failures(), tc.wantEpisodes, tc.wantFailures, v.Episodes)
			}
			if v.TokenProblems != "" {
				t.Errorf("token problems: %s", v.TokenProblems)
			}
		})
	}
}
