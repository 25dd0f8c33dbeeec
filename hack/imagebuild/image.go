package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const sourceURL = "https://github.com/berthfleet/berth"

// imageMeta describes what one binary's images are.
type imageMeta struct {
	binary   string
	version  string
	revision string
	created  time.Time
}

// labels are the OCI annotations of the image, as labels of its config.
func (m imageMeta) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    m.binary,
		"org.opencontainers.image.version":  m.version,
		"org.opencontainers.image.revision": m.revision,
		"org.opencontainers.image.source":   sourceURL,
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
}

// annotations are the labels and the creation time, for the index.
func (m imageMeta) annotations() map[string]string {
	a := m.labels()
	a["org.opencontainers.image.created"] = m.created.UTC().Format(time.RFC3339)
	return a
}

// config is the image's runtime configuration: the binary as entrypoint,
// run as nonroot from /.
func (m imageMeta) config() v1.Config {
	return v1.Config{
		Entrypoint: []string{binDir + "/" + m.binary},
		Env:        []string{"PATH=" + binDir + ":/usr/bin:/bin"},
		User:       nonrootUser,
		WorkingDir: "/",
		Labels:     m.labels(),
	}
}

// platformImage is one platform's image of a binary.
type platformImage struct {
	platform v1.Platform
	image    v1.Image
}

// buildImage lays the binary (files[0], the entrypoint) and its companions
// (the rest, named by their files' base names) over the base layer on an
// empty image.
func buildImage(m imageMeta, p v1.Platform, base v1.Layer, files []string) (v1.Image, error) {
	names := []string{m.binary}
	for _, f := range files[1:] {
		names = append(names, filepath.Base(f))
	}
	bin, err := binaryLayer(m.created, names, files)
	if err != nil {
		return nil, fmt.Errorf("layer of %s for %s: %w", m.binary, p.String(), err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: p.Architecture,
		OS:           p.OS,
		Variant:      p.Variant,
		Created:      v1.Time{Time: m.created},
		Config:       m.config(),
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("configure image of %s: %w", m.binary, err)
	}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: m.history("users, CA certificates, /home/nonroot and /tmp")},
		mutate.Addendum{Layer: bin, History: m.history(binDir + "/{" + strings.Join(names, ",") + "}")})
	if err != nil {
		return nil, fmt.Errorf("add layers to image of %s: %w", m.binary, err)
	}
	return img, nil
}

func (m imageMeta) history(what string) v1.History {
	return v1.History{Created: v1.Time{Time: m.created}, CreatedBy: "hack/imagebuild: " + what}
}

// buildIndex gathers the platforms' images into one OCI image index.
func buildIndex(m imageMeta, images []platformImage) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pi := range images {
		p := pi.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        pi.image,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	withAnnotations, ok := mutate.Annotations(idx, m.annotations()).(v1.ImageIndex)
	if !ok {
		return nil, fmt.Errorf("annotate index of %s: not an index", m.binary)
	}
	return withAnnotations, nil
}

// describeImage is the progress line of one image: its digest and size.
func describeImage(img v1.Image) (string, error) {
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("digest image: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return "", fmt.Errorf("list layers: %w", err)
	}
	var size int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return "", fmt.Errorf("size layer: %w", err)
		}
		size += s
	}
	return fmt.Sprintf("manifest %s, %.1f MiB compressed", digest, float64(size)/(1<<20)), nil
}
