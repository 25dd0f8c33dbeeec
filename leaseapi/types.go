package leaseapi

import "time"

// Version is the API version every path starts with.
const Version = "v1alpha1"

// Limits of the wire contract.
const (
	// MaxBodyBytes bounds every request body; larger bodies are answered 413.
	MaxBodyBytes = 4 << 10
	// MaxHolderBytes bounds a holder identity.
	MaxHolderBytes = 253
	// MaxKeyLength bounds "namespace.name".
	MaxKeyLength = 253
	// MaxTTLSeconds bounds ttlSeconds so that expiry times stay representable.
	MaxTTLSeconds = 24 * 60 * 60
	// MaxBatchLeases bounds the leases of one batched renewal.
	MaxBatchLeases = 10000
	// MaxBatchBodyBytes bounds the body of a batched renewal (POST
	// /v1alpha1/renewals) instead of MaxBodyBytes: room for MaxBatchLeases
	// leases with keys of the longest length. Every other route keeps
	// MaxBodyBytes.
	MaxBatchBodyBytes = 4 << 20
)

// AcquireRequest is the body of POST .../leases/{name}/acquire.
type AcquireRequest struct {
	Holder     string `json:"holder"`
	TTLSeconds int32  `json:"ttlSeconds"`
}

// RenewRequest is the body of POST .../leases/{name}/renew.
type RenewRequest struct {
	Holder       string `json:"holder"`
	FencingToken int32  `json:"fencingToken"`
	TTLSeconds   int32  `json:"ttlSeconds"`
}

// ReleaseRequest is the body of POST .../leases/{name}/release.
type ReleaseRequest struct {
	Holder       string `json:"holder"`
	FencingToken int32  `json:"fencingToken"`
}

// MoveRequest is the body of POST .../leases/{name}/move: move the live
// term of Holder with FencingToken to cluster To, or, with To empty, to any
// cluster but the holder's.
type MoveRequest struct {
	Holder       string `json:"holder"`
	FencingToken int32  `json:"fencingToken"`
	To           string `json:"to,omitempty"`
}

// Move is a term being moved: From is the holder's cluster, To the cluster
// the lease goes to next (empty: any cluster but From).
type Move struct {
	From string `json:"from"`
	To   string `json:"to,omitempty"`
}

// BatchRenewRequest is the body of POST /v1alpha1/renewals: one holder's
// renewals of many leases in one request, each as POST .../renew would make
// it.
type BatchRenewRequest struct {
	Holder string         `json:"holder"`
	Leases []BatchRenewal `json:"leases"`
}

// BatchRenewal is one lease of a BatchRenewRequest.
type BatchRenewal struct {
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	FencingToken int32  `json:"fencingToken"`
	TTLSeconds   int32  `json:"ttlSeconds"`
}

// BatchRenewResponse answers a batched renewal: Items[i] answers Leases[i]
// of the request.
type BatchRenewResponse struct {
	Items []BatchRenewResult `json:"items"`
}

// BatchRenewResult is the answer for one lease of a batched renewal: its key
// and what POST .../renew would have answered for it.
type BatchRenewResult struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	AcquireResponse
}

// AcquireResponse answers acquire and renew. Acquired is false when another
// holder has the lease (or, for renew, when the caller lost it); Holder and
// FencingToken then describe the current state. Revoked is true when that
// state is a term an administrator revoked (or moved: Move): a caller that
// finds itself the holder of a revoked term must stop and release it with
// its token. An acquire of a free lease that a reservation withholds from
// the caller is answered like one of a held lease (Acquired false, Holder
// empty), with the reservation and a Message saying so: wait, as for a
// held lease, until the lease changes or ReservedUntil.
type AcquireResponse struct {
	Acquired     bool      `json:"acquired"`
	Holder       string    `json:"holder"`
	FencingToken int32     `json:"fencingToken"`
	AcquiredAt   time.Time `json:"acquiredAt,omitzero"`
	RenewedAt    time.Time `json:"renewedAt,omitzero"`
	ExpiresAt    time.Time `json:"expiresAt,omitzero"`
	Revoked      bool      `json:"revoked,omitempty"`
	Move         *Move     `json:"move,omitempty"`
	Reservation
	Message string `json:"message,omitempty"`
}

// Reservation is who may be granted a free lease next, after a moved term
// ended: until ReservedUntil only holders of cluster ReservedFor, or of any
// cluster but ReservedExcept. All empty when nothing is reserved.
type Reservation struct {
	ReservedFor    string    `json:"reservedFor,omitempty"`
	ReservedExcept string    `json:"reservedExcept,omitempty"`
	ReservedUntil  time.Time `json:"reservedUntil,omitzero"`
}

// Lease is the record answered by GET and list. Holder is empty when the lease
// is free; FencingToken is the last token granted and never goes back.
// Revoked: an administrator revoked the holder's term, which ends when the
// holder releases it or at ExpiresAt, and is not renewed. Move: the term is
// being moved (it is revoked too). The Reservation fields: the free lease
// is reserved after a moved term ended.
type Lease struct {
	Namespace    string    `json:"namespace"`
	Name         string    `json:"name"`
	Holder       string    `json:"holder"`
	FencingToken int32     `json:"fencingToken"`
	TTLSeconds   int32     `json:"ttlSeconds,omitempty"`
	AcquiredAt   time.Time `json:"acquiredAt,omitzero"`
	RenewedAt    time.Time `json:"renewedAt,omitzero"`
	ExpiresAt    time.Time `json:"expiresAt,omitzero"`
	Revoked      bool      `json:"revoked,omitempty"`
	Move         *Move     `json:"move,omitempty"`
	Reservation
}

// Term is one term of a lease's history. EndedAt and Ending are empty for
// the live term; Ending is one of the Term* constants.
type Term struct {
	Holder       string    `json:"holder"`
	FencingToken int32     `json:"fencingToken"`
	AcquiredAt   time.Time `json:"acquiredAt,omitzero"`
	EndedAt      time.Time `json:"endedAt,omitzero"`
	Ending       string    `json:"ending,omitempty"`
}

// How a term ended: released by its holder, expired, revoked (and then
// released or expired), moved (and then released or expired).
const (
	TermReleased = "released"
	TermExpired  = "expired"
	TermRevoked  = "revoked"
	TermMoved    = "moved"
)

// TermList answers GET .../leases/{name}/history: newest first, the live
// term (if any) first.
type TermList struct {
	Items []Term `json:"items"`
}

// LeaseList answers GET /v1alpha1/leases. Continue is empty on the last page.
type LeaseList struct {
	Items    []Lease `json:"items"`
	Continue string  `json:"continue"`
}

// WatchEvent is one line of the stream GET /v1alpha1/watch/leases answers
// (newline-delimited JSON). Revision is opaque: a watch resumed from it,
// on the server process that issued it, is handed every change after it.
type WatchEvent struct {
	// Type is WatchReset, WatchChanged or WatchBookmark.
	Type     string `json:"type"`
	Revision string `json:"revision"`
	// Lease is set for WatchChanged: the record as GET answers it.
	Lease *Lease `json:"lease,omitempty"`
}

// The types of a WatchEvent.
const (
	// WatchReset: changes before Revision may have been missed; re-read
	// every lease of interest. The first line of every stream that does not
	// resume.
	WatchReset = "RESET"
	// WatchChanged: the holder, fencing token or revocation of Lease changed.
	WatchChanged = "CHANGED"
	// WatchBookmark: nothing to report up to Revision; sent after a quiet
	// interval, and first on a resumed stream with nothing to replay.
	WatchBookmark = "BOOKMARK"
)

// ClusterRegistration is the body of PUT /v1alpha1/clusters/{id}: an agent
// registering its cluster, and afterwards its heartbeat.
type ClusterRegistration struct {
	Fingerprint  string            `json:"fingerprint"`
	AgentVersion string            `json:"agentVersion"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// ClusterRegistrationResponse answers a registration or heartbeat.
type ClusterRegistrationResponse struct {
	ID       string    `json:"id"`
	Cordoned bool      `json:"cordoned"`
	LastSeen time.Time `json:"lastSeen"`
}

// Cluster is one member of the fleet as GET /v1alpha1/clusters reports it.
type Cluster struct {
	ID           string            `json:"id"`
	Fingerprint  string            `json:"fingerprint"`
	AgentVersion string            `json:"agentVersion,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	LastSeen     time.Time         `json:"lastSeen"`
	Healthy      bool              `json:"healthy"`
	Cordoned     bool              `json:"cordoned"`
	LeasesHeld   int               `json:"leasesHeld"`
}

// ClusterList answers GET /v1alpha1/clusters.
type ClusterList struct {
	Items []Cluster `json:"items"`
}

// Error is the body of every error answer. RequestID is set on internal errors
// so that an operator can find the detail in the server log.
type Error struct {
	Error     string `json:"error"`
	RequestID string `json:"requestId,omitempty"`
}

// RequestIDHeader carries the request id on every answer.
const RequestIDHeader = "X-Request-Id"

// Confirmation answers GET .../leases/{name}/confirmation?holder=&fencingToken=:
// whether holder holds the lease now with exactly that fencing token, asked
// by berth-fence inside a managed Pod before it starts, and while it runs,
// its workload.
//
// Confirmed is true only while the term is the asked holder's, carries the
// asked token, is not revoked and has not expired. RemainingMillis is then
// the least time the term has left on the store's clock as of the answer
// (its expiry minus the latest bound of the store's clock), so that the
// caller can keep a deadline on its own monotonic clock without trusting its
// wall clock; zero when not confirmed. Holder, FencingToken and Revoked
// describe the lease as it is (Holder empty when free); TTLSeconds is the
// term's TTL.
type Confirmation struct {
	Confirmed       bool   `json:"confirmed"`
	Holder          string `json:"holder"`
	FencingToken    int32  `json:"fencingToken"`
	Revoked         bool   `json:"revoked,omitempty"`
	TTLSeconds      int32  `json:"ttlSeconds,omitempty"`
	RemainingMillis int64  `json:"remainingMillis"`
}

// ConfirmAudience is the audience of the Kubernetes service account token
// with which a managed Pod may ask for the confirmation of lease key (and of
// no other lease): admission asks the kubelet for a projected token of this
// audience, and the lease API accepts a service account token for key only
// with it, so the token is useless for anything else, the Kubernetes API
// included.
func ConfirmAudience(key Key) string {
	return "berth-leaseapi/" + key.Namespace + "/" + key.Name
}
