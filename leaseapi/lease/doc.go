// Package lease is the lease API's semantics: a pure state machine that
// decides what an acquire, renew, release, expiry sweep or restart grace does
// to a lease record, and a Service that applies those decisions to any
// store.Store with compare-and-swap writes, retrying when another write landed
// first. It also keeps the cluster registry's rules, and the log of lease
// changes (a new holder, token or revocation; never a renewal) that watches
// follow, which a shared store's feed fills with other replicas' changes.
//
// Every rule of the wire contract that must hold on every backend lives here,
// once: tokens start at 1 and only grow, release and expiry keep the token, a
// holder's own acquire renews, expiry is judged on the server's clock at
// arrival. HTTP, authentication and metrics are package server's concern.
package lease
