package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time (-ldflags "-X main.version=v0.1.0"); otherwise
// the module version from the build info stands in.
var version = ""

// versionInfo is what `berthctl version -o json` prints.
type versionInfo struct {
	Client clientVersion  `json:"client"`
	Server *serverVersion `json:"server,omitempty"`
}

type clientVersion struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Module    string `json:"module,omitempty"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	Platform  string `json:"platform"`
}

type serverVersion struct {
	URL   string `json:"url"`
	Ready bool   `json:"ready"`
	Error string `json:"error,omitempty"`
}

// buildVersion describes this binary from the linker's version and the build
// info; info may be nil when the binary carries none.
func buildVersion(linked string, info *debug.BuildInfo) clientVersion {
	v := clientVersion{Version: linked, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info == nil {
		if v.Version == "" {
			v.Version = "unknown"
		}
		return v
	}
	v.GoVersion, v.Module = info.GoVersion, info.Main.Path
	if v.Version == "" {
		v.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// linkedVersion is the version `berthctl --version` prints.
func linkedVersion() string {
	info, _ := debug.ReadBuildInfo()
	return buildVersion(version, info).Version
}

func newVersionCommand(o *globalOptions) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client version and build, and whether the server is ready",
		Long: `Print berthctl's version and build. When a server is configured (--server or
` + envServer + `), also ask whether it is ready; a server that is not ready or
cannot be reached makes the command fail (exit 1) after printing.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, _ := debug.ReadBuildInfo()
			v := versionInfo{Client: buildVersion(version, info)}
			var readyErr error
			conn, err := resolveConnection(o.flags, o, o.getenv)
			if err != nil {
				return err
			}
			if conn.serverExplicit {
				c, _, err := o.connect()
				if err != nil {
					return err
				}
				ctx, cancel := o.withTimeout(cmd.Context())
				defer cancel()
				readyErr = c.Ready(ctx)
				v.Server = &serverVersion{URL: conn.server, Ready: readyErr == nil}
				if readyErr != nil {
					v.Server.Error = oneLine(readyErr)
				}
			}
			if output == formatJSON || output == formatYAML {
				if err := printObject(o.out, output, v, nil); err != nil {
					return err
				}
			} else if err := printVersion(o, v); err != nil {
				return err
			}
			return readyErr
		},
	}
	bindOutput(cmd.Flags(), &output)
	return cmd
}

func printVersion(o *globalOptions, v versionInfo) error {
	c := v.Client
	lines := []string{
		"Client Version: " + c.Version,
		"Go Version: " + c.GoVersion,
		"Platform: " + c.Platform,
	}
	if c.Revision != "" {
		rev := c.Revision
		if c.Modified {
			rev += " (modified)"
		}
		lines = append(lines, "Revision: "+rev)
	}
	if c.Time != "" {
		lines = append(lines, "Build Time: "+c.Time)
	}
	if s := v.Server; s != nil {
		state := "ready"
		if !s.Ready {
			state = "not ready"
		}
		lines = append(lines, fmt.Sprintf("Server: %s (%s)", s.URL, state))
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(o.out, l); err != nil {
			return err
		}
	}
	return nil
}
