// Package leaseapitest runs a real lease API inside a test's process, as
// net/http/httptest runs an HTTP server: the lease service and HTTP server of
// leaseapi on a SQLite store in the test's temporary folder, behind httptest,
// closed when the test ends. It also writes the token files that berth-leaseapi
// and the lease API's clients read. Tests of the server itself, which need its
// internals, keep their own fixture in package server; tests of the binary run
// berth-leaseapi as a process (test/process).
package leaseapitest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/satoken"
	"github.com/berthfleet/berth/leaseapi/server"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// Options shape the lease API. The zero value serves plain HTTP without
// authentication, as berth-leaseapi does on loopback without a token file.
type Options struct {
	// Tokens maps a subject to its bearer token. When empty, requests are not
	// authenticated.
	Tokens map[string]string
	// Admins are the subjects that may cordon clusters and release any lease.
	Admins []string
	// TLS serves HTTPS with httptest's certificate; Server.Client trusts it.
	TLS bool
	// ServiceAccountKeysDir, when set, lets Pods confirm leases with their
	// service account tokens, verified against the "<cluster-id>.json"
	// JWKS files of the folder (berth-leaseapi's --service-account-keys-dir;
	// satokentest makes them). It takes effect only with Tokens.
	ServiceAccountKeysDir string
}

// Server is a lease API serving on a loopback port until the test ends.
type Server struct {
	*httptest.Server
	// TokenFiles maps each subject of Options.Tokens to a file holding its token.
	TokenFiles map[string]string
	caFile     string
}

// Handler returns a real lease API on a fresh SQLite store, for a test that
// wraps it or serves it itself.
func Handler(t testing.TB, opts Options) http.Handler {
	t.Helper()
	handler, _ := newHandler(t, opts)
	return handler
}

func newHandler(t testing.TB, opts Options) (http.Handler, map[string]string) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "leases.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var (
		tf         *server.TokenFile
		tokenFiles map[string]string
	)
	if len(opts.Tokens) > 0 {
		var path string
		if path, tokenFiles, err = WriteTokens(t.TempDir(), opts.Tokens); err != nil {
			t.Fatal(err)
		}
		if tf, err = server.LoadTokenFile(path); err != nil {
			t.Fatal(err)
		}
	}
	auth := server.NewAuthenticator(tf, false, opts.Admins)
	if opts.ServiceAccountKeysDir != "" {
		keys, err := satoken.LoadDir(opts.ServiceAccountKeysDir)
		if err != nil {
			t.Fatal(err)
		}
		auth.AcceptServiceAccounts(satoken.NewVerifier(keys, nil))
	}
	srv := server.New(server.Config{
		Service: lease.NewService(st, lease.Options{}),
		Store:   st,
		Auth:    auth,
		Log:     logr.Discard(),
	})
	// As berth-leaseapi does: expired terms are freed within a second, and
	// the change stream reports it.
	go srv.RunSweeper(t.Context())
	return srv.Handler(), tokenFiles
}

// Start serves a real lease API on a fresh SQLite store until the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	handler, tokenFiles := newHandler(t, opts)
	s := &Server{TokenFiles: tokenFiles}
	if opts.TLS {
		s.Server = httptest.NewTLSServer(handler)
		s.caFile = filepath.Join(t.TempDir(), "ca.pem")
		ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
		if err := os.WriteFile(s.caFile, ca, 0o600); err != nil {
			t.Fatal(err)
		}
	} else {
		s.Server = httptest.NewServer(handler)
	}
	t.Cleanup(s.Close)
	return s
}

// CAFile is the path of a PEM file with the server's certificate ("" without TLS).
func (s *Server) CAFile() string { return s.caFile }

// Client returns a lease API client of the server: cfg with the server's URL
// and, over TLS, its CA file, unless cfg names its own.
func (s *Server) Client(t testing.TB, cfg client.Config) *client.Client {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = s.URL
	}
	if cfg.CAFile == "" {
		cfg.CAFile = s.caFile
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteTokens writes a token file for the lease API (one
// `<subject>:<sha256-hex-of-token>` line per subject) into dir as "tokens",
// and for each subject a file `<subject>.token` holding its token, as a
// client's --lease-api-token-file reads it. It returns the path of the token
// file and the path of each subject's token.
func WriteTokens(dir string, tokens map[string]string) (tokenFile string, subjectFiles map[string]string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	subjectFiles = map[string]string{}
	var lines strings.Builder
	for _, subject := range slices.Sorted(maps.Keys(tokens)) {
		token := tokens[subject]
		sum := sha256.Sum256([]byte(token))
		fmt.Fprintf(&lines, "%s:%s\n", subject, hex.EncodeToString(sum[:]))
		path := filepath.Join(dir, subject+".token")
		if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
			return "", nil, fmt.Errorf("write token of %s: %w", subject, err)
		}
		subjectFiles[subject] = path
	}
	tokenFile = filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokenFile, []byte(lines.String()), 0o600); err != nil {
		return "", nil, fmt.Errorf("write token file: %w", err)
	}
	return tokenFile, subjectFiles, nil
}
