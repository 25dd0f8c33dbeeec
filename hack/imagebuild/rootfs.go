package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The unprivileged user and group the images run as (distroless's nonroot).
const (
	nonrootID   = 65532
	nonrootUser = "65532:65532"
)

// Paths inside the images.
const (
	binDir      = "/usr/local/bin"
	caBundle    = "/etc/ssl/certs/ca-certificates.crt"
	nonrootHome = "/home/nonroot"
)

// entry is one file or folder of a layer. Owners default to root.
type entry struct {
	path     string // absolute, without a trailing slash
	dir      bool
	mode     int64
	uid, gid int
	data     []byte
}

func dir(path string, mode int64) entry            { return entry{path: path, dir: true, mode: mode} }
func file(path string, mode int64, b []byte) entry { return entry{path: path, mode: mode, data: b} }

// baseLayer holds what every image shares: the users, the CA bundle, a
// home for nonroot and a /tmp.
func baseLayer(created time.Time) (v1.Layer, error) {
	home := dir(nonrootHome, 0o700)
	home.uid, home.gid = nonrootID, nonrootID
	return layer(created, []entry{
		dir("/etc", 0o755),
		file("/etc/group", 0o644, []byte(groupFile)),
		file("/etc/passwd", 0o644, []byte(passwdFile)),
		dir("/etc/ssl", 0o755),
		dir("/etc/ssl/certs", 0o755),
		file(caBundle, 0o644, caBundlePEM()),
		dir("/home", 0o755),
		home,
		dir("/tmp", 0o1777),
	})
}

// binaryLayer holds binaries at /usr/local/bin/<name>: names[i] read from
// files[i].
func binaryLayer(created time.Time, names, files []string) (v1.Layer, error) {
	entries := []entry{
		dir("/usr", 0o755),
		dir("/usr/local", 0o755),
		dir(binDir, 0o755),
	}
	for i, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("read binary: %w", err)
		}
		entries = append(entries, file(binDir+"/"+names[i], 0o755, b))
	}
	return layer(created, entries)
}

const passwdFile = `root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
`

const groupFile = `root:x:0:
nobody:x:65534:
nonroot:x:65532:
`

// caBundlePEM is Mozilla's root store as the Go team publishes it in
// golang.org/x/crypto/x509roots/fallback, pinned by go.sum: the same bytes
// on every machine. Roots that NSS distrusts after a date are left out, as
// a PEM bundle cannot carry that constraint.
func caBundlePEM() []byte {
	var b bytes.Buffer
	b.WriteString("# Mozilla's root store (NSS), from golang.org/x/crypto/x509roots/fallback/bundle.\n")
	b.WriteString("# Roots distrusted after a date are left out.\n")
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		// pem.Encode into a bytes.Buffer cannot fail.
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	return b.Bytes()
}

// layer builds a gzip-compressed OCI layer of entries, in their order, every
// header with the same time and fixed owners and modes.
func layer(created time.Time, entries []entry) (v1.Layer, error) {
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for _, e := range entries {
		if err := writeEntry(tw, created, e); err != nil {
			return nil, fmt.Errorf("write %s into a layer: %w", e.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		return nil, fmt.Errorf("compress layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compress layer: %w", err)
	}
	compressed := gz.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("make layer: %w", err)
	}
	return l, nil
}

func writeEntry(tw *tar.Writer, created time.Time, e entry) error {
	h := &tar.Header{
		Name:     e.path[1:],
		Mode:     e.mode,
		Uid:      e.uid,
		Gid:      e.gid,
		ModTime:  created,
		Typeflag: tar.TypeReg,
		Size:     int64(len(e.data)),
		Format:   tar.FormatUSTAR,
	}
	if e.dir {
		h.Name += "/"
		h.Typeflag = tar.TypeDir
		h.Size = 0
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(e.data)
	return err
}
