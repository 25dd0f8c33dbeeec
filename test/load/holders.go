package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berthfleet/berth/leaseapi/client"
)

// renewer renews one holder's leases once and reports how many it renewed
// and how many it lost.
type renewer func(ctx context.Context) (renewed, lost int, err error)

// outcome counts one lease's renewal.
func outcome(held bool) (renewed, lost int) {
	if held {
		return 1, 0
	}
	return 0, 1
}

// leaseAPIHolders acquires a lease per holder through the lease API.
func leaseAPIHolders(ctx context.Context, o options) ([]renewer, error) {
	c, err := client.New(client.Config{URL: o.url, TokenFile: o.tokenFile, MaxConnsPerHost: o.holders, RetryMax: -1})
	if err != nil {
		return nil, err
	}
	if err := c.Ready(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "load: %d holders acquiring their leases\n", o.holders)
	return prepare(o.holders, func(i int) (renewer, error) {
		name := holderName(i)
		res, err := c.Acquire(ctx, o.namespace, name, name, o.ttl)
		switch {
		case err != nil:
			return nil, err
		case !res.Acquired:
			return nil, fmt.Errorf("lease %s is held by %q: use another --namespace", name, res.Holder)
		}
		return func(ctx context.Context) (int, int, error) {
			r, err := c.Renew(ctx, o.namespace, name, name, res.FencingToken, o.ttl)
			renewed, lost := outcome(r.Acquired)
			return renewed, lost, err
		}, nil
	})
}

// batchHolders acquires o.batch leases per holder through the lease API;
// each renew is one client.RenewBatch of all of them.
func batchHolders(ctx context.Context, o options) ([]renewer, error) {
	c, err := client.New(client.Config{URL: o.url, TokenFile: o.tokenFile, MaxConnsPerHost: o.holders, RetryMax: -1})
	if err != nil {
		return nil, err
	}
	if err := c.Ready(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "load: %d holders acquiring %d leases each\n", o.holders, o.batch)
	return prepare(o.holders, func(i int) (renewer, error) {
		holder := holderName(i)
		renewals := make([]client.Renewal, o.batch)
		for j := range renewals {
			name := fmt.Sprintf("%s-%05d", holder, j)
			res, err := c.Acquire(ctx, o.namespace, name, holder, o.ttl)
			switch {
			case err != nil:
				return nil, err
			case !res.Acquired:
				return nil, fmt.Errorf("lease %s is held by %q: use another --namespace", name, res.Holder)
			}
			renewals[j] = client.Renewal{Namespace: o.namespace, Name: name, FencingToken: res.FencingToken, TTL: o.ttl}
		}
		return func(ctx context.Context) (renewed, lost int, err error) {
			results, err := c.RenewBatch(ctx, holder, renewals)
			for _, r := range results {
				rn, l := outcome(r.Acquired)
				renewed, lost = renewed+rn, lost+l
			}
			return renewed, lost, err
		}, nil
	})
}

// kubeHolders creates a Lease object per holder on a kube-apiserver; each
// renew is one update at the resourceVersion it last saw, the way client-go's
// leader election renews.
func kubeHolders(ctx context.Context, o options) ([]renewer, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100000, 100000 // measure the server, not client-side throttling
	c, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.namespace}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "load: %d holders creating their Lease objects\n", o.holders)
	leases := c.CoordinationV1().Leases(o.namespace)
	return prepare(o.holders, func(i int) (renewer, error) {
		name := holderName(i)
		ttl := int32(o.ttl / time.Second)
		now := metav1.NewMicroTime(time.Now())
		cur, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &ttl, AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) (int, int, error) {
			next := cur.DeepCopy()
			now := metav1.NewMicroTime(time.Now())
			next.Spec.RenewTime = &now
			updated, err := leases.Update(ctx, next, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				return 0, 1, nil
			}
			if err != nil {
				return 0, 0, err
			}
			cur = updated
			return 1, 0, nil
		}, nil
	})
}

// prepare builds n renewers concurrently.
func prepare(n int, build func(i int) (renewer, error)) ([]renewer, error) {
	out := make([]renewer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = build(i)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
