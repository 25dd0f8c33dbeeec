package e2e

import (
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/admission"
	"github.com/berthfleet/berth/test/localfleet"
)

// TestInstalledWithHelm runs a fleet installed as a user installs it: the berth-agent chart
// in every cluster (its CRD, its RBAC, its webhook Service and registrations, policies,
// and webhook certificates the agent makes itself), each agent running with exactly what
// the chart's Deployment gives it, as the chart's ServiceAccount. The API server reaches
// the webhooks through the chart's Service: the workload's Pods are gated by them. Then the
// holder cluster is lost and another takes over, with no overlap; an upgrade of the chart
// keeps the webhooks' trust.
func TestInstalledWithHelm(t *testing.T) {
	r := startFleetWith(t, localfleet.Options{Helm: true})
	holder, took := r.runner(t, 90*time.Second, "one cluster runs both replicas")
	t.Logf("%s runs the workload %s after the fleet was up", holder, took.Round(time.Millisecond))

	// Every cluster's webhook registrations carry the CA the agent made and patched in.
	for _, m := range r.Members {
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := m.Client.Get(t.Context(), ctrlclient.ObjectKey{Name: admission.WebhookConfigurationName}, cfg); err != nil {
			t.Fatal(err)
		}
		for _, w := range cfg.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 || w.ClientConfig.Service == nil || w.ClientConfig.Service.Name != "berth-agent-webhook" {
				t.Errorf("%s: webhook %s: caBundle %d bytes, service %+v: want the agent's CA and the chart's Service", m.Name, w.Name, len(w.ClientConfig.CABundle), w.ClientConfig.Service)
			}
		}
	}

	// An upgrade of the chart (the same values again, as a GitOps sync) keeps the CA that
	// the agent patched in: the fail-closed webhooks never lose their trust.
	waiting := r.Members[0]
	if waiting.Name == holder {
		waiting = r.Members[1]
	}
	if err := waiting.UpgradeAgentChart(t.Context()); err != nil {
		t.Fatal(err)
	}
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := waiting.Client.Get(t.Context(), ctrlclient.ObjectKey{Name: admission.WebhookConfigurationName}, cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Errorf("%s: the upgrade emptied the mutating webhook's caBundle", waiting.Name)
	}
	if err := waiting.AwaitAdmission(t.Context()); err != nil {
		t.Errorf("%s after the upgrade: %v", waiting.Name, err)
	}

	// Upgrades that would leave the holder's Pods running with nobody to stop them are
	// refused: a new ServiceAccount (the running agent would lose its rights at once) and
	// managed workloads turned off (the agent would release without stopping its Pods).
	for value, want := range map[string]string{
		"serviceAccount.name=berth-agent-2": "serviceAccount.name cannot change",
		"managedWorkloads=false":            "managedWorkloads cannot be turned off",
	} {
		err := r.Member(holder).UpgradeAgentChart(t.Context(), value)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("upgrade of the holder with %s: %v, want a refusal saying %q", value, err, want)
		}
	}
	r.stable(t, holder, ttl)

	// The holder cluster is lost: its control plane and its agent die.
	next, took := r.loseHolder(t, holder)
	t.Logf("cluster %s lost: %s runs %s later (TTL %s)", holder, next, took.Round(time.Millisecond), ttl)
	r.record(t, "holder cluster lost (installed with Helm)", took)
}
