package admission

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Decision label values of berth_admission_decisions_total.
const (
	decisionAllow  = "allow"
	decisionDeny   = "deny"
	decisionMutate = "mutate"
	decisionError  = "error"
)

// decisions counts admission decisions. operation is the admission operation (CREATE or
// UPDATE), decision one of allow, deny, mutate (the mutating webhook changed the Pod) and
// error (the request failed closed), reason a Reason.
var decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "berth_admission_decisions_total",
	Help: "Admission decisions on Pods by operation (CREATE, UPDATE), decision (allow, deny, mutate, error) and reason.",
}, []string{"operation", "decision", "reason"})

func init() {
	metrics.Registry.MustRegister(decisions)
}

func record(operation, decision string, reason Reason) {
	decisions.WithLabelValues(operation, decision, string(reason)).Inc()
}
