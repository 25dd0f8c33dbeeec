package fence

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The environment variables of the contract between admission (or whoever
// runs berth-fence) and berth-fence exec.
const (
	// EnvLeaseAPIURL is the lease API's base URL (required).
	EnvLeaseAPIURL = "BERTH_LEASE_API_URL"
	// EnvLeaseAPICA is the PEM text of the CA bundle that verifies the lease
	// API's certificate (optional: the system roots otherwise). A value not
	// starting with "-----BEGIN" is read as the path of a PEM file.
	EnvLeaseAPICA = "BERTH_LEASE_API_CA"
	// EnvLeaseNamespace and EnvLeaseName are the lease's key at the lease
	// API (required).
	EnvLeaseNamespace = "BERTH_LEASE_NAMESPACE"
	EnvLeaseName      = "BERTH_LEASE_NAME"
	// EnvTokenFile is the bearer token's file, the Pod's projected service
	// account token, re-read when the kubelet rotates it (required).
	EnvTokenFile = "BERTH_FENCE_TOKEN_FILE"
	// EnvHolderFile and EnvFencingTokenFile are the downward-API files of
	// the Pod's annotations berth.skaphos.io/holder and
	// berth.skaphos.io/fencing-token (required).
	EnvHolderFile       = "BERTH_FENCE_HOLDER_FILE"
	EnvFencingTokenFile = "BERTH_FENCE_FENCING_TOKEN_FILE"

	// EnvFencePrefix starts every variable that configures berth-fence
	// alone; they are removed from the child's environment.
	EnvFencePrefix = "BERTH_FENCE_"

	// EnvChildFencingToken and EnvChildHolder are set in the child's
	// environment: the confirmed term's fencing token and holder, for the
	// workload to fence its own writes downstream.
	EnvChildFencingToken = "BERTH_FENCING_TOKEN"
	EnvChildHolder       = "BERTH_HOLDER"
)

// EnvConfig is berth-fence exec's configuration, from its environment.
type EnvConfig struct {
	URL, CA                    string
	Namespace, Name            string
	TokenFile                  string
	HolderFile, TokenOfPodFile string
}

// ErrConfig marks a configuration error (exit code ExitConfig).
var ErrConfig = errors.New("configuration")

// ConfigFromEnv reads the configuration through getenv (os.Getenv).
func ConfigFromEnv(getenv func(string) string) (EnvConfig, error) {
	c := EnvConfig{
		URL:            getenv(EnvLeaseAPIURL),
		CA:             getenv(EnvLeaseAPICA),
		Namespace:      getenv(EnvLeaseNamespace),
		Name:           getenv(EnvLeaseName),
		TokenFile:      getenv(EnvTokenFile),
		HolderFile:     getenv(EnvHolderFile),
		TokenOfPodFile: getenv(EnvFencingTokenFile),
	}
	var missing []string
	for _, v := range []struct{ name, value string }{
		{EnvLeaseAPIURL, c.URL}, {EnvLeaseNamespace, c.Namespace}, {EnvLeaseName, c.Name},
		{EnvTokenFile, c.TokenFile}, {EnvHolderFile, c.HolderFile}, {EnvFencingTokenFile, c.TokenOfPodFile},
	} {
		if v.value == "" {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return c, fmt.Errorf("%w: %s not set", ErrConfig, strings.Join(missing, ", "))
	}
	return c, nil
}

// CAPEM returns the CA bundle's PEM text: the variable's value, or the
// file it names. Empty when none is configured.
func (c EnvConfig) CAPEM() ([]byte, error) {
	if c.CA == "" || strings.HasPrefix(strings.TrimSpace(c.CA), "-----BEGIN") {
		return []byte(c.CA), nil
	}
	b, err := os.ReadFile(c.CA)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, EnvLeaseAPICA, err)
	}
	return b, nil
}

// ChildEnv is the child's environment: environ without berth-fence's own
// variables (BERTH_FENCE_*, the CA bundle) and without any earlier
// BERTH_FENCING_TOKEN or BERTH_HOLDER, then those two set to the confirmed
// term's.
func ChildEnv(environ []string, holder string, token int32) []string {
	out := make([]string, 0, len(environ)+2)
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvFencePrefix) || name == EnvLeaseAPICA ||
			name == EnvChildFencingToken || name == EnvChildHolder {
			continue
		}
		out = append(out, kv)
	}
	return append(out, EnvChildFencingToken+"="+strconv.FormatInt(int64(token), 10), EnvChildHolder+"="+holder)
}
