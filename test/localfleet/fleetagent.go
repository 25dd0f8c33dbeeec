package localfleet

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthfleet/berth/test/process"
)

// FleetAgent is one berth-agent in fleet mode serving every member cluster
// from one process: Dir holds <cluster>.kubeconfig and <cluster>.token for
// each cluster it serves.
type FleetAgent struct {
	*process.Process
	Dir   string
	fleet *Fleet
}

// StartFleetAgent runs one berth-agent with --fleet-kubeconfig-dir over all
// member clusters. Start it on a fleet started with Options.NoAgents.
func (f *Fleet) StartFleetAgent() (*FleetAgent, error) {
	dir := filepath.Join(f.opts.WorkDir, "fleet-agent")
	kubeconfigs := filepath.Join(dir, "kubeconfigs")
	if err := os.MkdirAll(kubeconfigs, 0o755); err != nil {
		return nil, err
	}
	a := &FleetAgent{Dir: kubeconfigs, fleet: f}
	for _, m := range f.Members {
		if err := a.Join(m.Name); err != nil {
			return nil, err
		}
	}
	args := []string{
		"--fleet-kubeconfig-dir", kubeconfigs,
		"--lease-api-url", f.LeaseAPI.URL,
		"--managed-workloads",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
		"--cluster-heartbeat-interval", f.opts.Workload.ClusterHeartbeat.String(),
		"-v", "1",
	}
	p, err := process.Start("berth-agent", filepath.Join(f.opts.BinDir, "berth-agent"), filepath.Join(dir, fmt.Sprintf("berth-agent-%d.log", time.Now().UnixNano())),
		append(args, f.opts.AgentArgs...)...)
	if err != nil {
		return nil, err
	}
	a.Process = p
	f.fleetAgent = a
	return a, nil
}

// Join writes the member's token and kubeconfig into the agent's folder
// (the kubeconfig last, as an operator adding a cluster would), so that the
// agent serves the cluster.
func (a *FleetAgent) Join(name string) error {
	m := a.fleet.Member(name)
	if m == nil {
		return fmt.Errorf("no member %s", name)
	}
	token, err := os.ReadFile(a.fleet.LeaseAPI.TokenFiles[name])
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(a.Dir, name+".token"), token, 0o600); err != nil {
		return err
	}
	kubeconfig, err := os.ReadFile(m.agentKubeconfig()) // the service account user's, as per-cluster agents use
	if err != nil {
		return err
	}
	// Written aside and renamed, so that the agent never reads half a file.
	tmp := filepath.Join(a.Dir, "."+name+".kubeconfig")
	if err := os.WriteFile(tmp, kubeconfig, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(a.Dir, name+".kubeconfig"))
}

// Leave removes the member's kubeconfig from the agent's folder, so that
// the agent stops serving the cluster.
func (a *FleetAgent) Leave(name string) error {
	return os.Remove(filepath.Join(a.Dir, name+".kubeconfig"))
}

// FleetAgent returns the fleet-mode agent, or nil if none was started.
func (f *Fleet) FleetAgent() *FleetAgent { return f.fleetAgent }
