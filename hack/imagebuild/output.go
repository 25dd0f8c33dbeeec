package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Annotations of the index's entry in index.json: the tag that
// `skopeo copy oci:<dir>:<tag>` names, and the full name containerd's
// import gives the image.
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

// writeLayout replaces dir with an OCI image layout whose index.json holds
// one entry, the multi-platform index, and returns the index's digest.
func writeLayout(dir string, ref name.Tag, idx v1.ImageIndex) (v1.Hash, error) {
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("digest index of %s: %w", ref, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, fmt.Errorf("clear %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("create layout %s: %w", dir, err)
	}
	err = p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		annotationRefName:       ref.TagStr(),
		annotationContainerdRef: ref.Name(),
	}))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	return digest, nil
}

// writeTarball writes one platform's image as a docker-save tarball tagged
// ref, through a temporary file so that a failed run leaves no torn file.
func writeTarball(file string, ref name.Tag, img v1.Image) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("create output folder: %w", err)
	}
	tmp := file + ".partial"
	if err := tarball.MultiRefWriteToFile(tmp, map[name.Reference]v1.Image{ref: img}); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}
