package reconciler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

func TestMarksFor(t *testing.T) {
	waiting := berthv1alpha1.BerthLeaseStatus{LeaseState: StateWaiting, CurrentHolder: "east", FencingToken: 7}
	held := berthv1alpha1.BerthLeaseStatus{LeaseState: StateHeld, CurrentHolder: "west", FencingToken: 8}
	cases := map[string]struct {
		st     berthv1alpha1.BerthLeaseStatus
		d      Decision
		want   workloadMarks
		wantOK bool
	}{
		"active":   {st: held, d: Decision{Phase: PhaseActive}, want: workloadMarks{WorkloadActive, "west", 8}, wantOK: true},
		"stopping": {st: held, d: Decision{Phase: PhaseStopping}, want: workloadMarks{WorkloadStopping, "west", 8}, wantOK: true},
		"standby":  {st: waiting, d: Decision{}, want: workloadMarks{WorkloadStandby, "east", 7}, wantOK: true},
		// A restarted holder recovering its term, or a release not yet
		// confirmed: it must not suspend its CronJob and delete the Job
		// that runs.
		"held, neither running nor stopping: left alone": {st: held, d: Decision{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := marksFor(tc.st, tc.d)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(workloadMarks{})); diff != "" || ok != tc.wantOK {
				t.Errorf("marksFor() = %v (-want +got):\n%s", ok, diff)
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
// the workload, and resumed when it does only if the agent alone suspended it.
func TestDecideCronJob(t *testing.T) {
	cases := map[string]struct {
		state                   string
		suspended, ours, others bool
		want                    cronJobAction
	}{
		"standby, running: suspend":                          {WorkloadStandby, false, false, false, cronJobSuspend},
		"stopping, running: suspend":                         {WorkloadStopping, false, false, false, cronJobSuspend},
		"standby, suspended by the agent: keep":              {WorkloadStandby, true, true, false, cronJobKeep},
		"standby, suspended by its owner: keep":              {WorkloadStandby, true, false, true, cronJobKeep},
		"active, suspended by the agent: resume":             {WorkloadActive, true, true, false, cronJobResume},
		"active, suspended by its owner: keep":               {WorkloadActive, true, false, true, cronJobKeep},
		"active, suspended by the agent and its owner: keep": {WorkloadActive, true, true, true, cronJobForget},
		"standby, its owner suspended it too: forget":        {WorkloadStandby, true, true, true, cronJobForget},
		"active, running: keep":                              {WorkloadActive, false, false, false, cronJobKeep},
		"active, resumed by someone else: forget":            {WorkloadActive, false, true, true, cronJobForget},
		"standby, resumed by someone else: forget first":     {WorkloadStandby, false, true, true, cronJobForget},
		"standby, the mark left alone: suspend":              {WorkloadStandby, false, false, true, cronJobSuspend},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := decideCronJob(tc.state, tc.suspended, tc.ours, tc.others); got != tc.want {
				t.Errorf("decideCronJob(%q, suspended=%v, ours=%v, others=%v) = %d, want %d", tc.state, tc.suspended, tc.ours, tc.others, got, tc.want)
			}
		})
	}
}

// TestSuspendOwners: the agent tells its own suspension of a CronJob from
// one another field manager (its owner, a GitOps tool) made too.
func TestSuspendOwners(t *testing.T) {
	entry := func(manager, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
	}
	cases := map[string]struct {
		fields []metav1.ManagedFieldsEntry
		want   []string
	}{
		"nobody":               {},
		"the agent alone":      {fields: []metav1.ManagedFieldsEntry{entry(FieldManager, `{"f:spec":{"f:suspend":{}}}`)}, want: []string{FieldManager}},
		"the owner's schedule": {fields: []metav1.ManagedFieldsEntry{entry("kubectl", `{"f:spec":{"f:schedule":{}}}`), entry(FieldManager, `{"f:spec":{"f:suspend":{}}}`)}, want: []string{FieldManager}},
		"the owner's suspend":  {fields: []metav1.ManagedFieldsEntry{entry("kustomize-controller", `{"f:spec":{"f:schedule":{},"f:suspend":{}}}`)}, want: []string{"kustomize-controller"}},
		"shared with the agent": {
			fields: []metav1.ManagedFieldsEntry{entry(FieldManager, `{"f:spec":{"f:suspend":{}}}`), entry("argocd-controller", `{"f:spec":{"f:suspend":{}}}`)},
			want:   []string{"argocd-controller", FieldManager},
		},
		"status only": {fields: []metav1.ManagedFieldsEntry{entry("kube-controller-manager", `{"f:status":{"f:lastScheduleTime":{}}}`)}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{ManagedFields: tc.fields}}
			if diff := cmp.Diff(tc.want, suspendOwners(cj)); diff != "" {
				t.Errorf("suspendOwners() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStaleJob: no Job of a CronJob scheduled (or made by hand) at or before
// the term began, or before the agent resumed the CronJob, runs; nor any
// while the agent holds the CronJob suspended.
func TestStaleJob(t *testing.T) {
	termStart := time.Date(2030, 1, 2, 3, 10, 0, 0, time.UTC)
	at := func(d time.Duration) string { return termStart.Add(d).Format(time.RFC3339) }
	scheduled := func(d time.Duration) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{scheduledAtAnnotation: at(d)}}}
	}
	byHand := func(d time.Duration) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(termStart.Add(d))}}
	}
	cronJob := func(annotations map[string]string) *batchv1.CronJob {
		return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Annotations: annotations}}
	}
	cases := map[string]struct {
		job  *batchv1.Job
		cj   *batchv1.CronJob
		want bool
	}{
		"scheduled in the term":                        {scheduled(time.Minute), cronJob(nil), false},
		"scheduled before the term":                    {scheduled(-time.Minute), cronJob(nil), true},
		"scheduled as the term began":                  {scheduled(0), cronJob(nil), true},
		"made by hand in the term":                     {byHand(time.Second), cronJob(nil), false},
		"made by hand before the term":                 {byHand(-time.Second), cronJob(nil), true},
		"scheduled in the term, before the resumption": {scheduled(time.Minute), cronJob(map[string]string{AnnotationResumedAt: at(2 * time.Minute)}), true},
		"scheduled after the resumption":               {scheduled(3 * time.Minute), cronJob(map[string]string{AnnotationResumedAt: at(2 * time.Minute)}), false},
		"resumed in an earlier term":                   {scheduled(-time.Second), cronJob(map[string]string{AnnotationResumedAt: at(-time.Hour)}), true},
		"the agent holds the CronJob suspended":        {scheduled(time.Hour), cronJob(map[string]string{AnnotationSuspendedBy: suspendedByBerth}), true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := staleJob(tc.job, tc.cj, termStart); got != tc.want {
				t.Errorf("staleJob() = %v, want %v", got, tc.want)
			}
		})
	}
}
