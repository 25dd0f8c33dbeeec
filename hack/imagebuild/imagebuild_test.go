package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"encoding/pem"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const (
	testVersion = "v0.0.0-imagetest"
	testEpoch   = "1767225600" // 2026-01-01T00:00:00Z
)

// TestImages builds every image twice, from the repository that holds this
// module, and requires the same digests and the same tarball bytes both
// times; then it looks inside the first build's images: the binaries run
// (on this machine's architecture) and print the version, are static ELF
// files of the right machine, and the users, CA bundle, config and tar
// headers are what docs/images.md promises.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries for two platforms")
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	var builds [2][]result
	for i, dir := range dirs {
		cfg, err := parseFlags(t.Context(), []string{"-repo-root", "../..", "-out", dir,
			"-version", testVersion, "-source-date-epoch", testEpoch})
		if err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		start := time.Now()
		builds[i], err = build(t.Context(), cfg, &log)
		if err != nil {
			t.Fatalf("build %d: %v", i+1, err)
		}
		t.Logf("build %d took %s:\n%s", i+1, time.Since(start).Round(time.Millisecond), log.String())
	}
	if diff := cmp.Diff(digests(builds[0]), digests(builds[1])); diff != "" {
		t.Errorf("index digests differ between two builds of the same tree (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(fileHashes(t, dirs[0]), fileHashes(t, dirs[1])); diff != "" {
		t.Errorf("output files differ between two builds (-first +second):\n%s", diff)
	}
	if len(builds[0]) != len(allBinaries) {
		t.Fatalf("built %d images, want %d", len(builds[0]), len(allBinaries))
	}
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, r := range builds[0] {
		t.Run(r.name, func(t *testing.T) {
			for _, pi := range readLayout(t, filepath.Join(dirs[0], r.name), r) {
				t.Run(pi.platform.Architecture, func(t *testing.T) {
					checkConfig(t, r.name, pi, created)
					checkTarball(t, filepath.Join(dirs[0], tarballName(r.name, testVersion, pi.platform)), r.ref, pi.image)
					files := unpack(t, pi.image)
					checkFiles(t, files, created)
					checkBinary(t, r.name, pi.platform, files[binDir[1:]+"/"+r.name].data)
					for _, c := range companions[r.name] {
						checkBinary(t, c, pi.platform, files[binDir[1:]+"/"+c].data)
					}
				})
			}
		})
	}
}

func digests(rs []result) map[string]string {
	out := make(map[string]string)
	for _, r := range rs {
		out[r.ref.String()] = r.digest.String()
	}
	return out
}

// fileHashes is the SHA-256 of every file under dir, by relative path.
func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		sum := sha256.Sum256(b)
		out[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readLayout reads an OCI layout back and checks its one entry is the
// built index, named by its tag, with an image for each default platform.
func readLayout(t *testing.T, dir string, r result) []platformImage {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d entries, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Digest != r.digest || desc.Annotations[annotationRefName] != testVersion || !desc.MediaType.IsIndex() {
		t.Errorf("index.json entry %s %s ref.name %q, want the index %s named %q",
			desc.MediaType, desc.Digest, desc.Annotations[annotationRefName], r.digest, testVersion)
	}
	idx, err := top.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var out []platformImage
	var got []string
	for _, d := range m.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d.Platform.String())
		out = append(out, platformImage{platform: *d.Platform, image: img})
	}
	if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64/v8"}, got); diff != "" {
		t.Errorf("platforms of the index (-want +got):\n%s", diff)
	}
	if m.Annotations["org.opencontainers.image.version"] != testVersion {
		t.Errorf("index annotations %v, want version %s", m.Annotations, testVersion)
	}
	return out
}

func checkConfig(t *testing.T, binary string, pi platformImage, created time.Time) {
	t.Helper()
	cf, err := pi.image.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	type summary struct {
		Platform                   string
		Created                    time.Time
		User, WorkingDir           string
		Entrypoint                 []string
		Title, Version, Source, Li string
	}
	l := cf.Config.Labels
	got := summary{cf.Platform().String(), cf.Created.UTC(), cf.Config.User, cf.Config.WorkingDir, cf.Config.Entrypoint,
		l["org.opencontainers.image.title"], l["org.opencontainers.image.version"], l["org.opencontainers.image.source"],
		l["org.opencontainers.image.licenses"]}
	want := summary{pi.platform.String(), created, "65532:65532", "/", []string{"/usr/local/bin/" + binary},
		binary, testVersion, "https://github.com/berthfleet/berth", "Apache-2.0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if len(l["org.opencontainers.image.revision"]) != 40 {
		t.Errorf("revision label %q, want a commit", l["org.opencontainers.image.revision"])
	}
}

// checkTarball reads the docker-save tarball back by its tag and requires
// the same config and layers as the image in the layout.
func checkTarball(t *testing.T, file string, ref name.Tag, img v1.Image) {
	t.Helper()
	fromTar, err := tarball.ImageFromPath(file, &ref)
	if err != nil {
		t.Fatalf("read %s as %s: %v", filepath.Base(file), ref, err)
	}
	want, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	got, err := fromTar.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	digestsOf := func(m *v1.Manifest) []string {
		out := []string{m.Config.Digest.String()}
		for _, l := range m.Layers {
			out = append(out, l.Digest.String())
		}
		return out
	}
	if diff := cmp.Diff(digestsOf(want), digestsOf(got)); diff != "" {
		t.Errorf("config and layers of %s (-layout +tarball):\n%s", filepath.Base(file), diff)
	}
}

type unpacked struct {
	hdr  tar.Header
	data []byte
}

// unpack flattens the image's layers and reads every entry.
func unpack(t *testing.T, img v1.Image) map[string]unpacked {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := make(map[string]unpacked)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = unpacked{hdr: *h, data: data}
	}
}

// checkFiles checks the file tree: owners, modes and times fixed, the users
// and the CA bundle in place.
func checkFiles(t *testing.T, files map[string]unpacked, created time.Time) {
	t.Helper()
	type meta struct {
		Mode     int64
		UID, GID int
	}
	want := map[string]meta{
		"etc": {0o755, 0, 0}, "etc/passwd": {0o644, 0, 0}, "etc/group": {0o644, 0, 0},
		"etc/ssl": {0o755, 0, 0}, "etc/ssl/certs": {0o755, 0, 0}, "etc/ssl/certs/ca-certificates.crt": {0o644, 0, 0},
		"home": {0o755, 0, 0}, "home/nonroot": {0o700, 65532, 65532}, "tmp": {0o1777, 0, 0},
		"usr": {0o755, 0, 0}, "usr/local": {0o755, 0, 0}, "usr/local/bin": {0o755, 0, 0},
	}
	got := make(map[string]meta)
	for p, f := range files {
		if !f.hdr.ModTime.Equal(created) {
			t.Errorf("%s: mtime %s, want %s", p, f.hdr.ModTime.UTC(), created)
		}
		if strings.HasPrefix(p, "usr/local/bin/") {
			if f.hdr.Mode != 0o755 || f.hdr.Uid != 0 || f.hdr.Gid != 0 {
				t.Errorf("%s: mode %o owner %d:%d, want 755 0:0", p, f.hdr.Mode, f.hdr.Uid, f.hdr.Gid)
			}
			continue
		}
		got[p] = meta{f.hdr.Mode, f.hdr.Uid, f.hdr.Gid}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files besides the binary (-want +got):\n%s", diff)
	}
	for file, line := range map[string]string{
		"etc/passwd": "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":  "nonroot:x:65532:\n",
	} {
		if !strings.Contains(string(files[file].data), line) {
			t.Errorf("%s lacks %q:\n%s", file, line, files[file].data)
		}
	}
	if n := countCerts(t, files["etc/ssl/certs/ca-certificates.crt"].data); n < 100 {
		t.Errorf("CA bundle holds %d certificates, want Mozilla's (over 100)", n)
	}
}

func countCerts(t *testing.T, b []byte) int {
	t.Helper()
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return n
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("CA bundle certificate %d: %v", n+1, err)
		}
		n++
	}
}

// checkBinary checks the binary is a static ELF file for the platform and,
// when this machine can run it, that --version prints the version.
func checkBinary(t *testing.T, binary string, p v1.Platform, b []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: not an ELF file: %v", binary, err)
	}
	wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[p.Architecture]
	if f.Machine != wantMachine {
		t.Errorf("%s for %s: ELF machine %s, want %s", binary, p.Architecture, f.Machine, wantMachine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s for %s has a program interpreter: not static", binary, p.Architecture)
		}
	}
	if p.Architecture != runtime.GOARCH || runtime.GOOS != "linux" {
		t.Logf("%s for %s: not run on %s/%s", binary, p.Architecture, runtime.GOOS, runtime.GOARCH)
		return
	}
	file := filepath.Join(t.TempDir(), binary)
	if err := os.WriteFile(file, b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), file, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", binary, err, out)
	}
	if got, want := string(out), binary+" "+testVersion+"\n"; got != want {
		t.Errorf("%s --version printed %q, want %q", binary, got, want)
	}
}

func TestParsePlatforms(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    []string
		wantErr bool
	}{
		"defaults":         {in: "linux/amd64,linux/arm64", want: []string{"linux/amd64", "linux/arm64/v8"}},
		"spaces":           {in: " linux/arm64 ", want: []string{"linux/arm64/v8"}},
		"arm with variant": {in: "linux/arm/v7", want: []string{"linux/arm/v7"}},
		"not linux":        {in: "windows/amd64", wantErr: true},
		"twice":            {in: "linux/arm64,linux/arm64/v8", wantErr: true},
		"empty":            {in: "", wantErr: true},
		"no architecture":  {in: "linux", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ps, err := parsePlatforms(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %t", err, tc.wantErr)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("platforms (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseBinaries(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    []string
		wantErr bool
	}{
		"all":     {in: "berth-agent,berth-leaseapi,berthctl", want: allBinaries},
		"one":     {in: "berthctl", want: []string{"berthctl"}},
		"unknown": {in: "berthctl,kubectl", wantErr: true},
		"twice":   {in: "berthctl, berthctl", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseBinaries(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %t", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("binaries (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTarballName(t *testing.T) {
	cases := map[string]struct {
		p    v1.Platform
		want string
	}{
		"amd64":    {p: v1.Platform{OS: "linux", Architecture: "amd64"}, want: "berthctl-v1.2.3-linux-amd64.tar"},
		"arm64/v8": {p: v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}, want: "berthctl-v1.2.3-linux-arm64.tar"},
		"arm/v7":   {p: v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}, want: "berthctl-v1.2.3-linux-armv7.tar"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tarballName("berthctl", "v1.2.3", tc.p); got != tc.want {
				t.Errorf("tarballName = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCompanions: berth-agent's image carries berth-fence beside it (the
// binary admission's init container copies into fenced Pods), with the
// agent still the entrypoint; the other images carry their binary alone.
func TestCompanions(t *testing.T) {
	if diff := cmp.Diff([]string{"berth-agent", "berthctl", "berth-fence"}, withCompanions([]string{"berth-agent", "berthctl"})); diff != "" {
		t.Errorf("withCompanions (-want +got):\n%s", diff)
	}
	dir := t.TempDir()
	agent, fence := filepath.Join(dir, "berth-agent"), filepath.Join(dir, "berth-fence")
	for f, content := range map[string]string{agent: "agent", fence: "fence"} {
		if err := os.WriteFile(f, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base, err := baseLayer(created)
	if err != nil {
		t.Fatal(err)
	}
	m := imageMeta{binary: "berth-agent", version: testVersion, created: created}
	img, err := buildImage(m, v1.Platform{OS: "linux", Architecture: "amd64"}, base, []string{agent, fence})
	if err != nil {
		t.Fatal(err)
	}
	files := unpack(t, img)
	for name, want := range map[string]string{"usr/local/bin/berth-agent": "agent", "usr/local/bin/berth-fence": "fence"} {
		if got := string(files[name].data); got != want || files[name].hdr.Mode != 0o755 {
			t.Errorf("%s: %q mode %o, want %q mode 755", name, got, files[name].hdr.Mode, want)
		}
	}
	checkFiles(t, files, created)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"/usr/local/bin/berth-agent"}, cf.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
}
