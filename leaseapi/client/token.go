package client

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenFile reads a bearer token from a file and re-reads it when the file
// changes, so that a rotated token (a re-mounted Secret) is picked up without
// a restart.
type tokenFile struct {
	path string

	mu      sync.Mutex
	token   string
	modTime time.Time
	size    int64
}

func (t *tokenFile) get() (string, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && fi.ModTime().Equal(t.modTime) && fi.Size() == t.size {
		return t.token, nil
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", t.path)
	}
	t.token, t.modTime, t.size = token, fi.ModTime(), fi.Size()
	return token, nil
}
