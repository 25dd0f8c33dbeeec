// Package store defines how the lease API keeps its records: the Lease and
// Cluster records, and the Store interface every backend implements.
//
// A store knows nothing of lease semantics. It offers reads and
// compare-and-swap writes on a version it owns and changes on every write, so
// that two writes prepared from the same state can never both land; the lease
// state machine in package lease decides what to write. Records are never
// deleted, which is what keeps fencing tokens from being reused.
//
// Backends live in sub-packages (sqlite, ...); storetest is the conformance
// suite every backend must pass.
package store
