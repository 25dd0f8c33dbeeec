// Package logging sets up the logging of Berth's commands (berth-agent,
// berth-leaseapi, berthctl) the same way: one logr.Logger written to stderr as
// klog text lines or as JSON lines, chosen by --log-format, at the verbosity
// of -v/--v (0 state changes, 1 flow, 4 trace), with --vmodule for text.
// Install routes klog and controller-runtime into that logger, so that every
// line of a process has one format.
//
// It owns the logging flags and the construction of the logger; it does not
// choose the messages or keys (the code that logs does: constant messages,
// lowerCamel keys, cluster, lease, berthLease, holder, token, error), and it
// does not parse a command's other flags.
package logging
