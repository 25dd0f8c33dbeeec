// Command berth-fence keeps a lease's local deadline inside a managed Pod.
// Admission injects it: an init container runs `berth-fence install DIR`
// to copy it into a shared emptyDir, and each managed container's command
// becomes `berth-fence exec -- CMD [ARGS...]`, which starts CMD only once
// the lease API confirms the Pod's term and stops it before the term could
// pass to another cluster. docs/fencing.md describes the contract.
package main

import (
	"fmt"
	"io"
	"os"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `usage:
  berth-fence install DIR       copy this binary to DIR/berth-fence (an init container's step)
  berth-fence exec -- CMD [ARGS...]
                                run CMD while the lease API confirms the Pod's term
  berth-fence exec --once -- CMD [ARGS...]
                                ask once (exec probes, lifecycle hooks): run CMD under the
                                term if confirmed, else exit 75 at once
  berth-fence --version

exec is configured by BERTH_LEASE_API_URL, BERTH_LEASE_API_CA, BERTH_LEASE_NAMESPACE,
BERTH_LEASE_NAME, BERTH_FENCE_TOKEN_FILE, BERTH_FENCE_HOLDER_FILE and
BERTH_FENCE_FENCING_TOKEN_FILE (docs/fencing.md).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches the subcommand and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s", usage)
		return exitUsage
	}
	switch args[0] {
	case "--version", "-version", "version":
		fmt.Fprintf(stdout, "berth-fence %s\n", version)
		return 0
	case "-h", "--help", "help":
		fmt.Fprintf(stdout, "%s", usage)
		return 0
	case "install":
		return runInstall(args[1:], stdout, stderr)
	case "exec":
		return runExec(args[1:], stderr)
	}
	fmt.Fprintf(stderr, "berth-fence: unknown command %q\n%s", args[0], usage)
	return exitUsage
}
