// Package client is the Go client of Berth's lease API.
//
// Every call is bounded by its context and, when the context has no deadline,
// by Config.Timeout. Calls are retried with jittered exponential backoff on
// connection errors, 429 and 5xx answers: every operation of the API is
// idempotent by design (a holder's repeated acquire renews and keeps its
// token, a repeated release of a free lease succeeds), so a retry after a lost
// answer cannot grant or free anything the first attempt did not. 4xx answers
// are never retried; they come back as *APIError values that match the
// sentinel errors (ErrConflict, ErrUnauthorized, ...) with errors.Is.
//
// WatchLeases is the exception: it holds one stream of lease changes open for
// as long as its context lasts, resuming it after every break, and bounds
// only connecting and each stream's first line by Config.Timeout.
package client
