package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berthfleet/berth/test/builders"
	"github.com/berthfleet/berth/test/localfleet"
)

const (
	// settleInterval is how often convergence and settling poll.
	settleInterval = 500 * time.Millisecond
	// moveInterval is how often a move (kill, cordon) polls the lease API.
	moveInterval = 250 * time.Millisecond
	// progressEvery is how often a long phase prints where it is.
	progressEvery = 5 * time.Second
)

// createAll creates n BerthLeases in every cluster of f at once, through a
// client with a high rate limit and cfg.creators goroutines per cluster, and
// returns how long it took until the last one existed in every cluster.
func createAll(ctx context.Context, f *localfleet.Fleet, cfg config, n int) (time.Duration, error) {
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for _, m := range f.Members {
		g.Go(func() error { return createIn(gctx, m, cfg, n) })
	}
	err := g.Wait()
	return time.Since(start), err
}

func createIn(ctx context.Context, m *localfleet.Member, cfg config, n int) error {
	rc := m.Cluster.RESTConfig()
	rc.QPS, rc.Burst = 2000, 4000
	cl, err := ctrlclient.New(rc, ctrlclient.Options{Scheme: builders.Scheme})
	if err != nil {
		return err
	}
	for i := range min(cfg.namespaces, n) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaceOf(i, cfg.namespaces)}}
		if err := cl.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: create namespace %s: %w", m.Name, ns.Name, err)
		}
	}
	ttl, heartbeat := int32(cfg.ttl/time.Second), int32(cfg.heartbeat/time.Second)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cfg.creators)
	for i := range n {
		g.Go(func() error {
			bl := builders.BerthLease(namespaceOf(i, cfg.namespaces), leaseName(i)).TTL(ttl).Heartbeat(heartbeat).Obj()
			// A loaded API server may time out or throttle; try again
			// unless the object is there or was refused for what it is.
			err := retry.OnError(retry.DefaultBackoff, func(err error) bool {
				return !apierrors.IsAlreadyExists(err) && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err)
			}, func() error { return cl.Create(gctx, bl.DeepCopy()) })
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("%s: create BerthLease %s/%s: %w", m.Name, bl.Namespace, bl.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// converge starts the agents and waits until every lease is held at the
// lease API and every cluster's status agrees with it.
func (c *cell) converge(ctx context.Context) (convergence, error) {
	var conv convergence
	c.say("starting the agents")
	t0 := time.Now()
	if err := c.fleet.StartAgents(ctx); err != nil {
		return conv, fmt.Errorf("start the agents: %w", err)
	}
	// The agents' counters start with them: the traffic of the whole
	// convergence is their values at its end.
	w, err := c.begin(ctx, false)
	if err != nil {
		return conv, err
	}
	want := len(c.keys)
	lastProgress := time.Now()
	var a agreement
	var listErrs int
	for {
		elapsed := time.Since(t0)
		leases, err := c.leases.list(ctx, nil)
		if err != nil {
			if ctx.Err() != nil {
				return conv, ctx.Err()
			}
			listErrs++
		} else {
			a = c.status.agreeWith(c.keys, leases)
			if !conv.AllHeld.Done && a.Held == want {
				conv.AllHeld = done(elapsed, want)
				c.say("converge: every lease held at the lease API after %.1fs", elapsed.Seconds())
			}
			if a.Right == want {
				conv.StatusesRight = done(elapsed, want)
				c.say("converge: every status agrees after %.1fs", elapsed.Seconds())
				break
			}
		}
		if elapsed > c.cfg.phaseTimeout {
			if !conv.AllHeld.Done {
				conv.AllHeld = notDone(c.cfg.phaseTimeout, a.Held, want)
			}
			conv.StatusesRight = notDone(c.cfg.phaseTimeout, a.Right, want)
			c.say("converge: %s; waiting statuses %d of %d", conv.StatusesRight, a.Waiting, a.WantWaiting)
			break
		}
		if time.Since(lastProgress) >= progressEvery {
			lastProgress = time.Now()
			c.say("converge: held %d/%d, waiting statuses %d/%d, every status right %d/%d (list errors %d)",
				a.Held, want, a.Waiting, a.WantWaiting, a.Right, want, listErrs)
		}
		if err := sleep(ctx, settleInterval); err != nil {
			return conv, err
		}
	}
	conv.Held, conv.Waiting, conv.WantWaiting = a.Held, a.Waiting, a.WantWaiting
	conv.Traffic, err = w.end(ctx)
	return conv, err
}

// steadyState measures the window after convergence.
func (c *cell) steadyState(ctx context.Context) (*figures, error) {
	c.say("steady state: measuring for %s", c.cfg.window)
	w, err := c.begin(ctx, true)
	if err != nil {
		return nil, err
	}
	end := time.Now().Add(c.cfg.window)
	for time.Now().Before(end) {
		if err := sleep(ctx, min(10*time.Second, time.Until(end))); err != nil {
			return nil, err
		}
		c.say("steady state: %.0fs left; %s", max(time.Until(end), 0).Seconds(), w.progress())
	}
	f, err := w.end(ctx)
	if err != nil {
		return nil, err
	}
	leases, err := c.leases.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	f.HeldBy = map[string]int{}
	for _, k := range c.keys {
		if h := leases[k]; h != "" {
			f.HeldBy[h]++
		}
	}
	c.say("steady state: lease API %.1f req/s, %.3f cores; missed renewals: %g self-fences, %g lost (agents), %g lost (lease API)",
		sumValues(f.LeaseAPIRoutes), f.LeaseAPI.CPU, f.SelfFences, f.AgentLost, f.LostRenewals)
	return &f, nil
}

// killHolder kills the agent of the cluster that holds the most leases and
// waits until each of them is held by another cluster.
func (c *cell) killHolder(ctx context.Context) (move, error) {
	leases, err := c.leases.list(ctx, nil)
	if err != nil {
		return move{}, err
	}
	victim, keys := mostHeld(c.keys, leases)
	m := c.fleet.Member(victim)
	if m == nil {
		return move{}, fmt.Errorf("no member %q holds leases", victim)
	}
	c.say("kill: SIGKILL the agent of %s, which holds %d leases", victim, len(keys))
	t0 := time.Now()
	m.StopAgent()
	return c.awaitMoves(ctx, "kill", victim, keys, t0)
}

// restartAgent starts cluster's agent again and waits until every status
// agrees with the lease API once more.
func (c *cell) restartAgent(ctx context.Context, cluster string) (outcome, error) {
	c.say("restart: starting the agent of %s again", cluster)
	t0 := time.Now()
	if err := c.fleet.Member(cluster).StartAgent(cluster); err != nil {
		return outcome{}, err
	}
	want := len(c.keys)
	lastProgress := time.Now()
	var a agreement
	for {
		elapsed := time.Since(t0)
		if leases, err := c.leases.list(ctx, nil); err == nil {
			a = c.status.agreeWith(c.keys, leases)
			if a.Right == want {
				c.say("restart: every status agrees after %.1fs", elapsed.Seconds())
				return done(elapsed, want), nil
			}
		}
		if elapsed > c.cfg.phaseTimeout {
			o := notDone(c.cfg.phaseTimeout, a.Right, want)
			c.say("restart: %s", o)
			return o, nil
		}
		if time.Since(lastProgress) >= progressEvery {
			lastProgress = time.Now()
			c.say("restart: held %d/%d, waiting statuses %d/%d, every status right %d/%d", a.Held, want, a.Waiting, a.WantWaiting, a.Right, want)
		}
		if err := sleep(ctx, settleInterval); err != nil {
			return outcome{}, err
		}
	}
}

// cordonHolder cordons the cluster that holds the most leases and waits
// until each of them is held by another cluster.
func (c *cell) cordonHolder(ctx context.Context) (move, error) {
	leases, err := c.leases.list(ctx, nil)
	if err != nil {
		return move{}, err
	}
	victim, keys := mostHeld(c.keys, leases)
	c.say("cordon: cordoning %s, which holds %d leases", victim, len(keys))
	t0 := time.Now()
	if _, err := c.fleet.LeaseAPI.Admin.Cordon(ctx, victim); err != nil {
		return move{}, err
	}
	return c.awaitMoves(ctx, "cordon", victim, keys, t0)
}

// awaitMoves polls the lease API until every one of keys is held by a
// cluster other than from, stamping each with when its page was read.
func (c *cell) awaitMoves(ctx context.Context, phase, from string, keys []string, t0 time.Time) (move, error) {
	mv := move{Cluster: from}
	pending := map[string]bool{}
	for _, k := range keys {
		pending[k] = true
	}
	want := len(keys)
	lastProgress := time.Now()
	for len(pending) > 0 {
		if time.Since(t0) > c.cfg.phaseTimeout {
			mv.outcome = notDone(c.cfg.phaseTimeout, want-len(pending), want)
			c.say("%s: %s", phase, mv.outcome)
			return mv, nil
		}
		_, err := c.leases.list(ctx, func(page holders) {
			at := time.Since(t0).Seconds()
			for k, h := range page {
				if pending[k] && h != "" && h != from {
					delete(pending, k)
					if mv.FirstSeconds == 0 {
						mv.FirstSeconds = at
					}
					mv.LastSeconds = at
				}
			}
		})
		if err != nil && ctx.Err() != nil {
			return mv, ctx.Err()
		}
		if time.Since(lastProgress) >= progressEvery {
			lastProgress = time.Now()
			c.say("%s: moved %d/%d (first after %.1fs)", phase, want-len(pending), want, mv.FirstSeconds)
		}
		if len(pending) > 0 {
			if err := sleep(ctx, moveInterval); err != nil {
				return mv, err
			}
		}
	}
	mv.outcome = outcome{Done: true, Seconds: mv.LastSeconds, Got: want, Want: want}
	c.say("%s: every lease of %s moved: first after %.1fs, last after %.1fs", phase, from, mv.FirstSeconds, mv.LastSeconds)
	return mv, nil
}

// window measures the fleet's processes between begin and end.
type window struct {
	c      *cell
	span   *span
	api    snapshot
	agents map[string]snapshot
	// agentURLs are the metrics endpoints of the agents measured.
	agentURLs map[string]string
}

// begin starts a window; without scrapeAgents the agents' counters count
// from zero (they have just started).
func (c *cell) begin(ctx context.Context, scrapeAgents bool) (*window, error) {
	w := &window{c: c, agents: map[string]snapshot{}, agentURLs: map[string]string{}}
	var err error
	if w.api, err = scrape(ctx, c.fleet.LeaseAPI.MetricsURL); err != nil {
		return nil, err
	}
	for _, m := range c.fleet.Members {
		if m.Agent == nil || m.Agent.Exited() {
			continue
		}
		w.agentURLs[m.Name] = m.MetricsURL
		w.agents[m.Name] = snapshot{}
		if scrapeAgents {
			if w.agents[m.Name], err = scrape(ctx, m.MetricsURL); err != nil {
				return nil, err
			}
		}
	}
	w.span = beginSpan(c.pids())
	return w, nil
}

// progress says what the window has seen so far.
func (w *window) progress() string {
	w.span.mu.Lock()
	defer w.span.mu.Unlock()
	var parts []string
	for _, name := range sortedKeys(w.span.use) {
		parts = append(parts, fmt.Sprintf("%s max RSS %.0f MiB", name, mib(w.span.use[name].MaxRSS)))
	}
	return strings.Join(parts, ", ")
}

// end closes the window and computes its figures.
func (w *window) end(ctx context.Context) (figures, error) {
	use, elapsed := w.span.end()
	f := figures{Seconds: elapsed.Seconds(), LeaseAPI: use[leaseAPIProcess], Agents: map[string]agentFigures{}}
	api, err := scrape(ctx, w.c.fleet.LeaseAPI.MetricsURL)
	if err != nil {
		return f, err
	}
	f.LeaseAPIRoutes = rates(api.by(metricRequests, "route"), w.api.by(metricRequests, "route"), elapsed)
	lost := labelIs("outcome", outcomeLost)
	f.LostRenewals = api.sum(metricOutcomes, lost) - w.api.sum(metricOutcomes, lost)
	for name, url := range w.agentURLs {
		now, err := scrape(ctx, url)
		if err != nil {
			return f, err
		}
		before := w.agents[name]
		writes, reads := labelIs("method", writeMethods...), labelIs("method", "GET")
		fences := now.sum(metricSelfFences, nil) - before.sum(metricSelfFences, nil)
		lostT := labelIs("reason", transitionLost, transitionSelfFence)
		lostN := now.sum(metricTransitions, lostT) - before.sum(metricTransitions, lostT)
		f.SelfFences += fences
		f.AgentLost += lostN
		f.Agents[name] = agentFigures{
			usage:  use[agentProcess(name)],
			Writes: (now.sum(metricRESTRequests, writes) - before.sum(metricRESTRequests, writes)) / elapsed.Seconds(),
			Reads:  (now.sum(metricRESTRequests, reads) - before.sum(metricRESTRequests, reads)) / elapsed.Seconds(),
		}
	}
	return f, nil
}

// rates turns two readings of counters into per-second rates, leaving out
// the counters that did not move.
func rates(now, before map[string]float64, elapsed time.Duration) map[string]float64 {
	out := map[string]float64{}
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			out[k] = d / elapsed.Seconds()
		}
	}
	return out
}

func sumValues(m map[string]float64) float64 {
	var total float64
	for _, v := range m {
		total += v
	}
	return total
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
