package kubernetes

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
)

// Labels and annotations of the objects this store owns.
const (
	labelKind         = "berth.skaphos.io/store"
	annotationTTL     = "berth.skaphos.io/ttl-micros"
	annotationExpires = "berth.skaphos.io/expires-at"
	annotationCluster = "berth.skaphos.io/cluster"
	// annotationRevoked is "true" on a revoked term (store.Lease.Revoked).
	// Every write replaces the whole object, so a replica that does not
	// know it drops it: it may then renew a revoked term, which only delays
	// the handover, and never leaves the mark on a later term.
	annotationRevoked = "berth.skaphos.io/revoked"
	// annotationMoveTo is set on a moving term (store.Lease.Moving): the
	// destination cluster, or "*" for any cluster but the holder's. A
	// replica that does not know it drops it with the rest; the term stays
	// revoked for it.
	annotationMoveTo = "berth.skaphos.io/move-to"
	// The reservation a moved term's end leaves (store.Lease.Reserved): a
	// replica that does not know them drops them, which only lets it grant
	// the free lease as it did before reservations existed.
	annotationReservedFor    = "berth.skaphos.io/reserved-for"
	annotationReservedExcept = "berth.skaphos.io/reserved-except"
	annotationReservedUntil  = "berth.skaphos.io/reserved-until"
	// annotationTerms holds the lease's ended terms (store.Lease.Terms), as
	// JSON, newest first and at most as many as the write that recorded
	// the last one kept: on the Lease itself, so that the term is recorded
	// by the very update that ends it (the API server has no transaction
	// over two objects). A replica that does not know it drops it on its
	// next write, and the history starts again from there.
	annotationTerms = "berth.skaphos.io/terms"
	// moveAnywhere is annotationMoveTo's value for a move to any cluster.
	moveAnywhere = "*"
)

// MaxHistoryTerms bounds the terms the store keeps per lease, whatever a
// write asks: each takes up to about 400 bytes of annotationTerms, and a
// Lease's annotations may take 256 KiB in all.
const MaxHistoryTerms = 200

// Store is the Kubernetes store. It does not implement
// store.LeaseBatchStore: the API server has no multi-object
// compare-and-swap, so the lease service renews a batch on it lease by lease
// (one read and one update each), as it renews single leases.
type Store struct {
	client    k8s.Interface
	namespace string
	clock     *refclock.Clock
	stopClock func()
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.LeaseFeed = (*Store)(nil)
	_ store.TermStore = (*Store)(nil)
)

// Open returns a store in namespace of the cluster cfg reaches, creating the
// namespace if needed. cfg's rate limits are raised so that the store is not
// throttled by client-go at the rates the lease API serves.
func Open(ctx context.Context, cfg *rest.Config, namespace string) (*Store, error) {
	return OpenWith(ctx, cfg, namespace, Options{})
}

// Options configures OpenWith.
type Options struct {
	// Clock configures how the API server's clock is followed (clock.go);
	// the zero value is the production setting.
	Clock refclock.Options
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, cfg *rest.Config, namespace string, opts Options) (*Store, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes store client: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	// An account with rights only inside the namespace (the Helm chart's) is forbidden
	// to create it: the namespace is then the installer's, and the first read of the
	// store says whether it exists.
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("create coordination namespace %s: %w", namespace, err)
	}
	s := &Store{client: c, namespace: namespace}
	if err := s.startClock(cfg, opts.Clock); err != nil {
		return nil, err
	}
	return s, nil
}

func objectName(namespace, name string) string { return namespace + "." + name }

// GetLease implements store.LeaseStore.
func (s *Store) GetLease(ctx context.Context, namespace, name string) (store.Lease, error) {
	obj, err := s.client.CoordinationV1().Leases(s.namespace).Get(ctx, objectName(namespace, name), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return store.Lease{}, store.ErrNotFound
	case err != nil:
		return store.Lease{}, fmt.Errorf("get lease %s/%s: %w", namespace, name, err)
	}
	return fromLease(obj)
}

// PutLease implements store.LeaseStore: a create for a new record, an
// update at the read resourceVersion otherwise. The term a write ends joins
// the terms the Lease carries, in the same update.
func (s *Store) PutLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	if l.Ended != nil {
		l.Terms = store.KeepTerms(l.Terms, l.Ended.Term, min(l.Ended.Keep, MaxHistoryTerms))
	}
	obj, err := toLease(s.namespace, l)
	if err != nil {
		return store.Lease{}, err
	}
	leases := s.client.CoordinationV1().Leases(s.namespace)
	var out *coordinationv1.Lease
	if l.Version == 0 {
		out, err = leases.Create(ctx, obj, metav1.CreateOptions{})
	} else {
		obj.ResourceVersion = strconv.FormatInt(l.Version, 10)
		out, err = leases.Update(ctx, obj, metav1.UpdateOptions{})
	}
	switch {
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return store.Lease{}, store.ErrConflict
	case err != nil:
		return store.Lease{}, fmt.Errorf("write lease %s/%s: %w", l.Namespace, l.Name, err)
	}
	return fromLease(out)
}

// ListTerms implements store.TermStore from the terms the Lease carries.
func (s *Store) ListTerms(ctx context.Context, namespace, name string, limit int) ([]store.Term, error) {
	l, err := s.GetLease(ctx, namespace, name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	if limit > 0 && len(l.Terms) > limit {
		return l.Terms[:limit], nil
	}
	return l.Terms, nil
}

// ListLeases implements store.LeaseStore. The API server's own paging cannot
// start after an arbitrary key, so the store lists its Leases and pages in
// memory: fine for the thousands of leases a fleet has.
func (s *Store) ListLeases(ctx context.Context, opts store.ListOptions) ([]store.Lease, bool, error) {
	list, err := s.client.CoordinationV1().Leases(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: labelKind + "=lease"})
	if err != nil {
		return nil, false, fmt.Errorf("list leases: %w", err)
	}
	var out []store.Lease
	for i := range list.Items {
		l, err := fromLease(&list.Items[i])
		if err != nil {
			return nil, false, err
		}
		if opts.Selects(l.Namespace, l.Name) {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b store.Lease) int {
		return store.CompareKeys(a.Namespace, a.Name, b.Namespace, b.Name)
	})
	if opts.Limit > 0 && len(out) > opts.Limit {
		return out[:opts.Limit], true, nil
	}
	return out, false, nil
}

// GetCluster implements store.ClusterStore.
func (s *Store) GetCluster(ctx context.Context, id string) (store.Cluster, error) {
	cm, err := s.client.CoreV1().ConfigMaps(s.namespace).Get(ctx, clusterObjectName(id), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return store.Cluster{}, store.ErrNotFound
	case err != nil:
		return store.Cluster{}, fmt.Errorf("get cluster %s: %w", id, err)
	}
	return fromConfigMap(cm)
}

// PutCluster implements store.ClusterStore.
func (s *Store) PutCluster(ctx context.Context, c store.Cluster) (store.Cluster, error) {
	cm, err := toConfigMap(s.namespace, c)
	if err != nil {
		return store.Cluster{}, err
	}
	cms := s.client.CoreV1().ConfigMaps(s.namespace)
	var out *corev1.ConfigMap
	if c.Version == 0 {
		out, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	} else {
		cm.ResourceVersion = strconv.FormatInt(c.Version, 10)
		out, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	switch {
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return store.Cluster{}, store.ErrConflict
	case err != nil:
		return store.Cluster{}, fmt.Errorf("write cluster %s: %w", c.ID, err)
	}
	return fromConfigMap(out)
}

// ListClusters implements store.ClusterStore.
func (s *Store) ListClusters(ctx context.Context) ([]store.Cluster, error) {
	list, err := s.client.CoreV1().ConfigMaps(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: labelKind + "=cluster"})
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	out := make([]store.Cluster, 0, len(list.Items))
	for i := range list.Items {
		c, err := fromConfigMap(&list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b store.Cluster) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Ping implements store.Store: it reads the coordination namespace.
func (s *Store) Ping(ctx context.Context) error {
	// A read inside the namespace, the only place where the store needs rights (the Helm
	// chart grants none outside it): it fails when the API server or the rights are gone.
	if _, err := s.client.CoordinationV1().Leases(s.namespace).List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: labelKind + "=lease"}); err != nil {
		return fmt.Errorf("ping Kubernetes store: %w", err)
	}
	// A replica that cannot bound the API server's clock must not serve.
	if _, err := s.clock.Now(ctx); err != nil {
		return fmt.Errorf("ping Kubernetes store: %w", err)
	}
	return nil
}

// feedSyncTimeout bounds FollowLeases' first list, so that a server without
// the rights to list and watch Leases says so instead of waiting forever.
const feedSyncTimeout = time.Minute

// FollowLeases implements store.LeaseFeed with an informer on the store's
// Lease objects: a created Lease, or one whose holder or token changed, is
// reported, whichever replica wrote it. The informer lists again and
// resumes by itself when its watch breaks, reporting what changed meanwhile.
func (s *Store) FollowLeases(ctx context.Context, changed func(store.LeaseChange)) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithNamespace(s.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelKind + "=lease" }))
	defer factory.Shutdown()
	informer := factory.Coordination().V1().Leases().Informer()
	report := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok {
			if ns, name, ok := strings.Cut(l.Name, "."); ok {
				changed(store.LeaseChange{Namespace: ns, Name: name})
			}
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: report,
		UpdateFunc: func(oldObj, newObj any) {
			o, okOld := oldObj.(*coordinationv1.Lease)
			n, okNew := newObj.(*coordinationv1.Lease)
			if okOld && okNew && ptr.Equal(o.Spec.HolderIdentity, n.Spec.HolderIdentity) && ptr.Equal(o.Spec.LeaseTransitions, n.Spec.LeaseTransitions) &&
				o.Annotations[annotationReservedUntil] == n.Annotations[annotationReservedUntil] {
				return // a renewal (a reservation's change wakes the clusters it held back)
			}
			report(newObj)
		},
	}); err != nil {
		return fmt.Errorf("follow lease changes: %w", err)
	}
	factory.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, feedSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), informer.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("the Lease informer did not sync within %s: may the server list and watch leases in %s?", feedSyncTimeout, s.namespace)
	}
	changed(store.LeaseChange{All: true})
	<-ctx.Done()
	return nil
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.stopClock()
	return nil
}

// termJSON is one ended term in annotationTerms.
type termJSON struct {
	Holder       string    `json:"holder"`
	FencingToken int32     `json:"token"`
	AcquiredAt   time.Time `json:"acquiredAt,omitzero"`
	EndedAt      time.Time `json:"endedAt"`
	Ending       string    `json:"ending"`
}

func toLease(namespace string, l store.Lease) (*coordinationv1.Lease, error) {
	obj := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      objectName(l.Namespace, l.Name),
			Namespace: namespace,
			Labels:    map[string]string{labelKind: "lease"},
			Annotations: map[string]string{
				annotationTTL:     strconv.FormatInt(l.TTL.Microseconds(), 10),
				annotationExpires: formatTime(l.ExpiresAt),
			},
		},
		Spec: coordinationv1.LeaseSpec{
			LeaseTransitions: &l.FencingToken,
			AcquireTime:      microTime(l.AcquiredAt),
			RenewTime:        microTime(l.RenewedAt),
		},
	}
	if l.Holder != "" {
		obj.Spec.HolderIdentity = &l.Holder
	}
	if l.Revoked {
		obj.Annotations[annotationRevoked] = "true"
	}
	if l.Moving {
		obj.Annotations[annotationMoveTo] = cmp.Or(l.MoveTo, moveAnywhere)
	}
	if r := l.Reserved; !r.IsZero() {
		obj.Annotations[annotationReservedFor] = r.For
		obj.Annotations[annotationReservedExcept] = r.Except
		obj.Annotations[annotationReservedUntil] = formatTime(r.Until)
	}
	if len(l.Terms) > 0 {
		terms := make([]termJSON, len(l.Terms))
		for i, t := range l.Terms {
			terms[i] = termJSON{Holder: t.Holder, FencingToken: t.FencingToken, AcquiredAt: t.AcquiredAt, EndedAt: t.EndedAt, Ending: string(t.Ending)}
		}
		raw, err := json.Marshal(terms)
		if err != nil {
			return nil, fmt.Errorf("encode terms of lease %s/%s: %w", l.Namespace, l.Name, err)
		}
		obj.Annotations[annotationTerms] = string(raw)
	}
	// The API server wants a positive duration when one is set; the exact
	// TTL lives in the annotation, this is for people reading the Lease.
	if ttl := int32(l.TTL / time.Second); ttl > 0 {
		obj.Spec.LeaseDurationSeconds = &ttl
	}
	return obj, nil
}

func fromLease(obj *coordinationv1.Lease) (store.Lease, error) {
	ns, name, ok := strings.Cut(obj.Name, ".")
	if !ok {
		return store.Lease{}, fmt.Errorf("lease object %s is not named namespace.name", obj.Name)
	}
	version, err := strconv.ParseInt(obj.ResourceVersion, 10, 64)
	if err != nil {
		return store.Lease{}, fmt.Errorf("lease object %s: resourceVersion %q is not a number", obj.Name, obj.ResourceVersion)
	}
	ttl, _ := strconv.ParseInt(obj.Annotations[annotationTTL], 10, 64)
	expires, err := parseTime(obj.Annotations[annotationExpires])
	if err != nil {
		return store.Lease{}, fmt.Errorf("lease object %s: %w", obj.Name, err)
	}
	l := store.Lease{Namespace: ns, Name: name, TTL: time.Duration(ttl) * time.Microsecond, ExpiresAt: expires,
		Revoked: obj.Annotations[annotationRevoked] == "true", Version: version}
	if to, ok := obj.Annotations[annotationMoveTo]; ok {
		l.Moving = true
		if to != moveAnywhere {
			l.MoveTo = to
		}
	}
	if l.Reserved.Until, err = parseTime(obj.Annotations[annotationReservedUntil]); err != nil {
		return store.Lease{}, fmt.Errorf("lease object %s: %w", obj.Name, err)
	}
	if !l.Reserved.Until.IsZero() {
		l.Reserved.For, l.Reserved.Except = obj.Annotations[annotationReservedFor], obj.Annotations[annotationReservedExcept]
	}
	if raw := obj.Annotations[annotationTerms]; raw != "" {
		var terms []termJSON
		if err := json.Unmarshal([]byte(raw), &terms); err != nil {
			return store.Lease{}, fmt.Errorf("lease object %s: decode terms: %w", obj.Name, err)
		}
		l.Terms = make([]store.Term, len(terms))
		for i, t := range terms {
			l.Terms[i] = store.Term{Holder: t.Holder, FencingToken: t.FencingToken, AcquiredAt: t.AcquiredAt.UTC(), EndedAt: t.EndedAt.UTC(), Ending: store.Ending(t.Ending)}
		}
	}
	if h := obj.Spec.HolderIdentity; h != nil {
		l.Holder = *h
	}
	if t := obj.Spec.LeaseTransitions; t != nil {
		l.FencingToken = *t
	}
	if t := obj.Spec.AcquireTime; t != nil {
		l.AcquiredAt = t.UTC()
	}
	if t := obj.Spec.RenewTime; t != nil {
		l.RenewedAt = t.UTC()
	}
	return l, nil
}

// clusterObjectName keeps cluster ConfigMaps apart from anything else.
func clusterObjectName(id string) string { return "berth-cluster." + id }

type clusterData struct {
	Fingerprint  string            `json:"fingerprint"`
	AgentVersion string            `json:"agentVersion"`
	Labels       map[string]string `json:"labels"`
	Cordoned     bool              `json:"cordoned"`
	RegisteredAt time.Time         `json:"registeredAt"`
	LastSeen     time.Time         `json:"lastSeen"`
}

func toConfigMap(namespace string, c store.Cluster) (*corev1.ConfigMap, error) {
	data, err := json.Marshal(clusterData{Fingerprint: c.Fingerprint, AgentVersion: c.AgentVersion, Labels: c.Labels,
		Cordoned: c.Cordoned, RegisteredAt: c.RegisteredAt, LastSeen: c.LastSeen})
	if err != nil {
		return nil, fmt.Errorf("encode cluster %s: %w", c.ID, err)
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: clusterObjectName(c.ID), Namespace: namespace,
			Labels:      map[string]string{labelKind: "cluster"},
			Annotations: map[string]string{annotationCluster: c.ID},
		},
		Data: map[string]string{"cluster.json": string(data)},
	}, nil
}

func fromConfigMap(cm *corev1.ConfigMap) (store.Cluster, error) {
	var d clusterData
	if err := json.Unmarshal([]byte(cm.Data["cluster.json"]), &d); err != nil {
		return store.Cluster{}, fmt.Errorf("decode cluster %s: %w", cm.Name, err)
	}
	version, err := strconv.ParseInt(cm.ResourceVersion, 10, 64)
	if err != nil {
		return store.Cluster{}, fmt.Errorf("cluster %s: resourceVersion %q is not a number", cm.Name, cm.ResourceVersion)
	}
	return store.Cluster{
		ID: cm.Annotations[annotationCluster], Fingerprint: d.Fingerprint, AgentVersion: d.AgentVersion, Labels: d.Labels,
		Cordoned: d.Cordoned, RegisteredAt: d.RegisteredAt.UTC(), LastSeen: d.LastSeen.UTC(), Version: version,
	}, nil
}

func microTime(t time.Time) *metav1.MicroTime {
	if t.IsZero() {
		return nil
	}
	m := metav1.NewMicroTime(t)
	return &m
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad time %q: %w", s, err)
	}
	return t.UTC(), nil
}
