// Package admission keeps managed Pods gated: WorkloadAdmission is a mutating webhook that
// gates a managed Pod at its creation and a validating webhook that lets only the Berth
// agent ungate it, and Manifests renders their fail-closed registrations together with a
// ValidatingAdmissionPolicy that repeats the core rules inside the API server.
//
// A Pod is managed when it carries the label berthv1alpha1.ManagedLeaseLabel (the user's
// opt-in, naming a BerthLease in the Pod's namespace). The rules:
//
//   - At creation, by anyone: a managed Pod carries the scheduling gate
//     berthv1alpha1.LeaseHeldSchedulingGate, no spec.nodeName, and the label
//     berthv1alpha1.ManagedLeaseUIDLabel with the UID of the BerthLease it names, which
//     must exist. With Mutate, the mutating
//     webhook adds the gate and the UID label itself (Stamp).
//   - On every change of a Pod or its status: only the agent (OperatorUser) may remove the
//     gate, add, change or remove the managed labels, or change the term annotations
//     (berthv1alpha1.FencingTokenAnnotation, berthv1alpha1.HolderAnnotation).
//   - For a BerthLease with spec.podFencing Exec: the mutating webhook wraps the Pod in
//     berth-fence (Fence), the validating webhook admits it only with exactly that
//     wrapping, for this agent's FenceConfig, and refuses to everyone, the agent included,
//     a later change that would let code run outside berth-fence (an ephemeral container,
//     another installer image).
//
// A managed Pod is never bound while it is gated: the API server refuses to bind any Pod
// with a scheduling gate, and a Pod can only be bound at creation (spec.nodeName, denied
// above) or through pods/binding. So the agent's ungating is the only way a managed Pod
// reaches a node; admission does not intercept pods/binding (docs/admission.md says why).
//
// The decisions are pure functions (DecideCreate, DecideUpdate, Stamp); the webhook
// handlers gather what they need (the BerthLease's UID, read from the API server), decide,
// and count each decision in berth_admission_decisions_total{operation,decision,reason}.
//
// The names of labels, gate and annotations are api/v1alpha1's (names.go), shared with the
// reconciler; this package does not import the reconciler. It does not ungate Pods or stop
// them (package reconciler does), and does not issue the webhook server's certificate
// (admission/certs does, when the agent manages it; otherwise cert-manager or the user).
package admission
