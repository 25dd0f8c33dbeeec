package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// allBinaries are the commands under cmd/ that ship as images.
var allBinaries = []string{"berth-agent", "berth-leaseapi", "berthctl"}

// companions are commands under cmd/ that ship inside another binary's
// image, beside it in /usr/local/bin: berth-fence is copied by admission's
// init container from the agent's own image into each fenced Pod.
var companions = map[string][]string{"berth-agent": {"berth-fence"}}

// withCompanions is binaries followed by the companions of each.
func withCompanions(binaries []string) []string {
	out := slices.Clone(binaries)
	for _, b := range binaries {
		out = append(out, companions[b]...)
	}
	return out
}

// config is what one run builds and where it puts it.
type config struct {
	repoRoot  string
	out       string
	version   string
	revision  string
	registry  string
	created   time.Time
	platforms []v1.Platform
	binaries  []string
}

// result is one binary's multi-platform image as written.
type result struct {
	name   string
	ref    name.Tag
	digest v1.Hash // of the image index
}

// build compiles the binaries for every platform, then assembles and writes
// one image per binary and platform and one index per binary.
func build(ctx context.Context, cfg config, out io.Writer) ([]result, error) {
	tmp, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return nil, fmt.Errorf("create build folder: %w", err)
	}
	defer os.RemoveAll(tmp)
	bins := make(map[string]string) // platform/binary → file
	for _, p := range cfg.platforms {
		start := time.Now()
		dir, err := goBuild(ctx, cfg, p, tmp)
		if err != nil {
			return nil, err
		}
		for _, b := range withCompanions(cfg.binaries) {
			bins[binaryKey(p, b)] = filepath.Join(dir, b)
		}
		fmt.Fprintf(out, "go build %s: %s in %s\n", p.String(), strings.Join(withCompanions(cfg.binaries), ", "), time.Since(start).Round(time.Millisecond))
	}
	base, err := baseLayer(cfg.created)
	if err != nil {
		return nil, err
	}
	var results []result
	for _, b := range cfg.binaries {
		r, err := buildOne(cfg, b, base, bins, out)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// buildOne assembles and writes the images and the index of one binary.
func buildOne(cfg config, binary string, base v1.Layer, bins map[string]string, out io.Writer) (result, error) {
	ref, err := name.NewTag(cfg.registry + "/" + binary + ":" + cfg.version)
	if err != nil {
		return result{}, fmt.Errorf("name the image of %s: %w", binary, err)
	}
	m := imageMeta{binary: binary, version: cfg.version, revision: cfg.revision, created: cfg.created}
	var images []platformImage
	for _, p := range cfg.platforms {
		start := time.Now()
		files := []string{bins[binaryKey(p, binary)]}
		for _, c := range companions[binary] {
			files = append(files, bins[binaryKey(p, c)])
		}
		img, err := buildImage(m, p, base, files)
		if err != nil {
			return result{}, err
		}
		file := filepath.Join(cfg.out, tarballName(binary, cfg.version, p))
		if err := writeTarball(file, ref, img); err != nil {
			return result{}, err
		}
		line, err := describeImage(img)
		if err != nil {
			return result{}, err
		}
		fmt.Fprintf(out, "image %s %s: %s, %s in %s\n", ref, p.String(), line, file, time.Since(start).Round(time.Millisecond))
		images = append(images, platformImage{platform: p, image: img})
	}
	idx, err := buildIndex(m, images)
	if err != nil {
		return result{}, err
	}
	digest, err := writeLayout(filepath.Join(cfg.out, binary), ref, idx)
	if err != nil {
		return result{}, err
	}
	return result{name: binary, ref: ref, digest: digest}, nil
}

func binaryKey(p v1.Platform, binary string) string { return p.String() + "/" + binary }

// tarballName names a docker-save tarball: berthctl-v0.1.0-linux-arm64.tar.
func tarballName(binary, version string, p v1.Platform) string {
	arch := p.Architecture
	if p.Variant != "" && p.Architecture == "arm" {
		arch += p.Variant
	}
	return fmt.Sprintf("%s-%s-%s-%s.tar", binary, version, p.OS, arch)
}

// parsePlatforms reads os/arch[/variant] items; only Linux is built, and
// arm64 gets the variant v8 that registries and runtimes expect.
func parsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	for item := range strings.SplitSeq(s, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(item))
		if err != nil {
			return nil, fmt.Errorf("-platforms %q: %w", item, err)
		}
		if p.OS != "linux" || p.Architecture == "" {
			return nil, fmt.Errorf("-platforms %q: only linux/<arch> images are built", item)
		}
		if p.Architecture == "arm64" && p.Variant == "" {
			p.Variant = "v8"
		}
		if slices.ContainsFunc(out, p.Equals) {
			return nil, fmt.Errorf("-platforms: %s twice", p.String())
		}
		out = append(out, *p)
	}
	return out, nil
}

// parseBinaries reads a comma-separated subset of allBinaries.
func parseBinaries(s string) ([]string, error) {
	var out []string
	for b := range strings.SplitSeq(s, ",") {
		b = strings.TrimSpace(b)
		if !slices.Contains(allBinaries, b) {
			return nil, fmt.Errorf("-binaries: %q is not one of %s", b, strings.Join(allBinaries, ", "))
		}
		if slices.Contains(out, b) {
			return nil, fmt.Errorf("-binaries: %s twice", b)
		}
		out = append(out, b)
	}
	return out, nil
}
