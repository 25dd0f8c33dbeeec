// Command load drives a running berth-leaseapi with many holders that each
// hold a lease of their own and renew it, and reports throughput and latency.
//
// With --rate, holders renew open-loop at rate/holders per second each and
// latency is measured from when a renew was due, not when it was sent, so a
// stalled server shows up in the percentiles instead of hiding behind fewer
// requests. With --rate 0 every holder renews back to back (closed loop),
// which measures the most the server can do.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"
)

type options struct {
	// kubeconfig switches to the baseline: each holder renews a
	// coordination.k8s.io Lease of its own directly on a kube-apiserver,
	// as client-go's leader election does (an update at the resourceVersion
	// last seen), instead of renewing through the lease API.
	kubeconfig string
	url        string
	tokenFile  string
	holders    int
	rate       float64
	duration   time.Duration
	warmup     time.Duration
	ttl        time.Duration
	namespace  string
	jsonOut    bool
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "http://127.0.0.1:8443", "lease API URL")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "baseline mode: renew Lease objects on this cluster's kube-apiserver directly")
	flag.StringVar(&o.tokenFile, "token-file", "", "bearer token file")
	flag.IntVar(&o.holders, "holders", 500, "concurrent holders, each with a lease of its own")
	flag.Float64Var(&o.rate, "rate", 5000, "total renews per second (0: closed loop, as fast as answered)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured time")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured time before it")
	flag.DurationVar(&o.ttl, "ttl", 30*time.Second, "lease TTL")
	flag.StringVar(&o.namespace, "namespace", "load", "namespace of the leases")
	flag.BoolVar(&o.jsonOut, "json", false, "print the result as JSON")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
	if o.jsonOut {
		_ = json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Println(res)
}

// Result is what one run measured.
type Result struct {
	Target     string  `json:"target"`
	Holders    int     `json:"holders"`
	TargetRate float64 `json:"targetRate"`
	Seconds    float64 `json:"seconds"`
	Renews     int     `json:"renews"`
	Errors     int     `json:"errors"`
	Lost       int     `json:"lost"`
	Throughput float64 `json:"throughput"`
	P50Ms      float64 `json:"p50Ms"`
	P90Ms      float64 `json:"p90Ms"`
	P99Ms      float64 `json:"p99Ms"`
	MaxMs      float64 `json:"maxMs"`
}

func (r Result) String() string {
	target := "closed loop"
	if r.TargetRate > 0 {
		target = fmt.Sprintf("target %.0f/s", r.TargetRate)
	}
	return fmt.Sprintf("%s: holders=%d %s: %d renews in %.1fs = %.0f/s, errors=%d lost=%d, latency p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms",
		r.Target, r.Holders, target, r.Renews, r.Seconds, r.Throughput, r.Errors, r.Lost, r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs)
}

func run(ctx context.Context, o options) (Result, error) {
	if o.holders < 1 || o.rate < 0 || o.duration <= 0 {
		return Result{}, fmt.Errorf("--holders must be positive, --rate not negative, --duration positive")
	}
	var (
		holders []renewer
		err     error
	)
	if o.kubeconfig != "" {
		holders, err = kubeHolders(ctx, o)
	} else {
		holders, err = leaseAPIHolders(ctx, o)
	}
	if err != nil {
		return Result{}, err
	}

	fmt.Fprintf(os.Stderr, "load: renewing for %s after %s of warm-up\n", o.duration, o.warmup)
	start := time.Now()
	measureFrom, end := start.Add(o.warmup), start.Add(o.warmup+o.duration)
	samples := make([][]time.Duration, o.holders)
	failures := make([][2]int, o.holders) // errors, lost
	var wg sync.WaitGroup
	for i := range o.holders {
		wg.Go(func() {
			samples[i], failures[i] = renewLoop(ctx, holders[i], o, start, measureFrom, end)
		})
	}
	wg.Wait()

	var all []time.Duration
	res := Result{Target: "leaseapi", Holders: o.holders, TargetRate: o.rate, Seconds: o.duration.Seconds()}
	if o.kubeconfig != "" {
		res.Target = "kube-apiserver Leases (client-go CAS)"
	}
	for i := range samples {
		all = append(all, samples[i]...)
		res.Errors += failures[i][0]
		res.Lost += failures[i][1]
	}
	slices.Sort(all)
	res.Renews = len(all)
	res.Throughput = float64(len(all)) / o.duration.Seconds()
	res.P50Ms, res.P90Ms, res.P99Ms = ms(percentile(all, .50)), ms(percentile(all, .90)), ms(percentile(all, .99))
	if len(all) > 0 {
		res.MaxMs = ms(all[len(all)-1])
	}
	return res, ctx.Err()
}

// renewLoop renews one holder's lease until end and returns the latencies of
// the successful renews that were due after measureFrom.
func renewLoop(ctx context.Context, h renewer, o options, start, measureFrom, end time.Time) ([]time.Duration, [2]int) {
	var (
		latencies []time.Duration
		failures  [2]int
		interval  time.Duration
		due       = start
	)
	if o.rate > 0 {
		interval = time.Duration(float64(o.holders) / o.rate * float64(time.Second))
		due = start.Add(time.Duration(rand.Int64N(int64(interval)))) // spread the holders out
	}
	for due.Before(end) && ctx.Err() == nil {
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		sent := time.Now()
		if o.rate == 0 {
			due = sent
		}
		held, err := h(ctx)
		took := time.Since(due)
		if !due.Before(measureFrom) {
			switch {
			case err != nil:
				failures[0]++
			case !held:
				failures[1]++
			default:
				latencies = append(latencies, took)
			}
		}
		due = due.Add(interval)
	}
	return latencies, failures
}

func holderName(i int) string { return fmt.Sprintf("holder-%04d", i) }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
