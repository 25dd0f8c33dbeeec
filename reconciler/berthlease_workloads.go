package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
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

// suspendedByBerth is the value of AnnotationSuspendedBy.
const suspendedByBerth = "berth-agent"

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

// marksFor is the marks that the decision and the status just written say.
func marksFor(st berthv1alpha1.BerthLeaseStatus, d Decision) workloadMarks {
	m := workloadMarks{state: WorkloadStandby, holder: st.CurrentHolder, token: st.FencingToken}
	switch d.Phase {
	case PhaseActive:
		m.state = WorkloadActive
	case PhaseStopping:
		m.state = WorkloadStopping
	}
	return m
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
	// cronJobResume: delete the Jobs it left from before (they are stale),
	// record the resumption as its last schedule, and resume it.
	cronJobResume
	// cronJobForget: someone else resumed it; drop the agent's mark.
	cronJobForget
)

// decideCronJob decides what happens to a CronJob: suspended while its
// cluster does not run the workload, so that waiting clusters pile up no
// gated Jobs; resumed when it does, unless someone else suspended it (the
// agent resumes only what it suspended).
func decideCronJob(state string, suspended, ours bool) cronJobAction {
	switch {
	case state != WorkloadActive && !suspended:
		return cronJobSuspend
	case state == WorkloadActive && suspended && ours:
		return cronJobResume
	case !suspended && ours:
		return cronJobForget
	}
	return cronJobKeep
}

// syncWorkloads marks bl's managed workloads with this cluster's part in the
// lease and suspends or resumes its CronJobs. It runs after status is
// written and before any Pod is ungated, so that a CronJob's stale Jobs are
// gone before their Pods could be.
func (r *BerthLeaseReconciler) syncWorkloads(ctx context.Context, bl *berthv1alpha1.BerthLease, d Decision) error {
	if !r.ManagedWorkloads {
		return nil
	}
	m := marksFor(bl.Status, d)
	in := []ctrlclient.ListOption{ctrlclient.InNamespace(bl.Namespace), ctrlclient.MatchingLabels{ManagedLease: bl.Name}}
	deployments, statefulSets, cronJobs := &appsv1.DeploymentList{}, &appsv1.StatefulSetList{}, &batchv1.CronJobList{}
	for _, l := range []ctrlclient.ObjectList{deployments, statefulSets, cronJobs} {
		if err := r.List(ctx, l, in...); err != nil {
			return fmt.Errorf("list managed workloads: %w", err)
		}
	}
	for i := range deployments.Items {
		if err := r.mark(ctx, &deployments.Items[i], m, nil); err != nil {
			return err
		}
	}
	for i := range statefulSets.Items {
		if err := r.mark(ctx, &statefulSets.Items[i], m, nil); err != nil {
			return err
		}
	}
	for i := range cronJobs.Items {
		if err := r.syncCronJob(ctx, &cronJobs.Items[i], m); err != nil {
			return err
		}
	}
	return nil
}

// mark patches obj's annotations to m, and spec with specPatch if any. The
// patch carries obj's resourceVersion when it changes spec, so that it
// lands only on the object as it was read.
func (r *BerthLeaseReconciler) mark(ctx context.Context, obj ctrlclient.Object, m workloadMarks, specPatch map[string]any) error {
	annotations := m.annotations(obj.GetAnnotations())
	if annotations == nil && specPatch == nil {
		return nil
	}
	meta := map[string]any{}
	if annotations != nil {
		meta["annotations"] = annotations
	}
	patch := map[string]any{"metadata": meta}
	if specPatch != nil {
		meta["resourceVersion"] = obj.GetResourceVersion()
		patch["spec"] = specPatch
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	err = r.Patch(ctx, obj, ctrlclient.RawPatch(types.MergePatchType, body))
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // gone or changed since read: its watch brings the BerthLease back
	case err != nil:
		return fmt.Errorf("mark %T %s: %w", obj, obj.GetName(), err)
	}
	logr.FromContextOrDiscard(ctx).V(1).Info("marked managed workload", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName(), "leaseState", m.state)
	return nil
}

// syncCronJob marks cj and suspends or resumes it (decideCronJob). While the
// cluster stands by, it also deletes the Jobs cj left running from before it
// was suspended: their Pods wait gated and would run, stale, at a takeover.
func (r *BerthLeaseReconciler) syncCronJob(ctx context.Context, cj *batchv1.CronJob, m workloadMarks) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("cronJob", cj.Name)
	suspended := cj.Spec.Suspend != nil && *cj.Spec.Suspend
	ours := cj.Annotations[AnnotationSuspendedBy] == suspendedByBerth
	switch decideCronJob(m.state, suspended, ours) {
	case cronJobSuspend:
		if err := r.markCronJob(ctx, cj, m, true, suspendedByBerth, ""); err != nil {
			return err
		}
		log.Info("suspended a managed CronJob: this cluster does not hold the lease")
	case cronJobResume:
		if err := r.deleteJobs(ctx, cj); err != nil {
			return err
		}
		// The CronJob controller would otherwise start the latest schedule
		// it missed while suspended: one the previous holder ran. The same
		// time goes into an annotation, so that a health check can tell this
		// record from a run that did not succeed.
		now := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
		resumedAt := now.UTC().Format(time.RFC3339)
		if cj.Status.LastScheduleTime == nil || cj.Status.LastScheduleTime.Before(&now) {
			body := fmt.Sprintf(`{"status":{"lastScheduleTime":%q}}`, resumedAt)
			if err := r.Status().Patch(ctx, cj, ctrlclient.RawPatch(types.MergePatchType, []byte(body))); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("record the resumption of CronJob %s: %w", cj.Name, err)
			}
		}
		if err := r.markCronJob(ctx, cj, m, false, "", resumedAt); err != nil {
			return err
		}
		log.Info("resumed a managed CronJob: this cluster holds the lease")
	case cronJobForget:
		if err := r.markCronJob(ctx, cj, m, false, "", cj.Annotations[AnnotationResumedAt]); err != nil {
			return err
		}
	default:
		if m.state == WorkloadStandby && ours {
			if err := r.deleteJobs(ctx, cj); err != nil {
				return err
			}
		}
		return r.mark(ctx, cj, m, nil)
	}
	return nil
}

// markCronJob writes m, spec.suspend, the agent's suspension mark and the
// time it resumed the CronJob (each removed when empty) in one patch bound
// to cj as read.
func (r *BerthLeaseReconciler) markCronJob(ctx context.Context, cj *batchv1.CronJob, m workloadMarks, suspend bool, by, resumedAt string) error {
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
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": cj.ResourceVersion, "annotations": annotations},
		"spec":     map[string]any{"suspend": suspend},
	})
	if err != nil {
		return err
	}
	err = r.Patch(ctx, cj, ctrlclient.RawPatch(types.MergePatchType, body))
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // its watch brings the BerthLease back
	case err != nil:
		return fmt.Errorf("suspend or resume CronJob %s: %w", cj.Name, err)
	}
	return nil
}

// deleteJobs deletes the Jobs cj's status lists as active, each bound to its
// UID and only when cj controls it; their Pods go with them.
func (r *BerthLeaseReconciler) deleteJobs(ctx context.Context, cj *batchv1.CronJob) error {
	for _, ref := range cj.Status.Active {
		job := &batchv1.Job{}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: cj.Namespace, Name: ref.Name}, job)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("read Job %s of CronJob %s: %w", ref.Name, cj.Name, err)
		}
		if owner := metav1.GetControllerOf(job); owner == nil || owner.UID != cj.UID || !job.DeletionTimestamp.IsZero() {
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

// ownerJobGone reports whether pod belongs to a Job that is gone or going
// (a CronJob's stale Job deleteJobs removed, whose Pods the garbage
// collector has not yet removed): such a Pod is never ungated. jobs
// remembers the answers of one ungating pass.
func (r *BerthLeaseReconciler) ownerJobGone(ctx context.Context, pod *corev1.Pod, jobs map[types.UID]bool) (bool, error) {
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "Job" || owner.APIVersion != batchv1.SchemeGroupVersion.String() {
		return false, nil
	}
	if gone, ok := jobs[owner.UID]; ok {
		return gone, nil
	}
	job := &batchv1.Job{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: owner.Name}, job)
	switch {
	case apierrors.IsNotFound(err):
		jobs[owner.UID] = true
	case err != nil:
		return false, fmt.Errorf("read Job %s of Pod %s: %w", owner.Name, pod.Name, err)
	default:
		jobs[owner.UID] = job.UID != owner.UID || !job.DeletionTimestamp.IsZero()
	}
	return jobs[owner.UID], nil
}
