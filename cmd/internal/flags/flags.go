// Package flags parses the command lines of Berth's servers with pflag while
// still accepting the Go flag package's spellings that they accepted before
// they moved to pflag: a long flag with one dash (-cluster-id=east,
// -listen :8443), as Go programs and many manifests write them.
package flags

import (
	"strings"

	"github.com/spf13/pflag"
)

// Parse parses args into fs after turning each single-dash long flag that
// fs defines (-name, -name=value) into its double-dash form. Shorthands
// (-v 2), arguments after "--" and values are left as they are.
func Parse(fs *pflag.FlagSet, args []string) error {
	return fs.Parse(GoStyle(fs, args))
}

// Version binds --version to show. A command that finds it set prints
// VersionLine and exits before it checks any other flag.
func Version(fs *pflag.FlagSet, show *bool) {
	fs.BoolVar(show, "version", false, "print the version and exit")
}

// VersionLine is what --version prints: the command's name and version.
func VersionLine(command, version string) string { return command + " " + version }

// GoStyle returns args with every single-dash long flag that fs defines
// spelled with two dashes.
func GoStyle(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	valueNext := false // the previous argument was a flag whose value follows
	for i, arg := range args {
		switch {
		case valueNext:
			valueNext = false
		case arg == "--":
			return append(out, args[i:]...)
		case strings.HasPrefix(arg, "-"):
			name, hasValue := flagName(arg)
			f := fs.Lookup(name)
			if f == nil && len(name) == 1 {
				f = fs.ShorthandLookup(name)
			}
			if f == nil {
				break
			}
			if len(name) > 1 && !strings.HasPrefix(arg, "--") {
				arg = "-" + arg
			}
			valueNext = !hasValue && f.NoOptDefVal == ""
		}
		out = append(out, arg)
	}
	return out
}

// flagName returns the name of a flag argument (-name, --name, -name=value)
// and whether it carries its value.
func flagName(arg string) (string, bool) {
	name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return name, hasValue
}
