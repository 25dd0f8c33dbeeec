package leaseapitest_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
)

func TestStart(t *testing.T) {
	cases := map[string]struct {
		opts       leaseapitest.Options
		subject    string // acts with this subject's token file; "" for none
		wantHolder string
		wantErr    error
		wantHTTPS  bool
		wantCAFile bool
		wantTokens int
	}{
		"plain, no authentication": {opts: leaseapitest.Options{}, wantHolder: "east"},
		"tokens: a subject acts as itself": {
			opts:    leaseapitest.Options{Tokens: map[string]string{"east": "e", "west": "w"}},
			subject: "east", wantHolder: "east", wantTokens: 2,
		},
		"tokens: a subject cannot act as another": {
			opts:    leaseapitest.Options{Tokens: map[string]string{"east": "e", "west": "w"}},
			subject: "west", wantErr: client.ErrForbidden, wantTokens: 2,
		},
		"tokens: no token is unauthorized": {
			opts:    leaseapitest.Options{Tokens: map[string]string{"east": "e"}},
			wantErr: client.ErrUnauthorized, wantTokens: 1,
		},
		"TLS, trusted by its client": {opts: leaseapitest.Options{TLS: true}, wantHolder: "east", wantHTTPS: true, wantCAFile: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := leaseapitest.Start(t, tc.opts)
			if got := strings.HasPrefix(s.URL, "https://"); got != tc.wantHTTPS {
				t.Errorf("URL %s, want HTTPS %v", s.URL, tc.wantHTTPS)
			}
			if got := s.CAFile() != ""; got != tc.wantCAFile {
				t.Errorf("CA file %q, want one %v", s.CAFile(), tc.wantCAFile)
			}
			if len(s.TokenFiles) != tc.wantTokens {
				t.Errorf("%d token files, want %d", len(s.TokenFiles), tc.wantTokens)
			}
			c := s.Client(t, client.Config{TokenFile: s.TokenFiles[tc.subject], RetryMax: -1})
			res, err := c.Acquire(t.Context(), "ns", "a", "east", time.Minute)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("acquire: %v, want %v", err, tc.wantErr)
			}
			if res.Holder != tc.wantHolder {
				t.Errorf("holder %q, want %q", res.Holder, tc.wantHolder)
			}
		})
	}
}

func TestWriteTokens(t *testing.T) {
	dir := t.TempDir()
	tokenFile, files, err := leaseapitest.WriteTokens(dir, map[string]string{"west": "w-token", "east": "e-token"})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	// sha256("e-token") and sha256("w-token"), subjects in order.
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "east:") || !strings.HasPrefix(lines[1], "west:") || len(lines[0]) != len("east:")+64 {
		t.Errorf("token file:\n%s\nwant an east and a west line with a SHA-256 in hex", data)
	}
	for subject, want := range map[string]string{"east": "e-token", "west": "w-token"} {
		got, err := os.ReadFile(files[subject])
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("token file of %s: %q, %v; want %q", subject, got, err, want)
		}
	}
}
