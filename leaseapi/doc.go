// Package leaseapi holds the wire contract of Berth's central lease API
// (v1alpha1): the request and response bodies, the rules that make a lease key
// valid, and the strict JSON decoding every server and client shares.
//
// The service itself lives in the sub-packages: lease (the state machine and
// the service that applies it to a store), store (the storage interface, its
// conformance suite and backends), server (HTTP handlers, authentication,
// metrics) and client (the Go client). This package has no behaviour of its
// own beyond validation, so that both ends of the wire agree on it.
package leaseapi
