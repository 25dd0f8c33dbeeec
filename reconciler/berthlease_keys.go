package reconciler

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	berthv1alpha1 "github.com/berthfleet/berth/api/v1alpha1"
)

// One lease key, one term. With --cluster-id every BerthLease of a cluster
// acts as the same holder, so two BerthLeases of one namespace that name the
// same lease (a rename: exporter-v2 with leaseName exporter beside
// exporter) would share one term with one token, and a release by one would
// free it while the other's Pods run. So only the oldest BerthLease that
// names a lease acts on it (the others are Shadowed and wait), and a release
// happens only when a read of the API server finds nothing else that the
// term may cover: no other BerthLease naming the lease, and no running Pod
// of a BerthLease that is gone.

// IndexLeaseName is the cache index of BerthLeases by the lease they name
// (spec.leaseName or the object's name).
const IndexLeaseName = "berth.skaphos.io/lease-name"

// IndexBerthLeases adds IndexLeaseName to a cache (a manager's, or every
// cluster's of a multicluster manager).
func IndexBerthLeases(ctx context.Context, indexer ctrlclient.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &berthv1alpha1.BerthLease{}, IndexLeaseName, func(o ctrlclient.Object) []string {
		bl, ok := o.(*berthv1alpha1.BerthLease)
		if !ok {
			return nil
		}
		return []string{bl.EffectiveLeaseName()}
	}); err != nil {
		return fmt.Errorf("index BerthLeases by lease name: %w", err)
	}
	return nil
}

// olderThan orders BerthLeases that name the same lease: the one made first
// acts on it; the name breaks ties within a second.
func olderThan(a, b *berthv1alpha1.BerthLease) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// shadowedBy returns the name of an older BerthLease of bl's namespace that
// names the same lease, or "" when bl is the oldest. It reads the cache: a
// BerthLease the cache has not seen yet is at worst another holder of the
// same term, and releases are checked against the API server.
func (r *BerthLeaseReconciler) shadowedBy(ctx context.Context, bl *berthv1alpha1.BerthLease) (string, error) {
	list := &berthv1alpha1.BerthLeaseList{}
	if err := r.List(ctx, list, ctrlclient.InNamespace(bl.Namespace), ctrlclient.MatchingFields{IndexLeaseName: bl.EffectiveLeaseName()}); err != nil {
		return "", fmt.Errorf("list BerthLeases naming lease %s: %w", bl.EffectiveLeaseName(), err)
	}
	oldest := bl
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID != bl.UID && o.EffectiveLeaseName() == bl.EffectiveLeaseName() && olderThan(o, oldest) {
			oldest = o
		}
	}
	if oldest == bl {
		return "", nil
	}
	return oldest.Name, nil
}

// checkRelease is read just before a release, from the API server: it sets
// KeyShared when another BerthLease of the namespace names the same lease,
// and counts as running the Pods of BerthLeases that are gone (their
// finalizer was removed, or they were made anew under another UID), which
// the term may still cover. Pods are listed before BerthLeases, so a Pod
// whose BerthLease exists is never taken for an orphan.
func (r *BerthLeaseReconciler) checkRelease(ctx context.Context, bl *berthv1alpha1.BerthLease, p *observation) error {
	ctx, cancel := context.WithTimeout(ctx, r.CallTimeout)
	defer cancel()
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, ctrlclient.InNamespace(bl.Namespace), ctrlclient.HasLabels{ManagedLease}); err != nil {
		return fmt.Errorf("list the namespace's managed Pods: %w", err)
	}
	list := &berthv1alpha1.BerthLeaseList{}
	if err := r.APIReader.List(ctx, list, ctrlclient.InNamespace(bl.Namespace)); err != nil {
		return fmt.Errorf("list the namespace's BerthLeases: %w", err)
	}
	uids := make(map[string]string, len(list.Items))
	shared := map[string]bool{}
	for i := range list.Items {
		o := &list.Items[i]
		uids[o.Name] = string(o.UID)
		if o.UID != bl.UID && o.EffectiveLeaseName() == bl.EffectiveLeaseName() {
			p.facts.KeyShared = true
			p.sharedWith = o.Name
			shared[o.Name] = true
		}
	}
	for _, pod := range pods.Items {
		owner := pod.Labels[ManagedLease]
		if owner == bl.Name || gated(&pod) || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue // ours are counted already
		}
		uid, exists := uids[owner]
		orphan := !exists || (pod.Labels[ManagedUID] != "" && pod.Labels[ManagedUID] != uid)
		// A revoked term, or one whose release may still land, is released
		// even though another BerthLease names the lease (nobody can rely
		// on it), once their Pods are gone too.
		if orphan || ((p.facts.Revoked || p.facts.ReleaseSent) && shared[owner]) {
			p.running = append(p.running, pod)
			p.facts.RunningPods++
		}
	}
	return nil
}
