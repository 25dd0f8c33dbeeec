// Package refclock follows a remote clock (a database's, an API server's)
// that several lease API replicas share, so that all of them judge lease
// terms by it rather than each by its own wall clock.
//
// A Clock samples the remote clock every few seconds and anchors each sample
// to the local monotonic clock: a sample says that the remote clock showed a
// time in [earliest, latest] at some moment between sending the request and
// receiving the answer. Carried forward by the monotonic time elapsed since
// (widened by DriftRate, the most the two clocks' rates may differ), every
// sample bounds the remote clock's reading now; the Clock intersects the
// bounds of its recent samples. Stepping the local wall clock (an NTP step)
// therefore moves nothing, and reading the clock costs no round trip. With
// no fresh sample, or bounds wider than the limit, reading fails.
//
// It knows nothing of leases; package lease decides how to use the bounds.
package refclock
