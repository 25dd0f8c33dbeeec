package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAgree(t *testing.T) {
	keys := []string{"ns/a", "ns/b", "ns/c"}
	cases := map[string]struct {
		leases holders
		states map[string]map[string]string
		want   agreement
	}{
		"settled": {
			leases: holders{"ns/a": "c1", "ns/b": "c2", "ns/c": "c1"},
			states: map[string]map[string]string{
				"c1": {"ns/a": "held", "ns/b": "waiting", "ns/c": "held"},
				"c2": {"ns/a": "waiting", "ns/b": "held", "ns/c": "waiting"},
			},
			want: agreement{Held: 3, Waiting: 3, WantWaiting: 3, Right: 3},
		},
		"a free lease and a status not yet written": {
			leases: holders{"ns/a": "c1", "ns/b": ""},
			states: map[string]map[string]string{
				"c1": {"ns/a": "held", "ns/b": "waiting"},
				"c2": {"ns/a": "", "ns/b": "waiting"},
			},
			want: agreement{Held: 1, WantWaiting: 3},
		},
		"the holder's status still waiting": {
			leases: holders{"ns/a": "c1", "ns/b": "c1", "ns/c": "c1"},
			states: map[string]map[string]string{
				"c1": {"ns/a": "waiting", "ns/b": "held", "ns/c": "held"},
				"c2": {"ns/a": "waiting", "ns/b": "waiting", "ns/c": "held"},
			},
			want: agreement{Held: 3, Waiting: 2, WantWaiting: 3, Right: 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, agree(keys, tc.leases, tc.states)); diff != "" {
				t.Errorf("agree (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMostHeld(t *testing.T) {
	keys := []string{"ns/a", "ns/b", "ns/c", "ns/d"}
	cases := map[string]struct {
		leases     holders
		want       string
		wantLeases []string
	}{
		"the larger share":  {leases: holders{"ns/a": "c2", "ns/b": "c1", "ns/c": "c2", "ns/d": ""}, want: "c2", wantLeases: []string{"ns/a", "ns/c"}},
		"a tie, by name":    {leases: holders{"ns/a": "c2", "ns/b": "c1"}, want: "c1", wantLeases: []string{"ns/b"}},
		"nothing held":      {leases: holders{}, want: ""},
		"a key not counted": {leases: holders{"ns/x": "c3", "ns/a": "c1"}, want: "c1", wantLeases: []string{"ns/a"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, gotLeases := mostHeld(keys, tc.leases)
			if got != tc.want || !cmp.Equal(gotLeases, tc.wantLeases) {
				t.Errorf("mostHeld = %s %v, want %s %v", got, gotLeases, tc.want, tc.wantLeases)
			}
		})
	}
}

func TestSnapshotSums(t *testing.T) {
	text := `# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="h",method="GET"} 40
rest_client_requests_total{code="200",host="h",method="PUT"} 7
rest_client_requests_total{code="201",host="h",method="POST"} 3
rest_client_requests_total{code="409",host="h",method="PUT"} 1
# TYPE berth_leaseapi_requests_total counter
berth_leaseapi_requests_total{code="200",route="/a"} 5
berth_leaseapi_requests_total{code="500",route="/a"} 1
berth_leaseapi_requests_total{code="200",route="/b"} 2
`
	s, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.sum(metricRESTRequests, labelIs("method", writeMethods...)); got != 11 {
		t.Errorf("writes = %g, want 11", got)
	}
	if got := s.sum("absent", nil); got != 0 {
		t.Errorf("an absent metric sums to %g, want 0", got)
	}
	before := map[string]float64{"/a": 2, "/b": 2}
	want := map[string]float64{"/a": 2} // /b did not move
	if diff := cmp.Diff(want, rates(s.by(metricRequests, "route"), before, 2*time.Second)); diff != "" {
		t.Errorf("rates (-want +got):\n%s", diff)
	}
}

func TestOutcomeString(t *testing.T) {
	cases := map[string]struct {
		o    outcome
		want string
	}{
		"done":     {o: done(1500*time.Millisecond, 10), want: "1.5 s"},
		"not done": {o: notDone(5*time.Minute, 51, 1000), want: "not done after 5m0s: 51 of 1000"},
		"not run":  {o: outcome{}, want: "-"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.o.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLeaseKeys(t *testing.T) {
	want := []string{"scale-00/lease-00000", "scale-01/lease-00001", "scale-02/lease-00002", "scale-00/lease-00003"}
	if diff := cmp.Diff(want, leaseKeys(3, 4)); diff != "" {
		t.Errorf("leaseKeys (-want +got):\n%s", diff)
	}
}
