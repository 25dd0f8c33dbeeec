// Package fencerun plays the kubelets of one cluster for fenced Pods (spec.podFencing Exec):
// kwok runs no containers, so this runs berth-fence as a local process for each wrapped
// container of each Pod bound in the cluster, the way a kubelet would run the container's
// command:
//
//   - the projected service account token comes from the TokenRequest API, bound to the
//     Pod, with the audience the Pod's volume asks for; the term annotations are written
//     where the downward API would put them, and refreshed while the API server answers;
//   - the container's environment is kept, with the volume paths rewritten to local
//     folders and the lease API's address replaced by the one given (a proxy a test can
//     cut);
//   - the wrapped command's tail (the workload) is replaced by Options.Child, which runs as
//     berth-fence's child and records each start in a file;
//   - a berth-fence that exits is started again a second later (restartPolicy Always), as
//     long as the Pod was last seen bound; a Pod seen deleted has its berth-fence stopped
//     (SIGTERM, SIGKILL after a grace period).
//
// When the cluster's API server is gone, everything keeps running as it was, as kubelets
// keep their containers running without their control plane.
//
// Every start and exit is recorded (Events), so that a test can judge from both clusters'
// runners when each cluster's workload ran.
package fencerun

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/berthfleet/berth/admission"
	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// Options says what to run where.
type Options struct {
	// Cluster is the cluster's name in events.
	Cluster string
	Client  kubernetes.Interface
	// Namespace holds the fenced Pods.
	Namespace string
	// Fence is the berth-fence binary.
	Fence string
	// Dir receives the Pods' volumes, logs and start records.
	Dir string
	// LeaseAPIURL replaces the lease API address in the Pods' environment.
	LeaseAPIURL string
	// Child is the workload each container runs under berth-fence; it is told the file to
	// record its start in by the environment variable StartsFileEnv.
	Child []string
	// Grace is how long a berth-fence of a deleted Pod may take to exit after SIGTERM.
	Grace time.Duration
	Log   logr.Logger
}

// StartsFileEnv names the file Child appends one line to when it starts:
// "<unix nanoseconds> <fencing token>".
const StartsFileEnv = "FENCERUN_STARTS"

// DefaultChild records its start, then runs until killed, ignoring SIGTERM, so that
// berth-fence has to SIGKILL it: the slowest way a workload can stop.
var DefaultChild = []string{"/bin/sh", "-c", `echo "$(date +%s%N) $BERTH_FENCING_TOKEN" >> "$` + StartsFileEnv + `"; trap '' TERM; while :; do sleep 0.05; done`}

// Event is a start or an exit of berth-fence, or a start of its child.
type Event struct {
	// Pod is the Pod's name and the first 8 characters of its UID.
	Cluster, Pod, Container string
	Kind                    EventKind
	At                      time.Time
	// Code is berth-fence's exit code (Exited).
	Code int
	// Token is the fencing token the child was started with (ChildStarted).
	Token int32
}

// EventKind says what an Event is.
type EventKind string

// Kinds of Event.
const (
	FenceStarted EventKind = "FenceStarted"
	// Exited: berth-fence exited, so its child had exited before: its time bounds the
	// child's end from above.
	Exited       EventKind = "Exited"
	ChildStarted EventKind = "ChildStarted"
)

// Runner runs the fenced containers of one cluster.
type Runner struct {
	opts Options

	mu         sync.Mutex
	containers map[string]*container // by "<pod uid>/<container>"
	events     []Event
	wg         sync.WaitGroup
	cancel     context.CancelFunc
}

// Start runs until Stop.
func Start(ctx context.Context, opts Options) (*Runner, error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	if opts.Child == nil {
		opts.Child = DefaultChild
	}
	if opts.Grace == 0 {
		opts.Grace = 3 * time.Second
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Runner{opts: opts, containers: map[string]*container{}, cancel: cancel}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for ctx.Err() == nil {
			r.sync(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return r, nil
}

// sync starts berth-fence for the wrapped containers of bound Pods it does not run yet,
// refreshes their term files, and stops those of Pods that are gone or being deleted.
// When the Pods cannot be listed it changes nothing.
func (r *Runner) sync(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	pods, err := r.opts.Client.CoreV1().Pods(r.opts.Namespace).List(lctx, metav1.ListOptions{LabelSelector: berthv1alpha1.ManagedLeaseLabel})
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || !slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool {
			return c.Name == admission.FenceInitContainer
		}) {
			continue
		}
		for _, c := range pod.Spec.Containers {
			key := string(pod.UID) + "/" + c.Name
			seen[key] = true
			r.mu.Lock()
			ctr, ok := r.containers[key]
			r.mu.Unlock()
			if !ok {
				var err error
				if ctr, err = r.newContainer(ctx, pod, c); err != nil {
					r.opts.Log.Error(err, "cannot run container", "pod", pod.Name, "container", c.Name)
					continue
				}
				r.mu.Lock()
				r.containers[key] = ctr
				r.mu.Unlock()
				r.wg.Add(1)
				go func() { defer r.wg.Done(); ctr.run(r) }()
			}
			ctr.writeTerm(pod)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, ctr := range r.containers {
		if !seen[key] {
			delete(r.containers, key)
			go ctr.stop(r.opts.Grace)
		}
	}
}

// Stop ends every berth-fence (SIGKILL) and waits for the runner.
func (r *Runner) Stop() {
	r.cancel()
	r.mu.Lock()
	for _, ctr := range r.containers {
		ctr.stop(0)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Events returns what happened so far, child starts included, in no particular order.
func (r *Runner) Events() []Event {
	r.mu.Lock()
	events := slices.Clone(r.events)
	r.mu.Unlock()
	starts, _ := filepath.Glob(filepath.Join(r.opts.Dir, "*", "*", "starts"))
	for _, f := range starts {
		events = append(events, childStarts(r.opts.Cluster, f)...)
	}
	return events
}

// Running counts the berth-fence processes running now.
func (r *Runner) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.containers {
		if c.running() {
			n++
		}
	}
	return n
}

func (r *Runner) record(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// container is one wrapped container of one Pod: berth-fence, restarted when it exits.
type container struct {
	pod, name string
	dir       string
	args      []string
	env       []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	stopped bool
	done    chan struct{} // closed when run returns
}

func (r *Runner) newContainer(ctx context.Context, pod *corev1.Pod, c corev1.Container) (*container, error) {
	if len(c.Command) < 4 || c.Command[0] != admission.FenceBinary {
		return nil, fmt.Errorf("container %s is not wrapped in berth-fence: %v", c.Name, c.Command)
	}
	// The Pod's folder names it as Event.Pod does: its name and the start of its UID.
	dir := filepath.Join(r.opts.Dir, pod.Name+"-"+string(pod.UID)[:8], c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := r.writeToken(ctx, pod, filepath.Join(dir, "token")); err != nil {
		return nil, err
	}
	paths := map[string]string{
		admission.EnvFenceTokenFile:   filepath.Join(dir, "token"),
		admission.EnvFenceHolderFile:  filepath.Join(dir, "holder"),
		admission.EnvFenceFencingFile: filepath.Join(dir, "fencing-token"),
		admission.EnvLeaseAPIURL:      r.opts.LeaseAPIURL,
	}
	env := []string{"PATH=/usr/bin:/bin", StartsFileEnv + "=" + filepath.Join(dir, "starts")}
	for _, e := range c.Env {
		if v, ok := paths[e.Name]; ok {
			env = append(env, e.Name+"="+v)
			continue
		}
		env = append(env, e.Name+"="+e.Value)
	}
	return &container{
		pod: filepath.Base(filepath.Dir(dir)), name: c.Name, dir: dir,
		args: append(append([]string{}, c.Command[1:3]...), r.opts.Child...),
		env:  env, done: make(chan struct{}),
	}, nil
}

// writeToken asks the TokenRequest API for the Pod's projected service account token, as
// the kubelet does for the Pod's berth-fence volume.
func (r *Runner) writeToken(ctx context.Context, pod *corev1.Pod, path string) error {
	var audience string
	var seconds *int64
	for _, v := range pod.Spec.Volumes {
		if v.Name == admission.FenceVolume && v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken != nil {
					audience, seconds = s.ServiceAccountToken.Audience, s.ServiceAccountToken.ExpirationSeconds
				}
			}
		}
	}
	if audience == "" {
		return fmt.Errorf("pod %s has no projected token in volume %s", pod.Name, admission.FenceVolume)
	}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tr, err := r.opts.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(tctx, cmpOr(pod.Spec.ServiceAccountName, "default"), &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{audience}, ExpirationSeconds: ptr.To(ptr.Deref(seconds, 3600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for pod %s: %w", pod.Name, err)
	}
	return os.WriteFile(path, []byte(tr.Status.Token), 0o600)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// writeTerm writes the Pod's term annotations where the downward API would.
func (c *container) writeTerm(pod *corev1.Pod) {
	for file, key := range map[string]string{"holder": berthv1alpha1.HolderAnnotation, "fencing-token": berthv1alpha1.FencingTokenAnnotation} {
		path := filepath.Join(c.dir, file)
		if old, _ := os.ReadFile(path); string(old) == pod.Annotations[key] && old != nil {
			continue
		}
		tmp := path + ".tmp"
		if os.WriteFile(tmp, []byte(pod.Annotations[key]), 0o644) == nil {
			_ = os.Rename(tmp, path)
		}
	}
}

// run starts berth-fence, and again a second after each exit, until stopped.
func (c *container) run(r *Runner) {
	defer close(c.done)
	for n := 0; ; n++ {
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return
		}
		log, err := os.OpenFile(filepath.Join(c.dir, "berth-fence.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			c.mu.Unlock()
			r.opts.Log.Error(err, "open log")
			return
		}
		cmd := exec.Command(r.opts.Fence, c.args...)
		cmd.Env, cmd.Stdout, cmd.Stderr = c.env, log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		err = cmd.Start()
		c.cmd = cmd
		c.mu.Unlock()
		if err != nil {
			_ = log.Close()
			r.opts.Log.Error(err, "start berth-fence")
			return
		}
		r.record(Event{Cluster: r.opts.Cluster, Pod: c.pod, Container: c.name, Kind: FenceStarted, At: time.Now()})
		err = cmd.Wait()
		exited := time.Now()
		_ = log.Close()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		r.record(Event{Cluster: r.opts.Cluster, Pod: c.pod, Container: c.name, Kind: Exited, At: exited, Code: code})
		time.Sleep(time.Second)
	}
}

func (c *container) running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cmd != nil && c.cmd.ProcessState == nil && !c.stopped
}

// stop ends berth-fence as a kubelet ends a deleted Pod's container: SIGTERM, then SIGKILL
// after grace, and starts it no more.
func (c *container) stop(grace time.Duration) {
	c.mu.Lock()
	c.stopped = true
	cmd := c.cmd
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		// A kubelet kills the whole container; here the child has a process group of
		// its own, so it is killed by name as well.
		for _, child := range children(cmd.Process.Pid) {
			_ = syscall.Kill(-child, syscall.SIGKILL)
			_ = syscall.Kill(child, syscall.SIGKILL)
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// children lists the processes pid started (Linux's /proc/<pid>/task/*/children).
func children(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(field); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// childStarts reads a starts file.
func childStarts(cluster, path string) []Event {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	dir := filepath.Dir(path)
	pod, ctr := filepath.Base(filepath.Dir(dir)), filepath.Base(dir)
	var out []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		ns, err1 := strconv.ParseInt(fields[0], 10, 64)
		tok, err2 := strconv.ParseInt(fields[1], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Event{Cluster: cluster, Pod: pod, Container: ctr, Kind: ChildStarted, At: time.Unix(0, ns), Token: int32(tok)})
	}
	return out
}

// LogTails returns the end of each berth-fence's log, for a failing test's report.
func (r *Runner) LogTails(lines int) string {
	logs, _ := filepath.Glob(filepath.Join(r.opts.Dir, "*", "*", "berth-fence.log"))
	var b strings.Builder
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(&b, "%s:\n%s\n", l, strings.Join(all[max(0, len(all)-lines):], "\n"))
	}
	return b.String()
}
