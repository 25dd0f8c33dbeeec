package fence

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Identity is the term a Pod was ungated for: the holder and fencing token
// the agent wrote into its annotations.
type Identity struct {
	Holder string
	Token  int32
}

// errNotYet: an identity file is missing or empty; the kubelet may not have
// written the annotation's value yet.
var errNotYet = errors.New("not written yet")

// FileIdentity reads the identity from the downward-API files of the Pod's
// annotations berth.skaphos.io/holder and berth.skaphos.io/fencing-token.
type FileIdentity struct {
	HolderFile, TokenFile string
}

// Read reads both files. A missing or empty file is an error wrapping
// errNotYet; a token that is not a positive int32 is an error too (the
// caller waits either way: the annotation may still change).
func (f FileIdentity) Read() (Identity, error) {
	holder, err := readTrimmed(f.HolderFile)
	if err != nil {
		return Identity{}, err
	}
	raw, err := readTrimmed(f.TokenFile)
	if err != nil {
		return Identity{}, err
	}
	token, err := strconv.ParseInt(raw, 10, 32)
	if err != nil || token < 1 {
		return Identity{}, fmt.Errorf("fencing token %q in %s: not a positive int32", raw, f.TokenFile)
	}
	return Identity{Holder: holder, Token: int32(token)}, nil
}

func readTrimmed(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s: %w", path, errNotYet)
	}
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s: %w", path, errNotYet)
	}
	return s, nil
}
