package satoken

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/berthfleet/berth/leaseapi"
)

// KeySets holds the service account signing keys of the fleet's clusters,
// read from a directory of "<cluster-id>.json" files, each a JWKS exactly as
// that cluster's kube-apiserver serves it at /openid/v1/jwks. Other files
// are ignored, and so are names starting with "." (a Secret or ConfigMap
// mount keeps its "..data" links there). Reload swaps the whole set
// atomically: a bad file leaves the previous keys of every cluster in force.
type KeySets struct {
	dir  string
	sets atomic.Pointer[map[string]*jose.JSONWebKeySet]
}

// LoadDir reads the key sets of dir.
func LoadDir(dir string) (*KeySets, error) {
	k := &KeySets{dir: dir}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload re-reads the directory; on error the previous keys stay in force.
func (k *KeySets) Reload() error {
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return fmt.Errorf("read service account keys: %w", err)
	}
	sets := map[string]*jose.JSONWebKeySet{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(k.dir, name)
		// Stat follows the symbolic links a Secret mount is made of.
		info, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("service account keys %s: %w", path, err)
		}
		if info.IsDir() {
			continue
		}
		cluster := strings.TrimSuffix(name, ".json")
		if err := leaseapi.ValidateClusterID(cluster); err != nil {
			return fmt.Errorf("service account keys %s: the file's name is not <cluster-id>.json: %w", path, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read service account keys: %w", err)
		}
		set, err := ParseKeySet(data)
		if err != nil {
			return fmt.Errorf("service account keys %s: %w", path, err)
		}
		sets[cluster] = set
	}
	k.sets.Store(&sets)
	return nil
}

// Clusters names the clusters whose keys are in force, sorted.
func (k *KeySets) Clusters() []string {
	out := make([]string, 0, len(*k.sets.Load()))
	for id := range *k.sets.Load() {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// keys returns cluster's key set.
func (k *KeySets) keys(cluster string) (*jose.JSONWebKeySet, bool) {
	set, ok := (*k.sets.Load())[cluster]
	return set, ok
}

// ParseKeySet reads a JWKS of service account signing keys: at least one
// key, each an RSA or ECDSA public key with a key id (a kube-apiserver
// names every key it signs with). A private or symmetric key is refused, so
// that a mistaken file cannot put a signing secret on the lease API.
func ParseKeySet(data []byte) (*jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("not a JWKS: %w", err)
	}
	if len(set.Keys) == 0 {
		return nil, errors.New("the JWKS holds no key")
	}
	for i, key := range set.Keys {
		switch key.Key.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey:
		default:
			return nil, fmt.Errorf("key %d (kid %q): want an RSA or ECDSA public key, got %T", i, key.KeyID, key.Key)
		}
		if key.KeyID == "" {
			return nil, fmt.Errorf("key %d has no key id (kid)", i)
		}
		if key.Use != "" && key.Use != "sig" {
			return nil, fmt.Errorf("key %d (kid %q) is for %q, not for signatures", i, key.KeyID, key.Use)
		}
	}
	return &set, nil
}
