// Command imagebuild builds the container images of Berth's binaries without
// a container engine: static Go binaries for each platform, laid on an empty
// base with a CA bundle and a nonroot user, assembled with go-containerregistry
// into one multi-platform OCI image index per binary.
//
// The images are reproducible: every timestamp is the commit time
// (SOURCE_DATE_EPOCH), tar headers carry fixed owners and modes, and the
// binaries are built with -trimpath and no build id, so the same commit and
// Go toolchain give the same digests.
//
// It writes, under -out, an OCI image layout per binary (<name>/, for
// `crane push` and `skopeo copy oci:`) and a docker-save tarball per binary
// and platform (<name>-<version>-linux-<arch>.tar, for `docker load` and
// `kind load image-archive`).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

// run parses the command line, builds the images and prints their digests.
func run(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := parseFlags(ctx, args)
	if err != nil {
		return err
	}
	start := time.Now()
	results, err := build(ctx, cfg, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "built %d images in %s (version %s, created %s):\n", len(results),
		time.Since(start).Round(time.Millisecond), cfg.version, cfg.created.UTC().Format(time.RFC3339))
	for _, r := range results {
		fmt.Fprintf(out, "  %s@%s\n", r.ref, r.digest)
	}
	return nil
}

// parseFlags reads the command line and fills in what the repository knows:
// the version, the revision and the commit time.
func parseFlags(ctx context.Context, args []string) (config, error) {
	var (
		cfg                 config
		platforms, binaries string
		epoch               string
		fs                  = flag.NewFlagSet("imagebuild", flag.ContinueOnError)
	)
	fs.StringVar(&cfg.repoRoot, "repo-root", "../..", "root of the Berth repository (its go.mod builds the binaries)")
	fs.StringVar(&cfg.out, "out", "", "output folder (default <repo-root>/bin/images)")
	fs.StringVar(&cfg.version, "version", "", "version stamped into the binaries and the image tags (default `git describe --tags --always --dirty`)")
	fs.StringVar(&cfg.revision, "revision", "", "commit recorded in the images' labels (default `git rev-parse HEAD`)")
	fs.StringVar(&cfg.registry, "registry", "ghcr.io/berthfleet", "registry and namespace of the image names")
	fs.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated platforms")
	fs.StringVar(&binaries, "binaries", strings.Join(allBinaries, ","), "comma-separated binaries under cmd/")
	fs.StringVar(&epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time of every timestamp in the images (default $SOURCE_DATE_EPOCH, else the commit time)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.repoRoot, err = filepath.Abs(cfg.repoRoot); err != nil {
		return cfg, fmt.Errorf("resolve -repo-root: %w", err)
	}
	if cfg.out == "" {
		cfg.out = filepath.Join(cfg.repoRoot, "bin", "images")
	}
	if cfg.platforms, err = parsePlatforms(platforms); err != nil {
		return cfg, err
	}
	if cfg.binaries, err = parseBinaries(binaries); err != nil {
		return cfg, err
	}
	return cfg, fillFromGit(ctx, &cfg, epoch)
}

// fillFromGit defaults the version, revision and creation time from the
// repository's HEAD.
func fillFromGit(ctx context.Context, cfg *config, epoch string) error {
	var err error
	if cfg.version == "" {
		if cfg.version, err = git(ctx, cfg.repoRoot, "describe", "--tags", "--always", "--dirty"); err != nil {
			return err
		}
	}
	if cfg.revision == "" {
		if cfg.revision, err = git(ctx, cfg.repoRoot, "rev-parse", "HEAD"); err != nil {
			return err
		}
	}
	if epoch == "" {
		if epoch, err = git(ctx, cfg.repoRoot, "log", "-1", "--format=%ct"); err != nil {
			return err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || sec < 0 {
		return fmt.Errorf("source date epoch %q: not a Unix time", epoch)
	}
	cfg.created = time.Unix(sec, 0).UTC()
	return nil
}
