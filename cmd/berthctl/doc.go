// Command berthctl is the command-line client of Berth's lease API: it lists
// and inspects leases, releases a stuck lease as an administrator, lists the
// fleet's clusters and cordons or uncordons them.
//
// It owns presentation (tables, JSON, YAML), configuration from flags and the
// environment, and exit codes a script can branch on; it talks to the server
// only through leaseapi/client and holds no lease of its own.
package main
