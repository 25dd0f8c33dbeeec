package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// The managed workloads: Deployments, StatefulSets and CronJobs that carry
// the label berth.skaphos.io/managed-lease on their own metadata (as well as
// on their Pod template). The agent marks each with its cluster's part in the
// lease, so that GitOps health checks tell a standby copy from a broken one,
// and suspends a CronJob while its cluster does not hold the lease.
// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=batch,resources=cronjobs/status,verbs=patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;delete

// Workload annotations and values (defined in api/v1alpha1, names.go).
const (
	AnnotationLeaseState  = berthv1alpha1.LeaseStateAnnotation
	AnnotationSuspendedBy = berthv1alpha1.SuspendedByAnnotation
	AnnotationResumedAt   = berthv1alpha1.ResumedAtAnnotation
	WorkloadActive        = berthv1alpha1.WorkloadActive
	WorkloadStandby       = berthv1alpha1.WorkloadStandby
	WorkloadStopping      = berthv1alpha1.WorkloadStopping
)

// FieldManager is the field manager of the agent's writes to managed
// workloads: a GitOps tool can ignore what it owns (deploy/gitops), and the
// agent tells its own suspension of a CronJob from its owner's by it.
const FieldManager = "berth-agent"

// suspendedByBerth is the value of AnnotationSuspendedBy.
const suspendedByBerth = FieldManager

// scheduledAtAnnotation is the CronJob controller's record, on each Job, of
// the schedule it runs.
const scheduledAtAnnotation = "batch.kubernetes.io/cronjob-scheduled-timestamp"

// WorkloadKinds are the kinds of managed workloads the agent marks; the
// agent's cache holds only those of them that carry the managed label.
func WorkloadKinds() []ctrlclient.Object {
	return []ctrlclient.Object{&appsv1.Deployment{}, &appsv1.StatefulSet{}, &batchv1.CronJob{}}
}

// workloadMarks is what the agent writes on a managed workload.
type workloadMarks struct {
	state, holder string
	token         int32
}

// marksFor is the marks that the decision and the status just written say,
// and whether they say anything: a cluster that may still hold a term it
// has not confirmed (an agent that restarted and is recovering it, a
// release not yet confirmed) neither runs nor stands by, so its workloads
// are left as they are until it knows.
func marksFor(st berthv1alpha1.BerthLeaseStatus, d Decision) (workloadMarks, bool) {
	m := workloadMarks{state: WorkloadStandby, holder: st.CurrentHolder, token: st.FencingToken}
	switch {
	case d.Phase == PhaseActive:
		m.state = WorkloadActive
	case d.Phase == PhaseStopping:
		m.state = WorkloadStopping
	case st.LeaseState == StateHeld:
		return workloadMarks{}, false
	}
	return m, true
}

// annotations is the patch of metadata.annotations that brings have to m:
// nil when nothing changes. A holder or token that is not known is removed.
func (m workloadMarks) annotations(have map[string]string) map[string]any {
	want := map[string]string{AnnotationLeaseState: m.state, AnnotationHolder: m.holder}
	if m.token > 0 {
		want[AnnotationFencingToken] = strconv.FormatInt(int64(m.token), 10)
	}
	patch := map[string]any{}
	for _, k := range []string{AnnotationLeaseState, AnnotationHolder, AnnotationFencingToken} {
		v, ok := want[k]
		if v == "" {
			ok = false
		}
		old, had := have[k]
		switch {
		case ok && (!had || old != v):
			patch[k] = v
		case !ok && had:
			patch[k] = nil
		}
	}
	if len(patch) == 0 {
		return nil
	}
	return patch
}

// cronJobAction is what the agent does to a managed CronJob.
type cronJobAction int

const (
	cronJobKeep cronJobAction = iota
	// cronJobSuspend: suspend it and mark it as suspended by the agent.
	cronJobSuspend
	// cronJobResume: record the resumption as its last schedule, and
	// resume it (its Jobs from before are never ungated: jobMayRun).
	cronJobResume
	// cronJobForget: drop the agent's mark and leave spec.suspend as it is:
	// someone else resumed the CronJob, or suspended it too.
	cronJobForget
)

// decideCronJob decides what happens to a CronJob: suspended while its
// cluster does not run the workload, so that waiting clusters pile up no
// gated Jobs; resumed when it does, unless someone else suspended it (the
// agent resumes only what it alone suspended). others says that another
// field manager owns spec.suspend: its owner (or a GitOps tool) set it
// after, or as well as, the agent.
func decideCronJob(state string, suspended, ours, others bool) cronJobAction {
	switch {
	case ours && (!suspended || others):
		return cronJobForget
	case state != WorkloadActive && !suspended:
		return cronJobSuspend
	case state == WorkloadActive && suspended && ours:
		return cronJobResume
	}
	return cronJobKeep
}

// listWorkloads lists bl's managed workloads from the cache: the ones it
// only marks (Deployments and StatefulSets), and its CronJobs.
func (r *BerthLeaseReconciler) listWorkloads(ctx context.Context, bl *berthv1alpha1.BerthLease) ([]ctrlclient.Object, []batchv1.CronJob, error) {
	in := []ctrlclient.ListOption{ctrlclient.InNamespace(bl.Namespace), ctrlclient.MatchingLabels{ManagedLease: bl.Name}}
	deployments, statefulSets, cronJobs := &appsv1.DeploymentList{}, &appsv1.StatefulSetList{}, &batchv1.CronJobList{}
	for _, l := range []ctrlclient.ObjectList{deployments, statefulSets, cronJobs} {
		if err := r.List(ctx, l, in...); err != nil {
			return nil, nil, fmt.Errorf("list managed workloads: %w", err)
		}
	}
	var marked []ctrlclient.Object
	for i := range deployments.Items {
		marked = append(marked, &deployments.Items[i])
	}
	for i := range statefulSets.Items {
		marked = append(marked, &statefulSets.Items[i])
	}
	return marked, cronJobs.Items, nil
}

// syncWorkloads marks bl's managed workloads with this cluster's part in the
// lease and suspends or resumes its CronJobs. It runs after status is
// written and before any Pod is ungated. jobs names the Jobs that control
// bl's managed Pods (podJobs): a CronJob's Job that its status does not
// list is found through its Pods.
func (r *BerthLeaseReconciler) syncWorkloads(ctx context.Context, bl *berthv1alpha1.BerthLease, d Decision, jobs []string) error {
	if !r.ManagedWorkloads {
		return nil
	}
	m, ok := marksFor(bl.Status, d)
	if !ok {
		return nil
	}
	marked, cronJobs, err := r.listWorkloads(ctx, bl)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range marked {
		errs = append(errs, r.mark(ctx, o, m.annotations(o.GetAnnotations())))
	}
	since := termStart(bl)
	for i := range cronJobs {
		errs = append(errs, r.syncCronJob(ctx, &cronJobs[i], m, since, jobs))
	}
	return errors.Join(errs...)
}

// podJobs names the Jobs that control p's managed Pods.
func podJobs(p *observation) []string {
	var names []string
	for _, pods := range [][]corev1.Pod{p.gated, p.stale, p.running} {
		for i := range pods {
			if owner := metav1.GetControllerOf(&pods[i]); owner != nil && owner.Kind == "Job" && !slices.Contains(names, owner.Name) {
				names = append(names, owner.Name)
			}
		}
	}
	return names
}

// termStart is when this cluster's current term of bl's lease began (the
// lease API's time), or zero when it holds none.
func termStart(bl *berthv1alpha1.BerthLease) time.Time {
	if bl.Status.LeaseState != StateHeld || bl.Status.AcquiredAt == nil {
		return time.Time{}
	}
	return bl.Status.AcquiredAt.Time
}

// clearMarks removes the marks from bl's managed workloads when bl is gone:
// nothing runs them any more, and a health check must not read "standby".
// CronJobs the agent suspended stay suspended (and marked so), since their
// Jobs could not run without a BerthLease either.
func (r *BerthLeaseReconciler) clearMarks(ctx context.Context, bl *berthv1alpha1.BerthLease) error {
	if !r.ManagedWorkloads {
		return nil
	}
	objs, cronJobs, err := r.listWorkloads(ctx, bl)
	if err != nil {
		return err
	}
	for i := range cronJobs {
		objs = append(objs, &cronJobs[i])
	}
	var errs []error
	for _, o := range objs {
		patch := map[string]any{}
		for _, k := range []string{AnnotationLeaseState, AnnotationHolder, AnnotationFencingToken} {
			if _, had := o.GetAnnotations()[k]; had {
				patch[k] = nil
			}
		}
		errs = append(errs, r.mark(ctx, o, patch))
	}
	return errors.Join(errs...)
}

// mark merge-patches obj's annotations (nil: nothing to do).
func (r *BerthLeaseReconciler) mark(ctx context.Context, obj ctrlclient.Object, annotations map[string]any) error {
	if len(annotations) == 0 {
		return nil
	}
	if err := r.mergePatch(ctx, obj, map[string]any{"metadata": map[string]any{"annotations": annotations}}); err != nil {
		return fmt.Errorf("mark %T %s: %w", obj, obj.GetName(), err)
	}
	logr.FromContextOrDiscard(ctx).V(1).Info("marked managed workload", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName(), "annotations", annotations)
	return nil
}

// mergePatch merge-patches obj with patch as the agent's field manager. An
// object that is gone needs nothing: nil.
func (r *BerthLeaseReconciler) mergePatch(ctx context.Context, obj ctrlclient.Object, patch map[string]any) error {
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	err = r.Patch(ctx, obj, ctrlclient.RawPatch(types.MergePatchType, body), ctrlclient.FieldOwner(FieldManager))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// syncCronJob marks cj and suspends or resumes it (decideCronJob). It
// deletes cj's stale Jobs among jobs and those its status lists: all of them
// while the cluster stands by or resumes cj, those that may not run in the
// term that began at since while it holds the lease.
func (r *BerthLeaseReconciler) syncCronJob(ctx context.Context, cj *batchv1.CronJob, m workloadMarks, since time.Time, jobs []string) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("cronJob", cj.Name)
	suspended := cj.Spec.Suspend != nil && *cj.Spec.Suspend
	// The agent's suspension: marked so, or one nobody else owns any more
	// (an owner who suspended it too, then stopped: their apply left the
	// agent the field's only owner).
	owners := suspendOwners(cj)
	marked := cj.Annotations[AnnotationSuspendedBy] == suspendedByBerth
	ours := marked || (suspended && slices.Equal(owners, []string{FieldManager}))
	others := slices.ContainsFunc(owners, func(o string) bool { return o != FieldManager })
	candidates := slices.Clone(jobs)
	for _, ref := range cj.Status.Active {
		if !slices.Contains(candidates, ref.Name) {
			candidates = append(candidates, ref.Name)
		}
	}
	suspend, resume := true, false
	switch decideCronJob(m.state, suspended, ours, others) {
	case cronJobSuspend:
		if err := r.patchCronJob(ctx, cj, m, &suspend, suspendedByBerth, ""); err != nil {
			return err
		}
		log.Info("suspended a managed CronJob: this cluster does not hold the lease")
	case cronJobResume:
		// Every Job it has was made before: stale.
		if err := r.deleteJobs(ctx, cj, candidates, time.Time{}); err != nil {
			return err
		}
		// The CronJob controller would otherwise start the latest schedule
		// it missed while suspended: one the previous holder ran. The same
		// time goes into an annotation: jobMayRun keeps the Jobs scheduled
		// before it gated, and a health check tells this record from a run
		// that did not succeed.
		now := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
		resumedAt := now.UTC().Format(time.RFC3339)
		if cj.Status.LastScheduleTime == nil || cj.Status.LastScheduleTime.Before(&now) {
			body := fmt.Sprintf(`{"status":{"lastScheduleTime":%q}}`, resumedAt)
			if err := r.Status().Patch(ctx, cj, ctrlclient.RawPatch(types.MergePatchType, []byte(body)), ctrlclient.FieldOwner(FieldManager)); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("record the resumption of CronJob %s: %w", cj.Name, err)
			}
		}
		if err := r.patchCronJob(ctx, cj, m, &resume, "", resumedAt); err != nil {
			return err
		}
		log.Info("resumed a managed CronJob: this cluster holds the lease", "lastScheduleTime", resumedAt)
	case cronJobForget:
		if err := r.patchCronJob(ctx, cj, m, nil, "", cj.Annotations[AnnotationResumedAt]); err != nil {
			return err
		}
		log.Info("a managed CronJob was suspended or resumed by someone else: the agent leaves it to them", "suspend", suspended)
	default:
		switch m.state {
		case WorkloadStandby:
			// Made while the CronJob was not (yet) suspended: stale.
			if err := r.deleteJobs(ctx, cj, candidates, time.Time{}); err != nil {
				return err
			}
		case WorkloadActive:
			// A stale Job that a failed resumption left, or one made while
			// the cluster stood by: it never runs (jobMayRun), and with
			// concurrencyPolicy Forbid it would hold every schedule back.
			if err := r.deleteJobs(ctx, cj, candidates, since); err != nil {
				return err
			}
		}
		return r.mark(ctx, cj, m.annotations(cj.Annotations))
	}
	return nil
}

// suspendOwners lists the field managers that own cj's spec.suspend.
func suspendOwners(cj *batchv1.CronJob) []string {
	var owners []string
	for _, e := range cj.ManagedFields {
		if e.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields) == nil {
			if _, ok := fields.Spec["f:suspend"]; ok && !slices.Contains(owners, e.Manager) {
				owners = append(owners, e.Manager)
			}
		}
	}
	slices.Sort(owners)
	return owners
}

// suspendOwnersChanged reports whether an update of a CronJob changed who
// owns its spec.suspend (an apply of the value it already has changes
// nothing else).
func suspendOwnersChanged(old, new ctrlclient.Object) bool {
	o, ok1 := old.(*batchv1.CronJob)
	n, ok2 := new.(*batchv1.CronJob)
	return ok1 && ok2 && !slices.Equal(suspendOwners(o), suspendOwners(n))
}

// patchCronJob writes m, spec.suspend (unless nil), the agent's suspension
// mark and the time it resumed the CronJob (each removed when empty) in one
// patch bound to cj as read. A conflict is an error, so that the reconcile
// is retried: the change that caused it may be one no watch event brings.
func (r *BerthLeaseReconciler) patchCronJob(ctx context.Context, cj *batchv1.CronJob, m workloadMarks, suspend *bool, by, resumedAt string) error {
	annotations := m.annotations(cj.Annotations)
	if annotations == nil {
		annotations = map[string]any{}
	}
	for k, v := range map[string]string{AnnotationSuspendedBy: by, AnnotationResumedAt: resumedAt} {
		if v != "" {
			annotations[k] = v
		} else {
			annotations[k] = nil
		}
	}
	patch := map[string]any{"metadata": map[string]any{"resourceVersion": cj.ResourceVersion, "annotations": annotations}}
	if suspend != nil {
		patch["spec"] = map[string]any{"suspend": *suspend}
	}
	if err := r.mergePatch(ctx, cj, patch); err != nil {
		return fmt.Errorf("suspend or resume CronJob %s: %w", cj.Name, err)
	}
	return nil
}

// deleteJobs deletes the Jobs of names that cj controls, each bound to its
// UID; their Pods go with them. With a zero since it deletes them all (the
// cluster stands by, or is resuming the CronJob); otherwise only those that
// may not run in the term that began at since (staleJob).
func (r *BerthLeaseReconciler) deleteJobs(ctx context.Context, cj *batchv1.CronJob, names []string, since time.Time) error {
	for _, name := range names {
		job := &batchv1.Job{}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: cj.Namespace, Name: name}, job)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("read Job %s of CronJob %s: %w", name, cj.Name, err)
		}
		if owner := metav1.GetControllerOf(job); owner == nil || owner.UID != cj.UID || !job.DeletionTimestamp.IsZero() {
			continue
		}
		if !since.IsZero() && !staleJob(job, cj, since) {
			continue
		}
		err = r.Delete(ctx, job, ctrlclient.PropagationPolicy(metav1.DeletePropagationBackground), ctrlclient.Preconditions{UID: &job.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete stale Job %s of CronJob %s: %w", job.Name, cj.Name, err)
		}
		logr.FromContextOrDiscard(ctx).Info("deleted a stale Job of a managed CronJob", "cronJob", cj.Name, "job", job.Name)
	}
	return nil
}

// jobMayRun reports whether pod may be ungated as far as its Job goes, in
// the term that began at since. A Pod that no Job controls may. A Job's Pod
// may not when the Job is gone or going, nor when a CronJob controls the Job
// and cronJobMayRun says no. The answers are read from the API server, not
// the cache, and remembered in jobs for one ungating pass.
func (r *BerthLeaseReconciler) jobMayRun(ctx context.Context, pod *corev1.Pod, since time.Time, jobs map[types.UID]bool) (bool, error) {
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "Job" || owner.APIVersion != batchv1.SchemeGroupVersion.String() {
		return true, nil
	}
	if ok, seen := jobs[owner.UID]; seen {
		return ok, nil
	}
	job := &batchv1.Job{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: owner.Name}, job)
	switch {
	case apierrors.IsNotFound(err):
		jobs[owner.UID] = false
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read Job %s of Pod %s: %w", owner.Name, pod.Name, err)
	case job.UID != owner.UID || !job.DeletionTimestamp.IsZero():
		jobs[owner.UID] = false
		return false, nil
	}
	ok, err := r.cronJobMayRun(ctx, job, since)
	if err != nil {
		return false, err
	}
	jobs[owner.UID] = ok
	return ok, nil
}

// cronJobMayRun judges a Job by the CronJob that controls it, if any, read
// from the API server (staleJob), for the term that began at since.
func (r *BerthLeaseReconciler) cronJobMayRun(ctx context.Context, job *batchv1.Job, since time.Time) (bool, error) {
	owner := metav1.GetControllerOf(job)
	if owner == nil || owner.Kind != "CronJob" || owner.APIVersion != batchv1.SchemeGroupVersion.String() {
		return true, nil
	}
	cj := &batchv1.CronJob{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: owner.Name}, cj)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil // the garbage collector removes its Jobs
	case err != nil:
		return false, fmt.Errorf("read CronJob %s of Job %s: %w", owner.Name, job.Name, err)
	case cj.UID != owner.UID:
		return false, nil
	}
	return !staleJob(job, cj, since), nil
}

// staleJob reports whether job, which cj controls, may not run in the term
// that began at since: while the agent holds cj suspended, and when the
// Job's schedule (or, for a Job made by hand, its creation) came at or
// before the term began or the agent resumed cj. Such a Job was made while
// this cluster stood by, and the previous holder ran that schedule.
// Whichever path cj took to running here (resumed by the agent, by its
// owner, or never suspended), no Job from before the term runs.
func staleJob(job *batchv1.Job, cj *batchv1.CronJob, since time.Time) bool {
	if cj.Annotations[AnnotationSuspendedBy] == suspendedByBerth {
		return true
	}
	if resumed, err := time.Parse(time.RFC3339, cj.Annotations[AnnotationResumedAt]); err == nil && resumed.After(since) {
		since = resumed
	}
	made := job.CreationTimestamp.Time
	if scheduled, err := time.Parse(time.RFC3339, job.Annotations[scheduledAtAnnotation]); err == nil {
		made = scheduled
	}
	return !made.After(since)
}
