package reconciler

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// TestStatusWritesBringNoReconcile: the agent's own status writes and its
// finalizer's addition do not bring a reconcile; every other change of a
// BerthLease does.
func TestStatusWritesBringNoReconcile(t *testing.T) {
	fresh := &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Name: "exporter", Generation: 1}}
	added := fresh.DeepCopy()
	added.Finalizers = []string{FinalizerName}
	if notStatusOnly(event.UpdateEvent{ObjectOld: fresh, ObjectNew: added}) {
		t.Error("the agent's finalizer added brings a reconcile")
	}
	old := &berthv1alpha1.BerthLease{ObjectMeta: metav1.ObjectMeta{Name: "exporter", Generation: 1, Finalizers: []string{FinalizerName}}}
	now := metav1.NewTime(time.Now())
	for name, tc := range map[string]struct {
		change func(*berthv1alpha1.BerthLease)
		want   bool
	}{
		"status only":        {func(bl *berthv1alpha1.BerthLease) { bl.Status.LeaseState = StateHeld; bl.ResourceVersion = "2" }, false},
		"spec":               {func(bl *berthv1alpha1.BerthLease) { bl.Generation = 2 }, true},
		"finalizer removed":  {func(bl *berthv1alpha1.BerthLease) { bl.Finalizers = nil }, true},
		"another finalizer":  {func(bl *berthv1alpha1.BerthLease) { bl.Finalizers = append(bl.Finalizers, "example.com/x") }, true},
		"deletion requested": {func(bl *berthv1alpha1.BerthLease) { bl.DeletionTimestamp = &now }, true},
		"label":              {func(bl *berthv1alpha1.BerthLease) { bl.Labels = map[string]string{"team": "payments"} }, true},
		"annotation":         {func(bl *berthv1alpha1.BerthLease) { bl.Annotations = map[string]string{"note": "x"} }, true},
	} {
		n := old.DeepCopy()
		tc.change(n)
		if got := notStatusOnly(event.UpdateEvent{ObjectOld: old, ObjectNew: n}); got != tc.want {
			t.Errorf("%s: reconcile %v, want %v", name, got, tc.want)
		}
	}
}
