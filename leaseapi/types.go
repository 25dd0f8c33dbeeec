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
// state is a term an administrator revoked: a caller that finds itself the
// holder of a revoked term must stop and release it with its token.
type AcquireResponse struct {
	Acquired     bool      `json:"acquired"`
	Holder       string    `json:"holder"`
	FencingToken int32     `json:"fencingToken"`
	AcquiredAt   time.Time `json:"acquiredAt,omitzero"`
	RenewedAt    time.Time `json:"renewedAt,omitzero"`
	ExpiresAt    time.Time `json:"expiresAt,omitzero"`
	Revoked      bool      `json:"revoked,omitempty"`
}

// Lease is the record answered by GET and list. Holder is empty when the lease
// is free; FencingToken is the last token granted and never goes back.
// Revoked: an administrator revoked the holder's term, which ends when the
// holder releases it or at ExpiresAt, and is not renewed.
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
