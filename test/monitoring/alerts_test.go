package monitoring

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// alertExprs returns every alert's expression of both rule files by name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, path := range []string{agentRules, leaseAPIRules} {
		groups, err := LoadRules(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				out[r.Alert] = r.Expr
			}
		}
	}
	return out
}

// TestAlertLogic evaluates alert expressions with Prometheus's engine on
// made-up series (promqltest's load notation, one sample a minute from time
// 0) and compares which series fire, named by one label, at one instant.
// It covers the expressions whose logic is more than a threshold: counters
// that appear with their first event, joins, and comparisons over time.
func TestAlertLogic(t *testing.T) {
	exprs := alertExprs(t)
	const lease = `cluster="east", namespace="payments", name="exporter"`
	cases := map[string]struct {
		alert string
		load  string
		at    time.Duration
		by    string
		want  []string
	}{
		"first self-fence: a new series at 1": {
			alert: "BerthLeaseSelfFenced",
			load:  `berth_agent_self_fence_total{` + lease + `} _x5 1x20`,
			at:    8 * time.Minute, by: "cluster", want: []string{"east"},
		},
		"a later self-fence": {
			alert: "BerthLeaseSelfFenced",
			load:  `berth_agent_self_fence_total{` + lease + `} 1x20 2x20`,
			at:    25 * time.Minute, by: "cluster", want: []string{"east"},
		},
		"an old self-fence": {
			alert: "BerthLeaseSelfFenced",
			load:  `berth_agent_self_fence_total{` + lease + `} _x5 1x30`,
			at:    25 * time.Minute, by: "cluster",
		},
		"first lost lease": {
			alert: "BerthLeaseLost",
			load:  `berth_agent_lease_transitions_total{` + lease + `, reason="Lost"} _x3 1x10`,
			at:    5 * time.Minute, by: "name", want: []string{"exporter"},
		},
		"an acquisition is no lost lease": {
			alert: "BerthLeaseLost",
			load:  `berth_agent_lease_transitions_total{` + lease + `, reason="Acquired"} _x3 1x10`,
			at:    5 * time.Minute, by: "name",
		},
		"first renewal error": {
			alert: "BerthLeaseRenewalsFailing",
			load: `berth_agent_renewals_total{cluster="east", result="renewed"} 0+10x20
berth_agent_renewals_total{cluster="east", result="error"} _x10 1x10`,
			at: 12 * time.Minute, by: "cluster", want: []string{"east"},
		},
		"renewals succeed": {
			alert: "BerthLeaseRenewalsFailing",
			load:  `berth_agent_renewals_total{cluster="east", result="renewed"} 0+10x20`,
			at:    12 * time.Minute, by: "cluster",
		},
		"held lease not renewed for 5 minutes": {
			alert: "BerthLeaseRenewalStale",
			load: `berth_agent_lease_renew_timestamp_seconds{` + lease + `} 0+60x5 300x10
berth_agent_lease_held{` + lease + `} 1x15`,
			at: 10 * time.Minute, by: "cluster", want: []string{"east"},
		},
		"held lease renewed every minute": {
			alert: "BerthLeaseRenewalStale",
			load: `berth_agent_lease_renew_timestamp_seconds{` + lease + `} 0+60x15
berth_agent_lease_held{` + lease + `} 1x15`,
			at: 10 * time.Minute, by: "cluster",
		},
		"lost lease with an old renewal time": {
			alert: "BerthLeaseRenewalStale",
			load: `berth_agent_lease_renew_timestamp_seconds{` + lease + `} 0+60x5 300x10
berth_agent_lease_held{` + lease + `} 1x5 0x10`,
			at: 10 * time.Minute, by: "cluster",
		},
		"stopping, neither released nor held": {
			alert: "BerthLeaseStoppingStuck",
			load: `berth_agent_lease_transitions_total{` + lease + `, reason="Acquired"} 1x120
berth_agent_lease_transitions_total{` + lease + `, reason="Stopping"} _x65 1x60
berth_agent_lease_held{` + lease + `} 1x65 0x60`,
			at: 90 * time.Minute, by: "name", want: []string{"exporter"},
		},
		"stopping, then released": {
			alert: "BerthLeaseStoppingStuck",
			load: `berth_agent_lease_transitions_total{` + lease + `, reason="Acquired"} 1x120
berth_agent_lease_transitions_total{` + lease + `, reason="Stopping"} _x65 1x60
berth_agent_lease_transitions_total{` + lease + `, reason="Released"} _x66 1x60
berth_agent_lease_held{` + lease + `} 1x65 0x60`,
			at: 90 * time.Minute, by: "name",
		},
		"stopping, BerthLease gone": {
			alert: "BerthLeaseStoppingStuck",
			load: `berth_agent_lease_transitions_total{` + lease + `, reason="Acquired"} 1x120
berth_agent_lease_transitions_total{` + lease + `, reason="Stopping"} _x65 1x60
berth_agent_lease_held{` + lease + `} 1x65 _x60`,
			at: 90 * time.Minute, by: "name",
		},
		"stopping, then handed over": {
			alert: "BerthLeaseStoppingStuck",
			load: `berth_agent_lease_transitions_total{` + lease + `, reason="Acquired"} 1x120
berth_agent_lease_transitions_total{` + lease + `, reason="Stopping"} _x65 1x60
berth_agent_lease_transitions_total{` + lease + `, reason="HandedOver"} _x66 1x60
berth_agent_lease_held{` + lease + `} 1x65 0x60`,
			at: 90 * time.Minute, by: "name",
		},
		"first failover limit": {
			alert: "BerthLeaseFailoverLimited",
			load:  `berth_agent_placement_moves_total{` + lease + `, reason="FailoverLimited"} _x5 1x90`,
			at:    50 * time.Minute, by: "name", want: []string{"exporter"},
		},
		"a failover limit over an hour old": {
			alert: "BerthLeaseFailoverLimited",
			load:  `berth_agent_placement_moves_total{` + lease + `, reason="FailoverLimited"} _x5 1x90`,
			at:    70 * time.Minute, by: "name",
		},
		"a failover is no limit": {
			alert: "BerthLeaseFailoverLimited",
			load:  `berth_agent_placement_moves_total{` + lease + `, reason="FailingOver"} _x5 1x90`,
			at:    50 * time.Minute, by: "name",
		},
		"lost, then stopping": {
			alert: "BerthLeaseStoppingStuck",
			load: `berth_agent_lease_transitions_total{` + lease + `, reason="Acquired"} 1x120
berth_agent_lease_transitions_total{` + lease + `, reason="Lost"} _x65 1x60
berth_agent_lease_transitions_total{` + lease + `, reason="Stopping"} _x65 1x60
berth_agent_lease_held{` + lease + `} 1x65 0x60`,
			at: 90 * time.Minute, by: "name",
		},
		"first admission error": {
			alert: "BerthAdmissionErrors",
			load: `berth_admission_decisions_total{job="berth-agent", instance="a", operation="CREATE", decision="mutate", reason="x"} 0+5x20
berth_admission_decisions_total{job="berth-agent", instance="a", operation="CREATE", decision="error", reason="y"} _x10 2x10`,
			at: 12 * time.Minute, by: "instance", want: []string{"a"},
		},
		"first expiry at the lease API": {
			alert: "BerthLeasesExpired",
			load:  `berth_leaseapi_lease_transitions_total{job="berth-leaseapi", reason="expired"} _x5 1x10`,
			at:    8 * time.Minute, by: "job", want: []string{"berth-leaseapi"},
		},
		"fewer leases held than earlier": {
			alert: "BerthLeasesUnheld",
			load:  `berth_leaseapi_leases_held{job="berth-leaseapi", instance="a"} 3x30 2x30`,
			at:    50 * time.Minute, by: "job", want: []string{"berth-leaseapi"},
		},
		"as many leases held as ever": {
			alert: "BerthLeasesUnheld",
			load:  `berth_leaseapi_leases_held{job="berth-leaseapi", instance="a"} 2x30 3x30`,
			at:    50 * time.Minute, by: "job",
		},
		"a silent cluster": {
			alert: "BerthClusterUnhealthy",
			load: `berth_leaseapi_clusters_registered{job="berth-leaseapi", instance="a"} 3x10
berth_leaseapi_clusters_healthy{job="berth-leaseapi", instance="a"} 3x5 2x5`,
			at: 8 * time.Minute, by: "instance", want: []string{"a"},
		},
		"no lease API up": {
			alert: "BerthLeaseAPIDown",
			load:  `up{job="berth-leaseapi", instance="a"} 1x5 0x5`,
			at:    8 * time.Minute, by: "job", want: []string{""},
		},
		"a lease API up": {
			alert: "BerthLeaseAPIDown",
			load: `up{job="berth-leaseapi", instance="a"} 1x5 0x5
up{job="berth-leaseapi", instance="b"} 1x10`,
			at: 8 * time.Minute, by: "job",
		},
		"5xx on renewals": {
			alert: "BerthLeaseAPIServerErrors",
			load: `berth_leaseapi_requests_total{job="berth-leaseapi", route="/v1alpha1/renewals", code="200"} 0+100x20
berth_leaseapi_requests_total{job="berth-leaseapi", route="/v1alpha1/renewals", code="500"} 0+10x20`,
			at: 15 * time.Minute, by: "route", want: []string{"/v1alpha1/renewals"},
		},
	}
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, promqltest.DefaultMaxSamplesPerQuery)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			expr, ok := exprs[tc.alert]
			if !ok {
				t.Fatalf("no alert %s", tc.alert)
			}
			storage := promqltest.LoadedStorage(t, "load 1m\n  "+strings.ReplaceAll(tc.load, "\n", "\n  "))
			q, err := engine.NewInstantQuery(t.Context(), storage, nil, expr, time.Unix(0, 0).Add(tc.at))
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			res := q.Exec(t.Context())
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range vec {
				got = append(got, s.Metric.Get(tc.by))
			}
			slices.Sort(got)
			got = slices.Compact(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s at %s fires for %s (-want +got):\n%s", tc.alert, tc.at, tc.by, diff)
			}
		})
	}
}
