// Package sqlite is the lease API's embedded store: one SQLite file, opened by
// one process at a time, in WAL mode with a full sync on every commit, so that
// every acknowledged write survives kill -9 and power loss.
//
// Because the process has the file to itself, the committed records are also
// kept in memory: reads never touch the disk, and compare-and-swap checks run
// against the committed state. Writes are group-committed: a single writer
// takes every write queued while the previous transaction was syncing, checks
// each one's version, and commits them all in one transaction with one fsync,
// acknowledging each only after that commit.
package sqlite
