// Package storetest is the conformance suite every store.Store backend must
// pass: compare-and-swap on the store's version, and the lease semantics of
// package lease applied on top of it (a single winner under contention,
// strictly increasing fencing tokens, expiry on an injected clock, paging,
// the int32 token ceiling, restart grace and the cluster registry).
//
// A backend's test calls Run with a function that opens a fresh, empty store.
package storetest
