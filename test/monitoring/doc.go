// Package monitoring checks Berth's Prometheus rules and Grafana dashboard
// (deploy/monitoring) against the metrics that the real binaries expose.
//
// It reads every PromQL expression the way Prometheus and Grafana would: the
// rule files with Prometheus's own rulefmt (so a file that `promtool check
// rules` refuses is refused here too), the dashboard's targets and template
// variables after Grafana's variables are replaced by sample values, each
// parsed by Prometheus's PromQL parser. It lists the metric names each
// expression selects and compares them with the metric families scraped from
// running binaries. The tests start a fleet of real berth-leaseapi and
// berth-agent processes (test/localfleet) and drive it until every metric
// the rules and the dashboard name has appeared. The alerts whose logic is
// more than a threshold are also evaluated by Prometheus's engine on made-up
// series (promqltest), so that a join or a counter's first appearance is
// proven to fire, or not, as the runbooks say.
//
// It is a module of its own so that Prometheus's dependencies stay out of the
// product's module graph; the product's binaries are built from the
// product's module, not this one.
package monitoring
