package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/berthfleet/berth/leaseapi"
	"github.com/berthfleet/berth/leaseapi/client"
	"github.com/berthfleet/berth/leaseapi/leaseapitest"
	"github.com/berthfleet/berth/test/binaries"
	"github.com/berthfleet/berth/test/poll"
	"github.com/berthfleet/berth/test/process"
)

func TestMain(m *testing.M) {
	binaries.Main(m, "berthctl", "berth-leaseapi")
}

// Subjects of the test server's token file; ops is an administrator.
var subjects = []string{"east", "west", "ops"}

// server is a running berth-leaseapi with authentication on.
type server struct {
	*process.Process
	url        string
	tokenFiles map[string]string // subject -> file holding its token
}

// startServer runs berth-leaseapi on 127.0.0.1:0 with a token file for
// subjects and waits until it serves.
func startServer(t *testing.T) *server {
	t.Helper()
	dir := t.TempDir()
	tokens := map[string]string{}
	for _, subject := range subjects {
		tokens[subject] = subject + "-secret-token"
	}
	tokenFile, tokenFiles, err := leaseapitest.WriteTokens(dir, tokens)
	if err != nil {
		t.Fatal(err)
	}
	p := process.StartForTest(t, "berth-leaseapi", binaries.Path("berth-leaseapi"), "--listen", "127.0.0.1:0", "--metrics-listen", "",
		"--sqlite-path", filepath.Join(dir, "leases.db"), "--token-file", tokenFile, "--admin-subjects", "ops")
	serving, err := p.AwaitLogged(t.Context(), 30*time.Second, "serving lease API")
	if err != nil {
		t.Fatal(err)
	}
	return &server{Process: p, url: "http://" + serving.String("address"), tokenFiles: tokenFiles}
}

// client is a Go client acting as subject.
func (s *server) client(t *testing.T, subject string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{URL: s.url, TokenFile: s.tokenFiles[subject], RetryMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// registered is a Go client acting as cluster id, which it registered.
func (s *server) registered(t *testing.T, id string) *client.Client {
	t.Helper()
	c := s.client(t, id)
	if _, err := c.RegisterCluster(t.Context(), id, leaseapi.ClusterRegistration{Fingerprint: "uid-" + id}); err != nil {
		t.Fatal(err)
	}
	return c
}

// requests counts the requests the server logged on route (a mux pattern).
func (s *server) requests(route string) int {
	n := 0
	for _, line := range s.Logged("request") {
		if line.String("route") == route {
			n++
		}
	}
	return n
}

// result is one run of berthctl.
type result struct {
	stdout, stderr string
	code           int
}

// berthctl runs the binary with args and an environment of only env.
func berthctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binaries.Path("berthctl"), args...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run berthctl %v: %v", args, err)
	}
	t.Logf("berthctl %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// as is the environment of berthctl acting as subject against s.
func (s *server) as(subject string) map[string]string {
	return map[string]string{"BERTH_SERVER": s.url, "BERTH_TOKEN_FILE": s.tokenFiles[subject]}
}

// wantCode fails the test unless r exited with code; a failure must say why
// on stderr in one line starting "berthctl: ".
func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	if code == 0 {
		if r.stderr != "" {
			t.Errorf("success wrote to stderr: %q", r.stderr)
		}
		return
	}
	if !strings.HasPrefix(r.stderr, "berthctl: ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr %q, want one line starting \"berthctl: \"", r.stderr)
	}
}

// parseTable splits an aligned table into its header and rows of cells.
// Cells hold no spaces, so fields split cleanly.
func parseTable(t *testing.T, out string) (header []string, rows [][]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header = strings.Fields(lines[0])
	for _, l := range lines[1:] {
		cells := strings.Fields(l)
		if len(cells) != len(header) {
			t.Fatalf("row %q has %d cells, header %v has %d", l, len(cells), header, len(header))
		}
		rows = append(rows, cells)
	}
	return header, rows
}

// decodeStrict decodes JSON into v refusing unknown fields, so that the
// output is exactly the wire type.
func decodeStrict(t *testing.T, data string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %T from %q: %v", v, data, err)
	}
}

func TestLeasesGetAndList(t *testing.T) {
	s := startServer(t)
	ctx := t.Context()
	east, west := s.client(t, "east"), s.client(t, "west")
	if _, err := east.Acquire(ctx, "payments", "exporter", "east", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := west.Acquire(ctx, "batch", "nightly", "west/batch", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	res, err := west.Acquire(ctx, "batch", "freed", "west", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := west.Release(ctx, "batch", "freed", "west", res.FencingToken); err != nil {
		t.Fatal(err)
	}
	env := s.as("west") // reads need any valid credential

	t.Run("get table", func(t *testing.T) {
		r := berthctl(t, env, "leases", "get", "payments/exporter")
		wantCode(t, r, 0)
		header, rows := parseTable(t, r.stdout)
		if diff := cmp.Diff([]string{"NAMESPACE", "NAME", "HOLDER", "TOKEN", "EXPIRES"}, header); diff != "" {
			t.Errorf("header (-want +got):\n%s", diff)
		}
		if len(rows) != 1 {
			t.Fatalf("rows %v, want one", rows)
		}
		if diff := cmp.Diff([]string{"payments", "exporter", "east", "1"}, rows[0][:4]); diff != "" {
			t.Errorf("row (-want +got):\n%s", diff)
		}
		// The lease was granted for 60s some seconds ago.
		if exp, err := time.ParseDuration(rows[0][4]); err != nil || exp <= 0 || exp > 60*time.Second {
			t.Errorf("EXPIRES %q, want a duration up to 60s", rows[0][4])
		}
	})

	t.Run("get json and yaml are the wire record", func(t *testing.T) {
		want, err := east.GetLease(ctx, "payments", "exporter")
		if err != nil {
			t.Fatal(err)
		}
		r := berthctl(t, env, "leases", "get", "payments/exporter", "-o", "json")
		wantCode(t, r, 0)
		var got leaseapi.Lease
		decodeStrict(t, r.stdout, &got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("json (-want +got):\n%s", diff)
		}
		r = berthctl(t, env, "leases", "get", "payments/exporter", "--output=yaml")
		wantCode(t, r, 0)
		got = leaseapi.Lease{}
		if err := yaml.UnmarshalStrict([]byte(r.stdout), &got); err != nil {
			t.Fatalf("yaml: %v\n%s", err, r.stdout)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("yaml (-want +got):\n%s", diff)
		}
	})

	t.Run("list all namespaces", func(t *testing.T) {
		r := berthctl(t, env, "leases", "list")
		wantCode(t, r, 0)
		_, rows := parseTable(t, r.stdout)
		want := [][]string{
			{"batch", "freed", "<none>", "1", "<none>"},
			{"batch", "nightly", "west/batch", "1"},
			{"payments", "exporter", "east", "1"},
		}
		if len(rows) != len(want) {
			t.Fatalf("rows %v, want %v", rows, want)
		}
		for i := range want {
			if diff := cmp.Diff(want[i], rows[i][:len(want[i])]); diff != "" {
				t.Errorf("row %d (-want +got):\n%s", i, diff)
			}
		}
	})

	t.Run("list one namespace wide", func(t *testing.T) {
		r := berthctl(t, env, "leases", "list", "-n", "batch", "-o", "wide")
		wantCode(t, r, 0)
		header, rows := parseTable(t, r.stdout)
		if diff := cmp.Diff([]string{"NAMESPACE", "NAME", "HOLDER", "TOKEN", "EXPIRES", "TTL", "ACQUIRED", "RENEWED"}, header); diff != "" {
			t.Errorf("header (-want +got):\n%s", diff)
		}
		if len(rows) != 2 || rows[0][1] != "freed" || rows[1][1] != "nightly" || rows[1][5] != "2m" {
			t.Errorf("rows %v, want batch/freed and batch/nightly with TTL 2m", rows)
		}
	})

	t.Run("get of a lease never seen exits 3", func(t *testing.T) {
		wantCode(t, berthctl(t, env, "leases", "get", "payments/nothing"), 3)
	})
}

func TestLeasesListFollowsPages(t *testing.T) {
	s := startServer(t)
	east := s.client(t, "east")
	const total = 7
	var want []string
	for i := range total {
		name := fmt.Sprintf("job-%02d", i)
		want = append(want, name)
		if _, err := east.Acquire(t.Context(), "paging", name, "east", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := east.Acquire(t.Context(), "other", "job", "east", time.Minute); err != nil {
		t.Fatal(err)
	}
	env := s.as("east")
	names := func(items []leaseapi.Lease) []string {
		var out []string
		for _, l := range items {
			out = append(out, l.Name)
		}
		return out
	}

	t.Run("all pages", func(t *testing.T) {
		before := s.requests("/v1alpha1/leases")
		r := berthctl(t, env, "leases", "list", "-n", "paging", "--chunk-size", "3", "-o", "json")
		wantCode(t, r, 0)
		var got leaseapi.LeaseList
		decodeStrict(t, r.stdout, &got)
		if diff := cmp.Diff(want, names(got.Items)); diff != "" {
			t.Errorf("names (-want +got):\n%s", diff)
		}
		if got.Continue != "" {
			t.Errorf("continue %q after a complete list, want empty", got.Continue)
		}
		// The server logs a request after answering it: give the last line a moment.
		_, _ = poll.Until(t.Context(), 2*time.Second, "the last request logged", poll.Condition(func() bool {
			return s.requests("/v1alpha1/leases")-before >= 3
		}))
		if n := s.requests("/v1alpha1/leases") - before; n != 3 {
			t.Errorf("berthctl made %d list requests for %d leases in pages of 3, want 3", n, total)
		}
	})

	t.Run("limit then continue", func(t *testing.T) {
		r := berthctl(t, env, "leases", "list", "-n", "paging", "--limit", "4", "--chunk-size", "3", "-o", "yaml")
		wantCode(t, r, 0)
		var first leaseapi.LeaseList
		if err := yaml.UnmarshalStrict([]byte(r.stdout), &first); err != nil {
			t.Fatalf("yaml: %v\n%s", err, r.stdout)
		}
		if diff := cmp.Diff(want[:4], names(first.Items)); diff != "" {
			t.Errorf("first 4 (-want +got):\n%s", diff)
		}
		if first.Continue == "" {
			t.Fatal("a limited list has no continue token")
		}
		r = berthctl(t, env, "leases", "list", "-n", "paging", "--continue", first.Continue, "-o", "json")
		wantCode(t, r, 0)
		var rest leaseapi.LeaseList
		decodeStrict(t, r.stdout, &rest)
		if diff := cmp.Diff(want[4:], names(rest.Items)); diff != "" {
			t.Errorf("rest (-want +got):\n%s", diff)
		}
	})

	t.Run("limit in a table", func(t *testing.T) {
		r := berthctl(t, env, "leases", "list", "--limit", "2")
		wantCode(t, r, 0)
		if _, rows := parseTable(t, r.stdout); len(rows) != 2 {
			t.Errorf("%d rows, want 2", len(rows))
		}
	})
}

func TestLeasesRelease(t *testing.T) {
	s := startServer(t)
	ctx := t.Context()
	east := s.client(t, "east")
	held, err := east.Acquire(ctx, "payments", "exporter", "east/payments", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("by a non-admin exits 5 and keeps the lease", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("west"), "leases", "release", "payments/exporter"), 5)
		if l, err := east.GetLease(ctx, "payments", "exporter"); err != nil || l.Holder != "east/payments" {
			t.Fatalf("lease after a refused release: %+v, %v; want still east/payments", l, err)
		}
	})

	t.Run("by an admin revokes another's live lease", func(t *testing.T) {
		for range 2 { // the second finds it revoked already
			r := berthctl(t, s.as("ops"), "leases", "release", "payments/exporter")
			wantCode(t, r, 0)
			if !strings.Contains(r.stdout, "revoked") || !strings.Contains(r.stdout, "east/payments") || !strings.Contains(r.stdout, "hands over") ||
				!strings.Contains(r.stdout, held.ExpiresAt.Format(time.RFC3339)) {
				t.Errorf("stdout %q does not say that east/payments's term was revoked and ends at latest at %s", r.stdout, held.ExpiresAt.Format(time.RFC3339))
			}
		}
		l, err := east.GetLease(ctx, "payments", "exporter")
		if err != nil {
			t.Fatal(err)
		}
		if l.Holder != "east/payments" || l.FencingToken != held.FencingToken || !l.Revoked {
			t.Errorf("lease after an admin's release: %+v, want east/payments's term %d, revoked", l, held.FencingToken)
		}
		if renewed, err := east.Renew(ctx, "payments", "exporter", "east/payments", held.FencingToken, time.Minute); err != nil || renewed.Acquired || !renewed.Revoked {
			t.Errorf("renew by the holder after the admin's release: %+v, %v; want not held, revoked", renewed, err)
		}
		// The holder hands over.
		if err := east.Release(ctx, "payments", "exporter", "east/payments", held.FencingToken); err != nil {
			t.Fatalf("holder's release of its revoked term: %v", err)
		}
	})

	t.Run("of the admin's own lease revokes it too: berthctl never frees a live term", func(t *testing.T) {
		ops := s.client(t, "ops")
		own, err := ops.Acquire(ctx, "payments", "own", "ops/maintenance", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		r := berthctl(t, s.as("ops"), "leases", "release", "payments/own")
		wantCode(t, r, 0)
		if !strings.Contains(r.stdout, "revoked") || !strings.Contains(r.stdout, "ops/maintenance") {
			t.Errorf("stdout %q does not say what was revoked from whom", r.stdout)
		}
		if l, err := ops.GetLease(ctx, "payments", "own"); err != nil || l.Holder != "ops/maintenance" || l.FencingToken != own.FencingToken || !l.Revoked {
			t.Errorf("lease after berthctl's release: %+v, %v; want ops/maintenance's term %d, revoked", l, err, own.FencingToken)
		}
		// Its holder's own release (the API's, as an agent's) frees it.
		if err := ops.Release(ctx, "payments", "own", "ops/maintenance", own.FencingToken); err != nil {
			t.Fatal(err)
		}
		if l, err := ops.GetLease(ctx, "payments", "own"); err != nil || l.Holder != "" {
			t.Errorf("lease after its holder's release: %+v, %v; want free", l, err)
		}
	})

	t.Run("of a free lease is a no-op", func(t *testing.T) {
		r := berthctl(t, s.as("ops"), "leases", "release", "payments/exporter")
		wantCode(t, r, 0)
		if !strings.Contains(r.stdout, "already free") {
			t.Errorf("stdout %q, want it to say the lease is already free", r.stdout)
		}
	})

	t.Run("of a lease never seen exits 3", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("ops"), "leases", "release", "payments/never"), 3)
	})
}

func TestClustersAndCordon(t *testing.T) {
	s := startServer(t)
	ctx := t.Context()
	east, west := s.client(t, "east"), s.client(t, "west")
	if _, err := east.RegisterCluster(ctx, "east", leaseapi.ClusterRegistration{Fingerprint: "uid-east", AgentVersion: "v0.1.0", Labels: map[string]string{"region": "eu"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := west.RegisterCluster(ctx, "west", leaseapi.ClusterRegistration{Fingerprint: "uid-west"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := east.Acquire(ctx, "ns", name, "east/"+name, time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("list table", func(t *testing.T) {
		r := berthctl(t, s.as("west"), "clusters", "list")
		wantCode(t, r, 0)
		header, rows := parseTable(t, r.stdout)
		if diff := cmp.Diff([]string{"ID", "HEALTHY", "CORDONED", "LEASES", "LAST-SEEN", "AGENT"}, header); diff != "" {
			t.Errorf("header (-want +got):\n%s", diff)
		}
		want := [][]string{{"east", "true", "false", "2"}, {"west", "true", "false", "0"}}
		if len(rows) != 2 {
			t.Fatalf("rows %v, want %v", rows, want)
		}
		for i := range want {
			if diff := cmp.Diff(want[i], rows[i][:4]); diff != "" {
				t.Errorf("row %d (-want +got):\n%s", i, diff)
			}
		}
		if rows[0][5] != "v0.1.0" || rows[1][5] != "<none>" {
			t.Errorf("AGENT %q, %q; want v0.1.0, <none>", rows[0][5], rows[1][5])
		}
		if !strings.HasSuffix(rows[0][4], "s") {
			t.Errorf("LAST-SEEN %q, want seconds", rows[0][4])
		}
	})

	t.Run("cordon by a non-admin exits 5", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("east"), "cordon", "east"), 5)
	})

	t.Run("cordon and uncordon by an admin", func(t *testing.T) {
		r := berthctl(t, s.as("ops"), "cordon", "east")
		wantCode(t, r, 0)
		if r.stdout != "cluster east cordoned\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		r = berthctl(t, s.as("ops"), "clusters", "list", "-o", "json")
		wantCode(t, r, 0)
		var list leaseapi.ClusterList
		decodeStrict(t, r.stdout, &list)
		if len(list.Items) != 2 || !list.Items[0].Cordoned || list.Items[1].Cordoned || list.Items[0].Labels["region"] != "eu" {
			t.Errorf("clusters after cordon: %+v, want east cordoned with its labels, west not", list.Items)
		}
		r = berthctl(t, s.as("ops"), "uncordon", "east", "-o", "json")
		wantCode(t, r, 0)
		var res leaseapi.ClusterRegistrationResponse
		decodeStrict(t, r.stdout, &res)
		if res.ID != "east" || res.Cordoned {
			t.Errorf("uncordon answered %+v, want east not cordoned", res)
		}
		clusters, err := east.ListClusters(ctx)
		if err != nil || clusters[0].Cordoned {
			t.Errorf("east after uncordon: %+v, %v; want not cordoned", clusters, err)
		}
	})

	t.Run("cordon of an unknown cluster exits 3", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("ops"), "cordon", "nowhere"), 3)
	})
}

func TestConnectionAndCredentials(t *testing.T) {
	s := startServer(t)
	unreachable := "http://127.0.0.1:1"

	t.Run("unreachable server exits 1", func(t *testing.T) {
		r := berthctl(t, map[string]string{"BERTH_SERVER": unreachable}, "leases", "list", "--timeout", "5s")
		wantCode(t, r, 1)
		if !strings.Contains(r.stderr, "connection refused") {
			t.Errorf("stderr %q does not say why", r.stderr)
		}
	})

	t.Run("flag wins over environment", func(t *testing.T) {
		env := s.as("east")
		env["BERTH_SERVER"] = unreachable
		wantCode(t, berthctl(t, env, "--server", s.url, "clusters", "list"), 0)
	})

	t.Run("no token exits 5", func(t *testing.T) {
		wantCode(t, berthctl(t, map[string]string{"BERTH_SERVER": s.url}, "leases", "list"), 5)
	})

	t.Run("wrong token exits 5", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(bad, []byte("nope\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		wantCode(t, berthctl(t, nil, "--server", s.url, "--token-file", bad, "clusters", "list"), 5)
	})

	t.Run("version reports a ready server", func(t *testing.T) {
		r := berthctl(t, s.as("east"), "version")
		wantCode(t, r, 0)
		for _, want := range []string{"Client Version: ", "Go Version: go", "Server: " + s.url + " (ready)"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("version output lacks %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("version without a server is the client alone", func(t *testing.T) {
		r := berthctl(t, nil, "version", "-o", "json")
		wantCode(t, r, 0)
		var v struct {
			Client struct {
				Version   string `json:"version"`
				GoVersion string `json:"goVersion"`
				Module    string `json:"module"`
			} `json:"client"`
			Server any `json:"server"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatal(err)
		}
		if v.Client.Version == "" || !strings.HasPrefix(v.Client.GoVersion, "go") || v.Client.Module != "github.com/berthfleet/berth" || v.Server != nil {
			t.Errorf("version %+v, want client build info and no server", v)
		}
	})

	t.Run("version with an unreachable server exits 1", func(t *testing.T) {
		r := berthctl(t, nil, "version", "--server", unreachable)
		wantCode(t, r, 1)
		if !strings.Contains(r.stdout, "(not ready)") {
			t.Errorf("stdout %q, want the server reported not ready", r.stdout)
		}
	})
}

// TestUsageErrors checks that mistakes on the command line exit 2 before any
// request: the server named is unreachable, which would exit 1.
func TestUsageErrors(t *testing.T) {
	env := map[string]string{"BERTH_SERVER": "http://127.0.0.1:1"}
	cases := map[string][]string{
		"unknown command":              {"bogus"},
		"unknown subcommand":           {"leases", "bogus"},
		"get without key":              {"leases", "get"},
		"get with two keys":            {"leases", "get", "a/b", "c/d"},
		"key without namespace":        {"leases", "get", "exporter"},
		"key with a bad namespace":     {"leases", "get", "Payments/exporter"},
		"release with a bad name":      {"leases", "release", "payments/Exporter_1"},
		"unknown flag":                 {"leases", "list", "--bogus"},
		"unknown output":               {"leases", "list", "-o", "xml"},
		"negative limit":               {"leases", "list", "--limit", "-1"},
		"chunk size over the maximum":  {"leases", "list", "--chunk-size", "5000"},
		"bad namespace":                {"leases", "list", "-n", "Bad_NS"},
		"list with an argument":        {"leases", "list", "extra"},
		"cordon without cluster":       {"cordon"},
		"cordon with a bad cluster id": {"uncordon", "East_1"},
		"missing token file":           {"--token-file", "/nonexistent/token", "clusters", "list"},
		"server without scheme":        {"--server", "127.0.0.1:8443", "clusters", "list"},
		"client cert without key":      {"--client-cert", "cert.pem", "clusters", "list"},
		"zero timeout":                 {"--timeout", "0s", "clusters", "list"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			r := berthctl(t, env, args...)
			wantCode(t, r, 2)
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

func TestHelpDocumentsExitCodes(t *testing.T) {
	r := berthctl(t, nil, "--help")
	wantCode(t, r, 0)
	for _, want := range []string{"Exit codes:", "3  not found", "5  unauthorized", "BERTH_SERVER", "BERTH_TOKEN_FILE", "BERTH_CA_FILE", "leases", "clusters", "cordon", "uncordon", "version"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestLeasesMoveAndHistory(t *testing.T) {
	s := startServer(t)
	ctx := t.Context()
	east, west := s.registered(t, "east"), s.registered(t, "west")
	held, err := east.Acquire(ctx, "payments", "exporter", "east", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("by another cluster exits 5", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("west"), "leases", "move", "payments/exporter", "--to", "west"), 5)
	})
	t.Run("to an unregistered cluster exits 4 saying so", func(t *testing.T) {
		r := berthctl(t, s.as("ops"), "leases", "move", "payments/exporter", "--to", "north")
		wantCode(t, r, 4)
		if !strings.Contains(r.stderr, "cluster north is not registered") {
			t.Errorf("stderr %q does not say why", r.stderr)
		}
	})
	t.Run("to a bad cluster id is a usage error", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("ops"), "leases", "move", "payments/exporter", "--to", "Not_An_ID"), 2)
	})
	t.Run("by an admin moves the term and says what happens", func(t *testing.T) {
		r := berthctl(t, s.as("ops"), "leases", "move", "payments/exporter", "--to", "west")
		wantCode(t, r, 0)
		for _, want := range []string{"moving", "east", "stops its Pods", "reserved for cluster west for 1m0s", held.ExpiresAt.Format(time.RFC3339)} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("stdout %q does not say %q", r.stdout, want)
			}
		}
		l, err := east.GetLease(ctx, "payments", "exporter")
		if err != nil || l.Move == nil || l.Move.To != "west" || !l.Revoked || l.FencingToken != held.FencingToken {
			t.Fatalf("lease after the move: %+v, %v; want east's term moving to west", l, err)
		}
		r = berthctl(t, s.as("ops"), "leases", "get", "payments/exporter")
		if _, rows := parseTable(t, strings.ReplaceAll(r.stdout, " (moving to west)", "(moving-to-west)")); rows[0][2] != "east(moving-to-west)" {
			t.Errorf("leases get shows holder %q, want the move", rows[0][2])
		}
	})
	t.Run("elsewhere while moving exits 4", func(t *testing.T) {
		r := berthctl(t, s.as("ops"), "leases", "move", "payments/exporter")
		wantCode(t, r, 0) // without --to: changes nothing
		ops := s.client(t, "ops")
		if _, err := ops.RegisterCluster(ctx, "ops", leaseapi.ClusterRegistration{Fingerprint: "uid-ops"}); err != nil {
			t.Fatal(err)
		}
		r = berthctl(t, s.as("ops"), "leases", "move", "payments/exporter", "--to", "ops")
		wantCode(t, r, 4)
		if !strings.Contains(r.stderr, "already moving") {
			t.Errorf("stderr %q does not say the term is already moving", r.stderr)
		}
	})
	t.Run("history shows the moved term after the handover", func(t *testing.T) {
		if err := east.Release(ctx, "payments", "exporter", "east", held.FencingToken); err != nil {
			t.Fatal(err)
		}
		if got, err := east.Acquire(ctx, "payments", "exporter", "east", time.Minute); err != nil || got.Acquired {
			t.Fatalf("acquire by east while reserved for west: %+v, %v; want refused", got, err)
		}
		next, err := west.Acquire(ctx, "payments", "exporter", "west", time.Minute)
		if err != nil || !next.Acquired {
			t.Fatalf("acquire by west: %+v, %v", next, err)
		}
		r := berthctl(t, s.as("east"), "leases", "history", "payments/exporter")
		wantCode(t, r, 0)
		header, rows := parseTable(t, r.stdout)
		if diff := cmp.Diff([]string{"TOKEN", "HOLDER", "STARTED", "ENDED", "DURATION", "HOW"}, header); diff != "" {
			t.Errorf("header (-want +got):\n%s", diff)
		}
		if len(rows) != 2 || rows[0][1] != "west" || rows[0][3] != "<none>" || rows[0][5] != "held" ||
			rows[1][0] != strconv.Itoa(int(held.FencingToken)) || rows[1][1] != "east" || rows[1][5] != "moved" {
			t.Errorf("history rows %v: want west's live term, then east's moved one", rows)
		}
		r = berthctl(t, s.as("east"), "leases", "history", "payments/exporter", "--limit", "1", "-o", "json")
		wantCode(t, r, 0)
		var list leaseapi.TermList
		decodeStrict(t, r.stdout, &list)
		if len(list.Items) != 1 || list.Items[0].Holder != "west" {
			t.Errorf("history -o json --limit 1: %+v", list)
		}
	})
	t.Run("history of a lease never seen exits 3", func(t *testing.T) {
		wantCode(t, berthctl(t, s.as("ops"), "leases", "history", "payments/never"), 3)
	})
	t.Run("move of a free lease is a no-op", func(t *testing.T) {
		if err := west.Release(ctx, "payments", "exporter", "west", held.FencingToken+1); err != nil {
			t.Fatal(err)
		}
		r := berthctl(t, s.as("ops"), "leases", "move", "payments/exporter")
		wantCode(t, r, 0)
		if !strings.Contains(r.stdout, "nothing to move") {
			t.Errorf("stdout %q, want it to say there is nothing to move", r.stdout)
		}
	})
}

func TestLeasesMoveWait(t *testing.T) {
	s := startServer(t)
	ctx := t.Context()
	east, west := s.registered(t, "east"), s.registered(t, "west")
	// moveWait runs `leases move --wait` in the background, and returns once
	// the term is moving.
	moveWait := func(t *testing.T, args ...string) <-chan result {
		t.Helper()
		done := make(chan result, 1)
		go func() {
			done <- berthctl(t, s.as("ops"), append([]string{"leases", "move", "payments/exporter", "--wait"}, args...)...)
		}()
		poll.For(t, 10*time.Second, "the term is moving", func() bool {
			l, err := east.GetLease(ctx, "payments", "exporter")
			return err == nil && l.Move != nil
		})
		return done
	}
	acquire := func(t *testing.T, c *client.Client, id string) client.AcquireResult {
		t.Helper()
		got, err := c.Acquire(ctx, "payments", "exporter", id, 5*time.Second)
		if err != nil || !got.Acquired {
			t.Fatalf("acquire by %s: %+v, %v", id, got, err)
		}
		return got
	}
	release := func(t *testing.T, c *client.Client, holder string, token int32) {
		t.Helper()
		if err := c.Release(ctx, "payments", "exporter", holder, token); err != nil {
			t.Fatal(err)
		}
	}
	wantSaid := func(t *testing.T, out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output %q does not say %q", out, w)
			}
		}
	}

	t.Run("the destination takes the lease", func(t *testing.T) {
		held := acquire(t, east, "east")
		done := moveWait(t, "--to", "west")
		// The holder stops its Pods, renewing its revoked term meanwhile;
		// berthctl reads the lease twice a second.
		for range 3 {
			time.Sleep(600 * time.Millisecond)
			if _, err := east.Renew(ctx, "payments", "exporter", "east", held.FencingToken, 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		release(t, east, "east", held.FencingToken)
		time.Sleep(time.Second) // the destination's agent is about to acquire
		next := acquire(t, west, "west")
		r := <-done
		wantCode(t, r, 0)
		wantSaid(t, r.stdout, "waiting: east stops its Pods", "the lease is reserved for west until",
			fmt.Sprintf("handed over: west holds it with fencing token %d", next.FencingToken))
		if n := strings.Count(r.stdout, "stops its Pods, then"); n != 1 {
			t.Errorf("stdout says the holder stops its Pods %d times, want once: a renewal is no new stage", n)
		}
		release(t, west, "west", next.FencingToken)
	})
	t.Run("holders within clusters: the destination cluster takes the lease", func(t *testing.T) {
		held := acquire(t, east, "east/billing")
		done := moveWait(t, "--to", "west")
		release(t, east, "east/billing", held.FencingToken)
		next := acquire(t, west, "west/billing")
		r := <-done
		wantCode(t, r, 0)
		wantSaid(t, r.stdout, fmt.Sprintf("handed over: west/billing holds it with fencing token %d", next.FencingToken))
		release(t, west, "west/billing", next.FencingToken)
	})
	t.Run("another cluster takes it once the reservation ran out: exit 6", func(t *testing.T) {
		held := acquire(t, east, "east")
		done := moveWait(t, "--to", "west")
		release(t, east, "east", held.FencingToken)
		// West never takes it; east does, once the reservation ran out.
		var back client.AcquireResult
		poll.For(t, 15*time.Second, "east takes the lease back", func() bool {
			got, err := east.Acquire(ctx, "payments", "exporter", "east", 5*time.Second)
			back = got
			return err == nil && got.Acquired
		})
		r := <-done
		wantCode(t, r, 6)
		wantSaid(t, r.stderr, fmt.Sprintf("east took it (fencing token %d)", back.FencingToken), "not west", "berthctl leases history payments/exporter")
	})
	t.Run("no new term within --timeout: exit 6", func(t *testing.T) {
		done := moveWait(t, "--timeout", "3s")
		r := <-done
		wantCode(t, r, 6)
		wantSaid(t, r.stderr, "no new term within --timeout", "east stops its Pods")
	})
}
