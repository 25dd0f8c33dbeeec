// Command load drives a running berth-leaseapi with many holders that each
// hold a lease of their own and renew it, and reports throughput and latency.
//
// With --rate, holders renew open-loop at rate/holders per second each and
// latency is measured from when a renew was due, not when it was sent, so a
// stalled server shows up in the percentiles instead of hiding behind fewer
// requests. With --rate 0 every holder renews back to back (closed loop),
// which measures the most the server can do.
//
// With --batch N every holder holds N leases and renews them all in one
// request (POST /v1alpha1/renewals, client.RenewBatch): throughput counts
// acknowledged renewals, latency is that of the batch requests, and --rate
// is in requests per second.
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

	"github.com/berthfleet/berth/leaseapi"
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
	batch      int
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
	flag.IntVar(&o.batch, "batch", 0, "leases per holder, renewed in one batched request (0: one lease, renewed alone)")
	flag.Float64Var(&o.rate, "rate", 5000, "total renew requests per second (0: closed loop, as fast as answered)")
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
//
// Renews counts acknowledged renewals and Throughput is their rate; with
// --batch, Requests counts the batch requests whose latencies are given.
type Result struct {
	Target     string  `json:"target"`
	Holders    int     `json:"holders"`
	Batch      int     `json:"batch,omitempty"`
	TargetRate float64 `json:"targetRate"`
	Seconds    float64 `json:"seconds"`
	Renews     int     `json:"renews"`
	Requests   int     `json:"requests"`
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
	batch := ""
	if r.Batch > 0 {
		batch = fmt.Sprintf(" batch=%d (%d requests)", r.Batch, r.Requests)
	}
	return fmt.Sprintf("%s: holders=%d%s %s: %d renews in %.1fs = %.0f/s, errors=%d lost=%d, latency p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms",
		r.Target, r.Holders, batch, target, r.Renews, r.Seconds, r.Throughput, r.Errors, r.Lost, r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs)
}

func run(ctx context.Context, o options) (Result, error) {
	if o.holders < 1 || o.rate < 0 || o.duration <= 0 || o.batch < 0 || o.batch > leaseapi.MaxBatchLeases {
		return Result{}, fmt.Errorf("--holders must be positive, --rate not negative, --duration positive, --batch between 0 and %d", leaseapi.MaxBatchLeases)
	}
	if o.batch > 0 && o.kubeconfig != "" {
		return Result{}, fmt.Errorf("--batch renews through the lease API; the baseline has no batches")
	}
	var (
		holders []renewer
		err     error
	)
	switch {
	case o.kubeconfig != "":
		holders, err = kubeHolders(ctx, o)
	case o.batch > 0:
		holders, err = batchHolders(ctx, o)
	default:
		holders, err = leaseAPIHolders(ctx, o)
	}
	if err != nil {
		return Result{}, err
	}

	fmt.Fprintf(os.Stderr, "load: renewing for %s after %s of warm-up\n", o.duration, o.warmup)
	start := time.Now()
	measureFrom, end := start.Add(o.warmup), start.Add(o.warmup+o.duration)
	samples := make([][]time.Duration, o.holders)
	counts := make([]counts, o.holders)
	var wg sync.WaitGroup
	for i := range o.holders {
		wg.Go(func() {
			samples[i], counts[i] = renewLoop(ctx, holders[i], o, start, measureFrom, end)
		})
	}
	wg.Wait()

	var all []time.Duration
	res := Result{Target: "leaseapi", Holders: o.holders, Batch: o.batch, TargetRate: o.rate, Seconds: o.duration.Seconds()}
	if o.kubeconfig != "" {
		res.Target = "kube-apiserver Leases (client-go CAS)"
	}
	for i := range samples {
		all = append(all, samples[i]...)
		res.Renews += counts[i].renewed
		res.Errors += counts[i].errors
		res.Lost += counts[i].lost
	}
	slices.Sort(all)
	res.Requests = len(all)
	res.Throughput = float64(res.Renews) / o.duration.Seconds()
	res.P50Ms, res.P90Ms, res.P99Ms = ms(percentile(all, .50)), ms(percentile(all, .90)), ms(percentile(all, .99))
	if len(all) > 0 {
		res.MaxMs = ms(all[len(all)-1])
	}
	return res, ctx.Err()
}

// counts are what one holder's measured requests did: leases renewed and
// lost, and requests that failed.
type counts struct{ renewed, lost, errors int }

// renewLoop renews one holder's leases until end and returns the latencies
// of the requests that were due after measureFrom and renewed every lease
// they named, and what all of those requests did.
func renewLoop(ctx context.Context, h renewer, o options, start, measureFrom, end time.Time) ([]time.Duration, counts) {
	var (
		latencies []time.Duration
		c         counts
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
		renewed, lost, err := h(ctx)
		took := time.Since(due)
		if !due.Before(measureFrom) {
			switch {
			case err != nil:
				c.errors++
			default:
				c.renewed += renewed
				c.lost += lost
				if lost == 0 {
					latencies = append(latencies, took)
				}
			}
		}
		due = due.Add(interval)
	}
	return latencies, c
}

func holderName(i int) string { return fmt.Sprintf("holder-%04d", i) }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
