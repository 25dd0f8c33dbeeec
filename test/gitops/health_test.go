package gitops

import (
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/berthfleet/berth/test/charts"
)

func dir(parts ...string) string {
	return filepath.Join(append([]string{charts.RepoDir(), "deploy", "gitops"}, parts...)...)
}

func obj(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(j); err != nil {
		t.Fatal(err)
	}
	return u
}

const (
	standbyDeploy = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: billing, generation: 1, annotations: {berth.skaphos.io/lease-state: standby, berth.skaphos.io/holder: east, berth.skaphos.io/fencing-token: "7"}}
spec: {replicas: 2}
status:
  observedGeneration: 1
  replicas: 2
  updatedReplicas: 2
  conditions: [{type: Progressing, status: "False", reason: ProgressDeadlineExceeded}]`
	activeDeploy = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: billing, generation: 1, annotations: {berth.skaphos.io/lease-state: active}}
spec: {replicas: 2}
status:
  observedGeneration: 1
  replicas: 2
  updatedReplicas: 2
  availableReplicas: 2
  readyReplicas: 2
  conditions: [{type: Progressing, status: "True", reason: NewReplicaSetAvailable}, {type: Available, status: "True"}]`
	stuckActiveDeploy = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: billing, generation: 1, annotations: {berth.skaphos.io/lease-state: active}}
spec: {replicas: 2}
status:
  observedGeneration: 1
  replicas: 2
  updatedReplicas: 2
  conditions: [{type: Progressing, status: "False", reason: ProgressDeadlineExceeded}]`
	standbyUncreatable = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: billing, generation: 1, annotations: {berth.skaphos.io/lease-state: standby}}
spec: {replicas: 2}
status:
  observedGeneration: 1
  conditions: [{type: ReplicaFailure, status: "True", reason: FailedCreate, message: "pods is forbidden: exceeded quota"}]`
	standbyCronJob = `
apiVersion: batch/v1
kind: CronJob
metadata: {name: invoices, annotations: {berth.skaphos.io/lease-state: standby, berth.skaphos.io/holder: east, berth.skaphos.io/fencing-token: "7"}}
spec: {schedule: "0 * * * *", suspend: true}
status: {lastScheduleTime: "2030-01-02T03:00:00Z", lastSuccessfulTime: "2030-01-02T02:00:00Z"}`
	resumedCronJob = `
apiVersion: batch/v1
kind: CronJob
metadata: {name: invoices, annotations: {berth.skaphos.io/lease-state: active, berth.skaphos.io/resumed-at: "2030-01-02T03:20:00Z"}}
spec: {schedule: "0 * * * *", suspend: false}
status: {lastScheduleTime: "2030-01-02T03:20:00Z", lastSuccessfulTime: "2030-01-02T02:00:00Z"}`
	failedCronJob = `
apiVersion: batch/v1
kind: CronJob
metadata: {name: invoices, annotations: {berth.skaphos.io/lease-state: active, berth.skaphos.io/resumed-at: "2030-01-02T03:20:00Z"}}
spec: {schedule: "0 * * * *", suspend: false}
status: {lastScheduleTime: "2030-01-02T04:00:00Z", lastSuccessfulTime: "2030-01-02T02:00:00Z"}`
	newBerthLease = `
apiVersion: berth.skaphos.io/v1alpha1
kind: BerthLease
metadata: {name: billing, generation: 1}`
	stalledBerthLease = `
apiVersion: berth.skaphos.io/v1alpha1
kind: BerthLease
metadata: {name: billing, generation: 1}
status:
  observedGeneration: 1
  conditions:
  - {type: Ready, status: "False", reason: SelfFenced, message: "self-fenced: the local deadline passed"}
  - {type: Stalled, status: "True", reason: SelfFenced, message: "self-fenced: the local deadline passed"}`
	standbyBerthLease = `
apiVersion: berth.skaphos.io/v1alpha1
kind: BerthLease
metadata: {name: billing, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Standby, message: "standby: held by east with fencing token 7"}`
	staleBerthLease = `
apiVersion: berth.skaphos.io/v1alpha1
kind: BerthLease
metadata: {name: billing, generation: 3}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Standby, message: "standby: held by east with fencing token 7"}`
)

// TestChecks: the shipped checks on objects in the states that matter, each
// judged by Argo CD's Lua, Flux's expressions (Deployments) and kstatus.
// The end-to-end suite (TestGitOps) judges the objects of real clusters.
func TestChecks(t *testing.T) {
	flux, err := FluxChecks(dir("flux", "billing.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		lua, obj                  string
		wantArgo, wantFlux, wantK string
	}{
		"standby Deployment past its deadline":       {"deployment.lua", standbyDeploy, "Healthy", "Current", "Failed"},
		"active Deployment, available":               {"deployment.lua", activeDeploy, "Healthy", "Current", "Current"},
		"active Deployment past its deadline":        {"deployment.lua", stuckActiveDeploy, "Degraded", "Failed", "Failed"},
		"standby Deployment whose Pods cannot exist": {"deployment.lua", standbyUncreatable, "Degraded", "Failed", "InProgress"},
		"CronJob suspended on standby":               {"cronjob.lua", standbyCronJob, "Healthy", "", "Current"},
		"CronJob resumed at a takeover, no run yet":  {"cronjob.lua", resumedCronJob, "Healthy", "", "Current"},
		"CronJob whose last run failed":              {"cronjob.lua", failedCronJob, "Degraded", "", "Current"},
		"BerthLease the agent has not seen":          {"berthlease.lua", newBerthLease, "Progressing", "", "Current"},
		"BerthLease self-fenced":                     {"berthlease.lua", stalledBerthLease, "Degraded", "", "Failed"},
		"BerthLease standing by":                     {"berthlease.lua", standbyBerthLease, "Healthy", "", "Current"},
		"BerthLease with a spec not yet seen":        {"berthlease.lua", staleBerthLease, "Progressing", "", "InProgress"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := obj(t, tc.obj)
			argo, err := ArgoCD(dir("argocd", "health", tc.lua), o)
			if err != nil {
				t.Fatal(err)
			}
			if argo.Status != tc.wantArgo {
				t.Errorf("Argo CD: %s, want %s", argo, tc.wantArgo)
			}
			if tc.wantFlux != "" {
				if h, err := Flux(flux, o); err != nil || h.Status != tc.wantFlux {
					t.Errorf("Flux: %s (%v), want %s", h, err, tc.wantFlux)
				}
			}
			if h, err := Kstatus(o); err != nil || h.Status != tc.wantK {
				t.Errorf("kstatus: %s (%v), want %s", h, err, tc.wantK)
			}
		})
	}
}
