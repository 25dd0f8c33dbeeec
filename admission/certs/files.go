package certs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// fileModes are the files written into the certificate folder, in the order they are
// written: the bundle, then the key, then the certificate. controller-runtime's
// certwatcher re-reads the pair on every change of either file and keeps serving the
// pair it has while the two do not match, so the moment between the key's and the
// certificate's rename is harmless.
var fileModes = []struct {
	key  string
	mode fs.FileMode
}{
	{KeyCABundle, 0o644},
	{KeyKey, 0o600},
	{KeyCert, 0o644},
}

// writeFiles writes each of the Secret's tls.crt, tls.key and ca.crt into dir that
// differs from the file there, atomically (a temporary file in dir renamed over it),
// and returns the names it wrote.
func writeFiles(dir string, data map[string][]byte) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make the certificate folder: %w", err)
	}
	var written []string
	for _, f := range fileModes {
		path := filepath.Join(dir, f.key)
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return written, fmt.Errorf("read %s: %w", path, err)
		}
		if err == nil && bytes.Equal(old, data[f.key]) {
			continue
		}
		if err := writeAtomic(path, data[f.key], f.mode); err != nil {
			return written, err
		}
		written = append(written, f.key)
	}
	return written, nil
}

// writeAtomic replaces path with data: readers see the old file or the new one, never
// a part.
func writeAtomic(path string, data []byte, mode fs.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
