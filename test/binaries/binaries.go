// Package binaries builds Berth's commands once for the process tests of a
// test binary, so that they run the real programs.
package binaries

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Dir holds the commands Main built.
var Dir string

// Main builds the named commands (folders of cmd/: "berth-agent", say) into
// a temporary folder, runs the tests, removes the folder and exits with the
// tests' code. Call it from TestMain.
func Main(m *testing.M, commands ...string) {
	os.Exit(run(m, commands))
}

func run(m *testing.M, commands []string) int {
	dir, err := os.MkdirTemp("", "berth-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, c := range commands {
		args = append(args, "github.com/berthfleet/berth/cmd/"+c)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build %s: %v\n%s", strings.Join(commands, ", "), err, out)
		return 1
	}
	Dir = dir
	return m.Run()
}

// Path is the built program of command.
func Path(command string) string { return filepath.Join(Dir, command) }
