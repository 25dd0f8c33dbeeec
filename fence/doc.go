// Package fence keeps a lease's local deadline inside a managed Pod: it is
// the library of berth-fence, the wrapper that admission makes each managed
// container's command. The supervisor starts the workload only after the
// lease API has confirmed that the Pod's holder holds the lease with the
// Pod's fencing token, keeps confirming while it runs, and stops the
// workload's whole process group (SIGTERM, then SIGKILL) before the term
// could have passed to another cluster, whether or not the cluster's agent
// or control plane are alive.
//
// It owns the deadline arithmetic (Deadline, a pure function), the
// supervisor's state machine (Supervisor, against a small Confirmer, a
// Clock and a Starter so that it runs on fakes in tests), the child process
// (ProcessStarter: its own process group, reaping as PID 1), the CLOCK_BOOTTIME
// clock, the environment contract (EnvConfig, ChildEnv), the Pod's identity
// files and the install step. It does not talk HTTP itself (the lease API's
// client does) and it never imports Kubernetes or controller-runtime, so the
// binary stays small and static. docs/fencing.md states the contract and
// argues the bound.
package fence
