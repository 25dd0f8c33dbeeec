package fence

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// BinaryName is the file name berth-fence installs itself as.
const BinaryName = "berth-fence"

// Install copies the executable at src into dir as BinaryName, mode 0755,
// atomically: written to a temporary file in dir, synced, then renamed, so
// that a container never sees half a binary. It returns the path written.
func Install(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("install: open %s: %w", src, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(dir, "."+BinaryName+"-*")
	if err != nil {
		return "", fmt.Errorf("install: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // after a successful rename: nothing left
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("install: copy to %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("install: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("install: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("install: %w", err)
	}
	dst := filepath.Join(dir, BinaryName)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("install: %w", err)
	}
	return dst, nil
}
