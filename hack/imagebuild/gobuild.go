package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// goBuild compiles the binaries for one platform into a folder of tmp and
// returns that folder. The binaries are static (no cgo) and reproducible:
// no file paths, build id or VCS stamp, and the architecture level pinned to
// the baseline, so that only the source, the version and the Go toolchain
// decide their bytes.
func goBuild(ctx context.Context, cfg config, p v1.Platform, tmp string) (string, error) {
	dir := filepath.Join(tmp, p.OS+"-"+p.Architecture+p.Variant)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create build folder: %w", err)
	}
	args := []string{"build", "-C", cfg.repoRoot, "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X main.version=" + cfg.version, "-o", dir + string(filepath.Separator)}
	for _, b := range withCompanions(cfg.binaries) {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), goEnv(p)...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build for %s: %w\n%s", p.String(), err, strings.TrimSpace(stderr.String()))
	}
	return dir, nil
}

// goEnv is the environment that selects the platform; later entries win
// over the caller's.
func goEnv(p v1.Platform) []string {
	env := []string{"CGO_ENABLED=0", "GOOS=" + p.OS, "GOARCH=" + p.Architecture}
	switch p.Architecture {
	case "amd64":
		env = append(env, "GOAMD64=v1")
	case "arm64":
		env = append(env, "GOARM64=v8.0")
	case "arm":
		env = append(env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	return env
}

// git runs a git command in the repository and returns its trimmed output.
func git(ctx context.Context, repo string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
