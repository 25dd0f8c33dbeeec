// Package postgres is the lease API's store on PostgreSQL, for running
// several berth-leaseapi replicas on one database. Every write is a
// compare-and-swap in SQL on the row's version (UPDATE ... WHERE version =
// the version read), so replicas never need to coordinate otherwise; the
// schema is migrated on start.
package postgres
