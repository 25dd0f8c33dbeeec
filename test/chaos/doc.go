// Package chaos walks a Berth fleet through random faults and judges what
// happened, independently of the code under test.
//
// A schedule is drawn from a seed (Plan): a few operations, each after a
// random wait, mixing cordons, agent kill -9 and SIGSTOP, partitions from the
// lease API, lease API kill -9, BerthLease deletion, lease-name reuse,
// finalizer removal, administrator release and scaling. The same seed always
// gives the same schedule, so a failing seed can be replayed. A Nemesis
// applies a schedule to a running test/localfleet fleet, then heals the fleet
// and waits until it converges, so that one fleet serves many schedules.
//
// Two judges look at each schedule. test/history lists every cluster's managed
// Pods straight from each API server and proves any overlap; Judge sorts the
// overlaps into failures and those that began while an agent was down or
// frozen past its local deadline, the documented limit. And the lease API's
// own answers to a few test clients, hammering keys of their own through a
// cuttable proxy while the lease API is killed, are checked for
// linearizability against a sequential model of a lease (porcupine).
//
// This package drives processes and owns no product code; the suites that run
// it are chaos_test.go (fixed seeds, `make test`) and `make soak`.
package chaos
