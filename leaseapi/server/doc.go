// Package server is the lease API's HTTP front: routing per the v1alpha1 wire
// contract, bearer-token and client-certificate authentication with holder
// ownership, the error model (every error a JSON body, internal detail only in
// the log), request ids, one access-log line per request, Prometheus metrics,
// and the background sweep that frees expired leases.
//
// What a request does to a lease is package lease's decision; this package
// only authenticates, decodes, calls the lease.Service and encodes.
package server
