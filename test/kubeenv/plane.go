package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/berthfleet/berth/test/process"
)

// pollInterval is how often kubeenv looks at a cluster it waits for.
const pollInterval = 250 * time.Millisecond

// controlPlane is the processes of one cluster that kubeenv runs.
type controlPlane struct {
	name   string
	layout layout
	ports  ports
	binDir string
	nodes  int
	log    logr.Logger

	procs []*process.Process // running (or exited unexpectedly); nil when stopped
}

// start starts etcd and kube-apiserver, waits until the API server is ready, then starts
// the controllers, the scheduler and kwok, and registers the kwok nodes. It does not wait
// for the nodes to become Ready.
func (p *controlPlane) start(ctx context.Context, cs kubernetes.Interface) error {
	if p.procs != nil {
		return errors.New("already running")
	}
	if err := p.launch(etcd(p.name, p.layout, p.ports), kubeAPIServer(p.layout, p.ports)); err != nil {
		return err
	}
	if err := p.waitAPIServer(ctx, cs); err != nil {
		return err
	}
	err := p.launch(kubeControllerManager(p.layout), kubeScheduler(p.layout), kwok(p.layout, p.binDir))
	if err != nil {
		return err
	}
	return registerNodes(ctx, cs, p.name, p.nodes)
}

func (p *controlPlane) launch(components ...component) error {
	for _, c := range components {
		proc, err := process.Start(c.name, filepath.Join(p.binDir, c.name), p.layout.log(c.name), c.args...)
		if err != nil {
			return err
		}
		p.procs = append(p.procs, proc)
		p.log.V(1).Info("process started", "process", c.name, "pid", proc.Pid(), "log", proc.Log)
	}
	return nil
}

// waitAPIServer waits until the API server reports ready, which includes its
// connection to etcd and its bootstrap (RBAC roles, priority classes, system namespaces).
func (p *controlPlane) waitAPIServer(ctx context.Context, cs kubernetes.Interface) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if err := p.exited(); err != nil {
			return false, err
		}
		last = cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for kube-apiserver: %w (last: %v)", err, last)
	}
	return nil
}

// exited returns an error describing the first process that exited, if one did.
func (p *controlPlane) exited() error {
	for _, proc := range p.procs {
		if proc.Exited() {
			return proc.ExitError()
		}
	}
	return nil
}

// stop stops the processes and waits until all are gone: etcd last, since it lingers
// while it has clients. It reports whether anything was running.
func (p *controlPlane) stop(ctx context.Context) bool {
	running := p.procs != nil
	var etcdProcs, others []*process.Process
	for _, proc := range p.procs {
		if proc.Name == "etcd" {
			etcdProcs = append(etcdProcs, proc)
		} else {
			others = append(others, proc)
		}
	}
	stopAll(ctx, others)
	stopAll(ctx, etcdProcs)
	p.procs = nil
	return running
}

func stopAll(ctx context.Context, procs []*process.Process) {
	var wg sync.WaitGroup
	for _, proc := range procs {
		wg.Go(func() { proc.Stop(ctx) })
	}
	wg.Wait()
}

// pids returns the process IDs of the running processes.
func (p *controlPlane) pids() []int {
	var pids []int
	for _, proc := range p.procs {
		if !proc.Exited() {
			pids = append(pids, proc.Pid())
		}
	}
	return pids
}
