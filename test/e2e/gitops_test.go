package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/charts"
	"github.com/berthfleet/berth/test/gitops"
	"github.com/berthfleet/berth/test/localfleet"
	"github.com/berthfleet/berth/test/poll"
)

// The GitOps suite's workload, beside the suite's exporter: a Deployment, a
// StatefulSet and a CronJob under one BerthLease, in their own namespace.
const (
	gitopsNamespace = "gitops"
	reports         = "reports" // the BerthLease and the Deployment
	ledger          = "ledger"  // the StatefulSet
	invoices        = "invoices"
)

var (
	gitopsDir   = filepath.Join(charts.RepoDir(), "deploy", "gitops")
	argoHealth  = func(file string) string { return filepath.Join(gitopsDir, "argocd", "health", file) }
	fluxKustomz = filepath.Join(gitopsDir, "flux", "billing.yaml")
)

// TestGitOps applies one workload to every cluster as a GitOps tool would,
// in every order, and judges each cluster's objects with the health checks
// Berth ships (Argo CD's Lua, Flux's expressions) and with kstatus: on the
// holder, on the standby clusters past the Deployment's progress deadline,
// after a failover, and in each failure state. The managed CronJob runs its
// schedule on the holder only and piles up no Job on the others; after a
// takeover it runs no schedule that fell before it.
func TestGitOps(t *testing.T) {
	r := startFleet(t)
	ctx := t.Context()
	checks, err := gitops.FluxChecks(fluxKustomz)
	if err != nil {
		t.Fatal(err)
	}

	// Every order: the workload before its BerthLease, after it, both at once.
	var wg sync.WaitGroup
	for i, m := range r.Members {
		wg.Go(func() {
			if err := m.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gitopsNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Error(err)
				return
			}
			switch i % 3 {
			case 0:
				applyReportsWorkloads(t, m)
				poll.For(t, 30*time.Second, m.Name+" admits the workload's Pods gated before their BerthLease exists", func() bool {
					pods := reportsPods(t, m)
					return len(pods) > 0 && pods[0].Labels[berthv1alpha1.ManagedLeaseUIDLabel] == "" && gatedPod(&pods[0])
				})
				applyReportsLease(t, m)
			case 1:
				applyReportsLease(t, m)
				applyReportsWorkloads(t, m)
			default:
				var both sync.WaitGroup
				both.Go(func() { applyReportsLease(t, m) })
				both.Go(func() { applyReportsWorkloads(t, m) })
				both.Wait()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	holder := reportsRunner(t, r, 90*time.Second, "")
	t.Logf("%s runs %s", holder, reports)
	for _, m := range r.Members {
		if n := failedCreates(t, m); n > 0 {
			t.Errorf("%s: %d FailedCreate events: applying the workload before its BerthLease piled up errors", m.Name, n)
		}
	}

	// Healthy everywhere, once the standby Deployments are past their
	// progress deadline.
	for _, m := range r.Members {
		if m.Name == holder {
			continue
		}
		poll.For(t, 60*time.Second, m.Name+"'s standby Deployment is past its progress deadline", func() bool {
			d := &appsv1.Deployment{}
			if err := m.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: gitopsNamespace, Name: reports}, d); err != nil {
				return false
			}
			for _, c := range d.Status.Conditions {
				if c.Type == appsv1.DeploymentProgressing && c.Reason == "ProgressDeadlineExceeded" {
					return true
				}
			}
			return false
		})
	}
	checkHealthy(t, r, holder, "", checks)

	// The CronJob runs on the holder only: the standby clusters create no
	// Job (they are suspended), however many schedules pass.
	awaitMinute(t)
	poll.For(t, 60*time.Second, holder+" runs the CronJob's schedule to completion", func() bool {
		return completedJobs(t, r.Member(holder)) > 0
	})
	for _, m := range r.Members {
		if m.Name != holder {
			if jobs := cronJobJobs(t, m); len(jobs) > 0 {
				t.Errorf("%s, standing by, has %d Job(s) of the CronJob", m.Name, len(jobs))
			}
		}
	}

	// A stale Job on each standby cluster, as a CronJob makes one in a moment
	// it is not suspended (its status need not list it): the agent deletes
	// it, and its Pod never runs. And the CronJob's owner pauses it on the
	// standby clusters with a server-side apply, as Flux does (the agent had
	// suspended it already).
	for _, m := range r.Members {
		if m.Name != holder {
			createStaleJob(t, m, time.Now().Add(-time.Minute))
			awaitStaleJobGone(t, m)
			ownerSuspends(t, m, true)
		}
	}

	// A failover by cordon: the new holder resumes its CronJob without
	// running a schedule that fell before it took over, the old one suspends.
	cordoned := time.Now()
	if _, err := r.LeaseAPI.Admin.Cordon(ctx, holder); err != nil {
		t.Fatal(err)
	}
	next := reportsRunner(t, r, ttl+60*time.Second, holder)
	tookOver := time.Now()
	t.Logf("cordoned %s: %s runs %s", holder, next, reports)
	// The owner's pause holds through the takeover; when the owner lifts it
	// (drops the field from its apply), the agent resumes the CronJob.
	poll.For(t, 30*time.Second, next+" leaves its CronJob to its owner, suspended", func() bool {
		n := cronJob(t, r.Member(next))
		return ptr.Deref(n.Spec.Suspend, false) && n.Annotations[berthv1alpha1.SuspendedByAnnotation] == ""
	})
	time.Sleep(2 * time.Second)
	if n := cronJob(t, r.Member(next)); !ptr.Deref(n.Spec.Suspend, false) {
		t.Errorf("%s resumed a CronJob its owner suspended", next)
	}
	ownerSuspends(t, r.Member(next), false)
	poll.For(t, 30*time.Second, next+" resumes its CronJob once its owner no longer suspends it, and "+holder+" suspends its own", func() bool {
		n, o := cronJob(t, r.Member(next)), cronJob(t, r.Member(holder))
		return !ptr.Deref(n.Spec.Suspend, false) && n.Annotations[berthv1alpha1.ResumedAtAnnotation] != "" &&
			ptr.Deref(o.Spec.Suspend, false) && o.Annotations[berthv1alpha1.SuspendedByAnnotation] != ""
	})
	// A Job scheduled before the takeover (before the cordon that caused it),
	// found on the new holder, one its status does not list: it never runs
	// there, and is deleted.
	createStaleJob(t, r.Member(next), cordoned.Add(-time.Second))
	awaitStaleJobGone(t, r.Member(next))
	checkHealthy(t, r, next, holder, checks)
	for _, m := range r.Members {
		cj := object(t, m, schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}, invoices)
		if h := must(gitops.ArgoCD(argoHealth("cronjob.lua"), cj)); h.Status != "Healthy" {
			t.Errorf("%s: Argo CD health of the CronJob after the takeover: %s, want Healthy", m.Name, h)
		} else {
			t.Logf("%s: CronJob: Argo CD %s", m.Name, h)
		}
	}
	awaitMinute(t)
	poll.For(t, 60*time.Second, next+" runs the CronJob's next schedule", func() bool {
		return completedJobs(t, r.Member(next)) > 0
	})
	for _, j := range cronJobJobs(t, r.Member(next)) {
		if j.Name == staleJob {
			continue
		}
		at, err := time.Parse(time.RFC3339, j.Annotations["batch.kubernetes.io/cronjob-scheduled-timestamp"])
		if err != nil || at.Before(tookOver.Add(-time.Second).Truncate(time.Minute)) || !at.After(tookOver.Add(-time.Second)) {
			t.Errorf("%s ran Job %s scheduled at %s (%v), before it took over at %s", next, j.Name, at.Format(time.TimeOnly), err, tookOver.Format(time.TimeOnly))
		}
	}
	if _, err := r.LeaseAPI.Admin.Uncordon(ctx, holder); err != nil {
		t.Fatal(err)
	}
	holder = next

	// Failure states, each reported as a failure by every check.
	t.Run("stuck stopping", func(t *testing.T) {
		m := r.Member(holder)
		thaw := freezeKubelets(t, m)
		if _, err := r.LeaseAPI.Admin.Cordon(ctx, holder); err != nil {
			t.Fatal(err)
		}
		awaitBerthLeaseHealth(t, m, "Progressing", "InProgress", berthv1alpha1.StoppingReason)
		awaitBerthLeaseHealth(t, m, "Degraded", "Failed", berthv1alpha1.StuckStoppingReason)
		thaw()
		if _, err := r.LeaseAPI.Admin.Uncordon(ctx, holder); err != nil {
			t.Fatal(err)
		}
		holder = reportsRunner(t, r, ttl+60*time.Second, "")
	})
	t.Run("registration refused", func(t *testing.T) {
		var m, other *localfleet.Member
		for _, x := range r.Members {
			switch {
			case x.Name == holder:
			case m == nil:
				m = x
			default:
				other = x
			}
		}
		m.StopAgent()
		if err := m.StartAgent(other.Name); err != nil {
			t.Fatal(err)
		}
		awaitBerthLeaseHealth(t, m, "Degraded", "Failed", berthv1alpha1.RegistrationRefusedReason)
		m.StopAgent()
		if err := m.StartAgent(m.Name); err != nil {
			t.Fatal(err)
		}
		awaitBerthLeaseHealth(t, m, "Healthy", "Current", berthv1alpha1.StandbyReason)
	})
	t.Run("self-fenced", func(t *testing.T) {
		m := r.Member(holder)
		m.Proxy.Cut()
		awaitBerthLeaseHealth(t, m, "Degraded", "Failed", berthv1alpha1.SelfFencedReason)
		m.Proxy.Heal()
		reportsRunner(t, r, ttl+60*time.Second, "")
	})
}

// applyReportsLease creates the BerthLease of the GitOps workload.
func applyReportsLease(t *testing.T, m *localfleet.Member) {
	t.Helper()
	bl := builders.BerthLease(gitopsNamespace, reports).TTL(workload.TTLSeconds).Heartbeat(workload.HeartbeatSeconds).Obj()
	if err := m.Client.Create(t.Context(), bl); err != nil {
		t.Errorf("%s: create BerthLease: %v", m.Name, err)
	}
}

// applyReportsWorkloads creates the Deployment (with a short progress
// deadline), the StatefulSet and the CronJob, each labelled as managed.
func applyReportsWorkloads(t *testing.T, m *localfleet.Member) {
	t.Helper()
	managed := map[string]string{berthv1alpha1.ManagedLeaseLabel: reports}
	template := func(app string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app, berthv1alpha1.ManagedLeaseLabel: reports}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				RestartPolicy:                 corev1.RestartPolicyAlways,
				Containers:                    []corev1.Container{{Name: "main", Image: "registry.example/" + app + ":1"}},
			},
		}
	}
	deploy := builders.Deployment(gitopsNamespace, reports).ManagedBy(reports).Obj()
	deploy.Spec.ProgressDeadlineSeconds = ptr.To[int32](5)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: gitopsNamespace, Name: ledger, Labels: managed},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1), ServiceName: ledger,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": ledger}},
			Template: template(ledger),
		},
	}
	job := template(invoices)
	job.Spec.RestartPolicy = corev1.RestartPolicyNever
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: gitopsNamespace, Name: invoices, Labels: managed},
		Spec: batchv1.CronJobSpec{
			Schedule: "* * * * *", ConcurrencyPolicy: batchv1.ForbidConcurrent,
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: job}},
		},
	}
	for _, o := range []ctrlclient.Object{deploy, sts, cj} {
		if err := m.Client.Create(t.Context(), o); err != nil {
			t.Errorf("%s: create %T: %v", m.Name, o, err)
		}
	}
}

// reportsPods lists the Deployment's and StatefulSet's Pods (not the Jobs').
func reportsPods(t *testing.T, m *localfleet.Member) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := m.Client.List(t.Context(), pods, ctrlclient.InNamespace(gitopsNamespace), ctrlclient.MatchingLabels{berthv1alpha1.ManagedLeaseLabel: reports}); err != nil {
		return nil
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if app := p.Labels["app"]; (app == reports || app == ledger) && p.DeletionTimestamp.IsZero() {
			out = append(out, p)
		}
	}
	return out
}

func gatedPod(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == berthv1alpha1.LeaseHeldSchedulingGate {
			return true
		}
	}
	return false
}

// reportsRunner waits until one cluster other than not runs the
// Deployment's and the StatefulSet's Pods and every other cluster keeps its
// own gated, stamped with their BerthLease's UID, and returns it.
func reportsRunner(t *testing.T, r *run, timeout time.Duration, not string) string {
	t.Helper()
	var runner string
	poll.For(t, timeout, "one cluster runs the GitOps workload, the others keep it gated", func() bool {
		runner = ""
		for _, m := range r.Members {
			pods := reportsPods(t, m)
			ungated, stamped := 0, 0
			for i := range pods {
				if !gatedPod(&pods[i]) {
					ungated++
				} else if pods[i].Labels[berthv1alpha1.ManagedLeaseUIDLabel] != "" {
					stamped++
				}
			}
			switch {
			case ungated == 2 && runner == "" && m.Name != not:
				runner = m.Name
			case ungated > 0 || stamped != 2:
				return false
			}
		}
		return runner != ""
	})
	return runner
}

// failedCreates counts the FailedCreate events in the GitOps namespace.
func failedCreates(t *testing.T, m *localfleet.Member) int {
	t.Helper()
	events := &corev1.EventList{}
	if err := m.Client.List(t.Context(), events, ctrlclient.InNamespace(gitopsNamespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		// A Job's Pod is refused until its BerthLease exists (docs/gitops.md), so the
		// Jobs of a CronJob applied first may fail to create one: only the Deployment's
		// and StatefulSet's Pods wait.
		if e.Reason == "FailedCreate" && e.InvolvedObject.Kind != "Job" {
			t.Logf("%s: %s %s: %s", m.Name, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
			n++
		}
	}
	return n
}

// object reads one object of the GitOps workload as Argo CD and Flux see it.
func object(t *testing.T, m *localfleet.Member, gvk schema.GroupVersionKind, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := m.Client.Get(t.Context(), ctrlclient.ObjectKey{Namespace: gitopsNamespace, Name: name}, u); err != nil {
		t.Fatalf("%s: get %s %s: %v", m.Name, gvk.Kind, name, err)
	}
	return u
}

var (
	berthLeaseGVK  = berthv1alpha1.GroupVersion.WithKind("BerthLease")
	deploymentGVK  = appsv1.SchemeGroupVersion.WithKind("Deployment")
	statefulSetGVK = appsv1.SchemeGroupVersion.WithKind("StatefulSet")
)

// checkHealthy judges every cluster's objects: all healthy to Argo CD and
// Flux, the holder's active and the others' standby naming the holder, and
// plain kstatus still strict on the holder's workloads.
// A cordoned cluster (cordoned) may not know the holder: it follows no lease.
func checkHealthy(t *testing.T, r *run, holder, cordoned string, checks []gitops.FluxCheck) {
	t.Helper()
	for _, m := range r.Members {
		want := "standby: " // a cordoned cluster says so instead of the holder
		if m.Name == holder {
			want = "active: held by " + holder
		}
		// The status is written on transitions: wait for the one a failover brings.
		awaitBerthLeaseHealth(t, m, "Healthy", "Current", "")
		bl := object(t, m, berthLeaseGVK, reports)
		if h := must(gitops.ArgoCD(argoHealth("berthlease.lua"), bl)); !strings.HasPrefix(h.Message, want) {
			t.Errorf("%s: Argo CD health of the BerthLease: %s, want a message starting %q", m.Name, h, want)
		}
		for _, w := range []struct {
			gvk  schema.GroupVersionKind
			name string
			lua  string
		}{{deploymentGVK, reports, "deployment.lua"}, {statefulSetGVK, ledger, "statefulset.lua"}} {
			// A new holder's workload rolls out first (Pods ungated,
			// scheduled, available): on a busy machine that can take a while.
			var (
				obj        *unstructured.Unstructured
				argo, flux gitops.Health
				named      string
			)
			what := m.Name + "'s " + w.gvk.Kind + " is healthy to Argo CD and Flux"
			if _, err := poll.Until(t.Context(), time.Minute, what, func(context.Context) (bool, error) {
				obj = object(t, m, w.gvk, w.name)
				argo, flux = must(gitops.ArgoCD(argoHealth(w.lua), obj)), must(gitops.Flux(checks, obj))
				named = obj.GetAnnotations()[berthv1alpha1.HolderAnnotation]
				return argo.Status == "Healthy" && flux.Status == "Current" && (named == holder || (m.Name == cordoned && named == "")), nil
			}); err != nil {
				logRollout(t, m)
				t.Fatalf("%v; last seen: Argo CD %s, Flux %s, holder annotation %q (want %q)", err, argo, flux, named, holder)
			}
			ks := must(gitops.Kstatus(obj))
			state := obj.GetAnnotations()[berthv1alpha1.LeaseStateAnnotation]
			t.Logf("%s: %s %s: lease-state %s; Argo CD %s; kstatus alone %s", m.Name, w.gvk.Kind, w.name, state, argo, ks)
			switch {
			case m.Name == holder && (state != berthv1alpha1.WorkloadActive || ks.Status != "Current"):
				t.Errorf("%s (holder): %s marked %q, kstatus %s; want active and Current", m.Name, w.gvk.Kind, state, ks)
			case m.Name != holder && (state != berthv1alpha1.WorkloadStandby || !strings.HasPrefix(argo.Message, "standby: ")):
				t.Errorf("%s (standby): %s marked %q, Argo CD %s; want standby, held by %s", m.Name, w.gvk.Kind, state, argo, holder)
			}
			if m.Name != holder && ks.Status == "Current" {
				// Why Flux needs the expressions: kstatus alone never finds a standby
				// workload current (a Deployment past its deadline is Failed).
				t.Errorf("%s: kstatus alone on the standby %s: %s, want it not Current", m.Name, w.gvk.Kind, ks)
			}
			if mgr := annotationManager(obj, berthv1alpha1.LeaseStateAnnotation); mgr != "berth-agent" {
				t.Errorf("%s: %s's annotation %s is owned by field manager %q, want berth-agent (deploy/gitops/argocd ignores its fields)", m.Name, w.gvk.Kind, berthv1alpha1.LeaseStateAnnotation, mgr)
			}
		}
	}
}

// logRollout logs the evidence for a workload that does not become healthy: the
// Deployment's, ReplicaSets' and StatefulSet's status, every Pod's timeline and
// what the controller manager, the scheduler and kwok said about the namespace.
func logRollout(t *testing.T, m *localfleet.Member) {
	t.Helper()
	ctx := t.Context()
	ns := ctrlclient.InNamespace(gitopsNamespace)
	deploys, sets, sts, pods := &appsv1.DeploymentList{}, &appsv1.ReplicaSetList{}, &appsv1.StatefulSetList{}, &corev1.PodList{}
	for _, l := range []ctrlclient.ObjectList{deploys, sets, sts, pods} {
		if err := m.Client.List(ctx, l, ns); err != nil {
			t.Logf("%s: list %T: %v", m.Name, l, err)
		}
	}
	for _, d := range deploys.Items {
		t.Logf("%s: Deployment %s generation %d: status %+v", m.Name, d.Name, d.Generation, d.Status)
	}
	for _, rs := range sets.Items {
		t.Logf("%s: ReplicaSet %s generation %d, spec.replicas %d: status %+v", m.Name, rs.Name, rs.Generation, ptr.Deref(rs.Spec.Replicas, 0), rs.Status)
	}
	for _, s := range sts.Items {
		t.Logf("%s: StatefulSet %s generation %d: status %+v", m.Name, s.Name, s.Generation, s.Status)
	}
	for _, p := range pods.Items {
		t.Logf("%s: Pod %s created %s deleted %v node %q gates %v phase %s conditions %+v", m.Name, p.Name,
			p.CreationTimestamp.Format(time.StampMilli), p.DeletionTimestamp, p.Spec.NodeName, p.Spec.SchedulingGates, p.Status.Phase, p.Status.Conditions)
	}
	events := &corev1.EventList{}
	if err := m.Client.List(ctx, events, ns); err != nil {
		t.Logf("%s: list Events: %v", m.Name, err)
	}
	for _, e := range events.Items {
		t.Logf("%s: Event %s %s/%s %s: %s (x%d, last %s)", m.Name, e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, e.Count, e.LastTimestamp.Format(time.StampMilli))
	}
	for _, component := range []string{"kube-controller-manager", "kube-scheduler", "kwok"} {
		f := m.Cluster.LogFile(component)
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Logf("%s: %v", m.Name, err)
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, gitopsNamespace+"/") || strings.Contains(line, `"`+gitopsNamespace+`"`) {
				t.Logf("%s: %s: %s", m.Name, component, line)
			}
		}
	}
}

// awaitBerthLeaseHealth waits until Argo CD's health of m's BerthLease is
// argo and kstatus's is ks, with a Ready condition of reason (any when "").
func awaitBerthLeaseHealth(t *testing.T, m *localfleet.Member, argo, ks, reason string) {
	t.Helper()
	var got, gotKs gitops.Health
	poll.For(t, 60*time.Second, fmt.Sprintf("%s's BerthLease is %s to Argo CD and %s to kstatus (%s)", m.Name, argo, ks, reason), func() bool {
		bl := object(t, m, berthLeaseGVK, reports)
		got, gotKs = must(gitops.ArgoCD(argoHealth("berthlease.lua"), bl)), must(gitops.Kstatus(bl))
		ready, _, _ := unstructured.NestedSlice(bl.Object, "status", "conditions")
		readyReason := ""
		for _, c := range ready {
			if c, ok := c.(map[string]any); ok && c["type"] == berthv1alpha1.ReadyCondition {
				readyReason, _ = c["reason"].(string)
			}
		}
		return got.Status == argo && gotKs.Status == ks && (reason == "" || readyReason == reason)
	})
	t.Logf("%s: BerthLease: Argo CD %s; kstatus %s", m.Name, got, gotKs)
}

func must(h gitops.Health, err error) gitops.Health {
	if err != nil {
		panic(err)
	}
	return h
}

// annotationManager is the field manager that owns annotation key of obj.
func annotationManager(obj *unstructured.Unstructured, key string) string {
	for _, e := range obj.GetManagedFields() {
		if e.FieldsV1 != nil && strings.Contains(e.FieldsV1.GetRawString(), `"f:`+key+`"`) {
			return e.Manager
		}
	}
	return ""
}

func cronJob(t *testing.T, m *localfleet.Member) *batchv1.CronJob {
	t.Helper()
	cj := &batchv1.CronJob{}
	if err := m.Client.Get(t.Context(), ctrlclient.ObjectKey{Namespace: gitopsNamespace, Name: invoices}, cj); err != nil {
		t.Fatalf("%s: get CronJob: %v", m.Name, err)
	}
	return cj
}

// cronJobJobs lists the Jobs of the CronJob.
func cronJobJobs(t *testing.T, m *localfleet.Member) []batchv1.Job {
	t.Helper()
	cj := cronJob(t, m)
	jobs := &batchv1.JobList{}
	if err := m.Client.List(t.Context(), jobs, ctrlclient.InNamespace(gitopsNamespace)); err != nil {
		t.Fatal(err)
	}
	var out []batchv1.Job
	for _, j := range jobs.Items {
		if owner := metav1.GetControllerOf(&j); owner != nil && owner.UID == cj.UID {
			out = append(out, j)
		}
	}
	return out
}

// completedJobs counts the CronJob's Jobs that completed.
func completedJobs(t *testing.T, m *localfleet.Member) int {
	n := 0
	for _, j := range cronJobJobs(t, m) {
		if j.Status.Succeeded > 0 {
			n++
		}
	}
	return n
}

// awaitMinute sleeps into the next minute, when a "* * * * *" schedule falls.
func awaitMinute(t *testing.T) {
	next := time.Now().Truncate(time.Minute).Add(time.Minute)
	select {
	case <-time.After(time.Until(next) + time.Second):
	case <-t.Context().Done():
	}
}

// staleJob is a Job of the CronJob made by the test, scheduled in the past.
const staleJob = "invoices-stale"

// createStaleJob makes a Job the CronJob controls, scheduled at at, as the
// CronJob controller would have.
func createStaleJob(t *testing.T, m *localfleet.Member, at time.Time) {
	t.Helper()
	cj := cronJob(t, m)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: gitopsNamespace, Name: staleJob,
			Annotations:     map[string]string{"batch.kubernetes.io/cronjob-scheduled-timestamp": at.UTC().Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: cj.Spec.JobTemplate.Spec,
	}
	if err := m.Client.Create(t.Context(), job); err != nil {
		t.Fatalf("%s: create a stale Job: %v", m.Name, err)
	}
}

// awaitStaleJobGone waits until the agent has deleted the stale Job and its
// Pods, and fails the test if any of them was ungated meanwhile.
func awaitStaleJobGone(t *testing.T, m *localfleet.Member) {
	t.Helper()
	poll.For(t, 30*time.Second, m.Name+" deletes the stale Job, its Pod never ungated", func() bool {
		pods := &corev1.PodList{}
		if err := m.Client.List(t.Context(), pods, ctrlclient.InNamespace(gitopsNamespace), ctrlclient.MatchingLabels{"job-name": staleJob}); err != nil {
			return false
		}
		for i := range pods.Items {
			if !gatedPod(&pods.Items[i]) {
				t.Fatalf("%s ungated Pod %s of a stale Job", m.Name, pods.Items[i].Name)
			}
		}
		err := m.Client.Get(t.Context(), ctrlclient.ObjectKey{Namespace: gitopsNamespace, Name: staleJob}, &batchv1.Job{})
		return apierrors.IsNotFound(err) && len(pods.Items) == 0
	})
}

// ownerSuspends applies the CronJob's spec.suspend: true server-side as its
// owner's GitOps tool ("flux") would, or, with false, drops the field from
// that apply (the way an owner lifts a pause in Git).
func ownerSuspends(t *testing.T, m *localfleet.Member, suspend bool) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"})
	u.SetNamespace(gitopsNamespace)
	u.SetName(invoices)
	if suspend {
		if err := unstructured.SetNestedField(u.Object, true, "spec", "suspend"); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Client.Apply(t.Context(), ctrlclient.ApplyConfigurationFromUnstructured(u), ctrlclient.FieldOwner("flux"), ctrlclient.ForceOwnership); err != nil {
		t.Fatalf("%s: the owner's apply of the CronJob: %v", m.Name, err)
	}
}
