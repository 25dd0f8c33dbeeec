package reconciler

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

func TestMarksFor(t *testing.T) {
	st := berthv1alpha1.BerthLeaseStatus{CurrentHolder: "east", FencingToken: 7}
	cases := map[string]struct {
		d    Decision
		want workloadMarks
	}{
		"active":   {d: Decision{Phase: PhaseActive}, want: workloadMarks{WorkloadActive, "east", 7}},
		"stopping": {d: Decision{Phase: PhaseStopping}, want: workloadMarks{WorkloadStopping, "east", 7}},
		"standby":  {d: Decision{}, want: workloadMarks{WorkloadStandby, "east", 7}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, marksFor(st, tc.d), cmp.AllowUnexported(workloadMarks{})); diff != "" {
				t.Errorf("marksFor() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWorkloadMarksAnnotations(t *testing.T) {
	standby := workloadMarks{WorkloadStandby, "east", 7}
	cases := map[string]struct {
		marks workloadMarks
		have  map[string]string
		want  map[string]any
	}{
		"unmarked": {
			marks: standby, have: map[string]string{"app": "billing"},
			want: map[string]any{AnnotationLeaseState: WorkloadStandby, AnnotationHolder: "east", AnnotationFencingToken: "7"},
		},
		"marked alike: no patch": {
			marks: standby,
			have:  map[string]string{AnnotationLeaseState: WorkloadStandby, AnnotationHolder: "east", AnnotationFencingToken: "7", "app": "billing"},
		},
		"taken over": {
			marks: workloadMarks{WorkloadActive, "west", 8},
			have:  map[string]string{AnnotationLeaseState: WorkloadStandby, AnnotationHolder: "east", AnnotationFencingToken: "7"},
			want:  map[string]any{AnnotationLeaseState: WorkloadActive, AnnotationHolder: "west", AnnotationFencingToken: "8"},
		},
		"no holder known: holder and token removed": {
			marks: workloadMarks{state: WorkloadStandby},
			have:  map[string]string{AnnotationLeaseState: WorkloadStandby, AnnotationHolder: "east", AnnotationFencingToken: "7"},
			want:  map[string]any{AnnotationHolder: nil, AnnotationFencingToken: nil},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.marks.annotations(tc.have)); diff != "" {
				t.Errorf("annotations() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecideCronJob: a CronJob is suspended while its cluster does not run
// the workload, and resumed when it does only if the agent suspended it.
func TestDecideCronJob(t *testing.T) {
	cases := map[string]struct {
		state           string
		suspended, ours bool
		want            cronJobAction
	}{
		"standby, running: suspend":                 {WorkloadStandby, false, false, cronJobSuspend},
		"stopping, running: suspend":                {WorkloadStopping, false, false, cronJobSuspend},
		"standby, suspended by the agent: keep":     {WorkloadStandby, true, true, cronJobKeep},
		"standby, suspended by its owner: keep":     {WorkloadStandby, true, false, cronJobKeep},
		"active, suspended by the agent: resume":    {WorkloadActive, true, true, cronJobResume},
		"active, suspended by its owner: keep":      {WorkloadActive, true, false, cronJobKeep},
		"active, running: keep":                     {WorkloadActive, false, false, cronJobKeep},
		"active, resumed by someone else: forget":   {WorkloadActive, false, true, cronJobForget},
		"standby, resumed by someone else: suspend": {WorkloadStandby, false, true, cronJobSuspend},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := decideCronJob(tc.state, tc.suspended, tc.ours); got != tc.want {
				t.Errorf("decideCronJob(%q, suspended=%v, ours=%v) = %d, want %d", tc.state, tc.suspended, tc.ours, got, tc.want)
			}
		})
	}
}
