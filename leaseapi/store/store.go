package store

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"time"
)

var (
	// ErrNotFound is returned when no record exists for a key.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned by a write whose expected version is no longer
	// the stored one: another write landed first.
	ErrConflict = errors.New("version conflict")
)

// Lease is the stored state of one lease key.
type Lease struct {
	Namespace string
	Name      string
	// Holder is empty when the lease is free.
	Holder string
	// FencingToken is the last token granted for this key; it only grows.
	FencingToken int32
	// TTL is the duration last granted, kept so that a restarted server can
	// give the holder a grace period of the same length.
	TTL        time.Duration
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
	// Revoked: an administrator released this term from under its holder.
	// The term keeps its holder and token until the holder releases it or
	// it ends, but it is never extended; a new term begins unrevoked.
	Revoked bool
	// Moving: the term is being moved (a move revokes it, so Revoked is set
	// too). MoveTo is the cluster the lease goes to next, empty for any
	// cluster but the holder's. Both belong to the term: they are cleared
	// when it ends, when its end leaves a Reservation instead.
	Moving bool
	MoveTo string
	// Reserved withholds the next grant of a free lease after a moved term
	// ended; the zero value reserves nothing.
	Reserved Reservation
	// Terms are the ended terms of a store that keeps them inside the lease
	// record itself (the Kubernetes store), newest first. The lease service
	// carries them along unchanged, so that a write does not drop them;
	// stores that keep terms apart (TermStore in a table) leave it nil.
	Terms []Term
	// Ended, on a write, is the term the write ends, for a store that keeps
	// terms (TermStore) to record in the same transaction as the write, and
	// only if the write lands. Stores never return it set.
	Ended *EndedTerm
	// Version is owned by the store: zero for a record never written, and
	// different after every write.
	Version int64
}

// Held reports whether the lease has a holder whose term has not ended at now.
func (l *Lease) Held(now time.Time) bool {
	return l.Holder != "" && now.Before(l.ExpiresAt)
}

// Reservation withholds the grant of a free lease until Until: only holders
// of cluster For may be granted it, or, with Except, holders of any cluster
// but Except. It never lets anyone be granted a lease that is held.
type Reservation struct {
	For, Except string
	Until       time.Time
}

// IsZero reports whether r reserves nothing.
func (r Reservation) IsZero() bool { return r == Reservation{} }

// Ending is how a term ended.
type Ending string

// The endings of a term. A move or a revocation names the ending whichever
// way the term then ended (its holder's release, or expiry), a move first.
const (
	EndReleased Ending = "released"
	EndExpired  Ending = "expired"
	EndRevoked  Ending = "revoked"
	EndMoved    Ending = "moved"
)

// Term is one ended term of a lease.
type Term struct {
	Holder       string
	FencingToken int32
	AcquiredAt   time.Time
	EndedAt      time.Time
	Ending       Ending
}

// EndedTerm is a term to record with the write that ends it: Keep bounds
// how many ended terms of the lease the store keeps, this one included
// (the oldest go first).
type EndedTerm struct {
	Term
	Keep int
}

// KeepTerms returns terms, newest first, with t recorded: t first, and at
// most keep in all. A term already recorded (its token) is not recorded
// twice. Stores that keep terms in the record use it.
func KeepTerms(terms []Term, t Term, keep int) []Term {
	if keep < 1 {
		return terms
	}
	out := make([]Term, 0, min(len(terms)+1, keep))
	out = append(out, t)
	for _, old := range terms {
		if len(out) >= keep {
			break
		}
		if old.FencingToken != t.FencingToken {
			out = append(out, old)
		}
	}
	return out
}

// Cluster is the stored registration of one cluster of the fleet.
type Cluster struct {
	ID           string
	Fingerprint  string
	AgentVersion string
	Labels       map[string]string
	Cordoned     bool
	RegisteredAt time.Time
	LastSeen     time.Time
	Version      int64
}

// ListOptions selects a page of leases, ordered by namespace then name.
type ListOptions struct {
	// Namespace, when set, restricts the list to one namespace.
	Namespace string
	// After, when set, starts the page after this key ("namespace/name").
	After string
	// Limit bounds the page; zero means no bound.
	Limit int
}

// Selects reports whether the lease namespace/name belongs on the page: in
// Namespace (when set) and after After in list order. After is compared as
// the (namespace, name) pair the list is ordered by, never as the string
// "namespace/name": '-' sorts before '/', so "team-b/x" < "team/a" as strings
// while namespace "team" comes first.
func (o ListOptions) Selects(namespace, name string) bool {
	if o.Namespace != "" && namespace != o.Namespace {
		return false
	}
	if o.After == "" {
		return true
	}
	afterNS, afterName, _ := strings.Cut(o.After, "/")
	return CompareKeys(namespace, name, afterNS, afterName) > 0
}

// CompareKeys orders lease keys as lists are ordered: by namespace, then by
// name, each bytewise.
func CompareKeys(aNamespace, aName, bNamespace, bName string) int {
	return cmp.Or(cmp.Compare(aNamespace, bNamespace), cmp.Compare(aName, bName))
}

// LeaseStore keeps lease records.
type LeaseStore interface {
	// GetLease returns the record of a key, or ErrNotFound.
	GetLease(ctx context.Context, namespace, name string) (Lease, error)
	// PutLease writes l if the stored version is still l.Version (zero: no
	// record may exist yet) and returns it with its new version; otherwise it
	// returns ErrConflict and writes nothing.
	PutLease(ctx context.Context, l Lease) (Lease, error)
	// ListLeases returns leases in key order; more is true when the page was
	// cut by Limit.
	ListLeases(ctx context.Context, opts ListOptions) (leases []Lease, more bool, err error)
}

// LeaseKey names one lease of a LeaseBatchStore call.
type LeaseKey struct{ Namespace, Name string }

// LeaseBatchStore is what a store may also offer: many leases read, and many
// compare-and-swap writes made, in one round trip each. The lease service
// renews a batch of leases through it (and lease by lease through
// LeaseStore when a store does not offer it).
type LeaseBatchStore interface {
	// GetLeases returns the records of keys, the i-th answering keys[i]; a
	// key never written comes back with its Namespace and Name, Version
	// zero and nothing else set.
	GetLeases(ctx context.Context, keys []LeaseKey) ([]Lease, error)
	// PutLeases makes the compare-and-swap write of PutLease for every
	// lease, each on its own version, and reports each on its own:
	// written[i] with its new version when errs[i] is nil, else errs[i]
	// is ErrConflict (or what else failed for that lease alone) and
	// leases[i] is not written. A key should appear once; of writes of
	// one key prepared from one version at most one lands. err is a
	// failure of the round trip: then any of the writes may have landed
	// or not.
	PutLeases(ctx context.Context, leases []Lease) (written []Lease, errs []error, err error)
}

// TermStore keeps the ended terms of every lease, each recorded by the
// lease write that ended it (Lease.Ended), in the same transaction.
type TermStore interface {
	// ListTerms returns the kept ended terms of a lease, newest (highest
	// token) first, at most limit of them (zero: all).
	ListTerms(ctx context.Context, namespace, name string, limit int) ([]Term, error)
}

// ClusterStore keeps cluster registrations.
type ClusterStore interface {
	// GetCluster returns a registration, or ErrNotFound.
	GetCluster(ctx context.Context, id string) (Cluster, error)
	// PutCluster is the compare-and-swap write of PutLease for clusters.
	PutCluster(ctx context.Context, c Cluster) (Cluster, error)
	// ListClusters returns every registration ordered by id.
	ListClusters(ctx context.Context) ([]Cluster, error)
}

// LeaseChange is one report of a LeaseFeed.
type LeaseChange struct {
	// Namespace and Name are the key of a lease whose holder or fencing
	// token was written.
	Namespace, Name string
	// All: the feed (re)started and may have missed writes, so any lease
	// may have changed.
	All bool
}

// LeaseFeed is what a store that several servers share may also offer: it
// reports lease writes made through any of them, so that a long poll held
// by one replica answers at once when another replica frees the lease.
type LeaseFeed interface {
	// FollowLeases calls changed with All once it follows, then for every
	// lease whose holder or fencing token is written (renewals may be left
	// out), until ctx ends (it returns nil) or the feed breaks (it returns
	// the error). changed must not block.
	FollowLeases(ctx context.Context, changed func(LeaseChange)) error
}

// Store is what a backend implements.
type Store interface {
	LeaseStore
	ClusterStore
	// Ping checks that the store can serve; readiness probes call it.
	Ping(ctx context.Context) error
	// Close releases the store's resources; pending writes finish first.
	Close() error
}
