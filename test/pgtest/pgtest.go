// Package pgtest starts a throwaway PostgreSQL server from the machine's
// PostgreSQL binaries for a test, and gives each caller a fresh database on
// it. PostgreSQL refuses to run as root, so when the test runs as root the
// server runs as the "postgres" user that Debian's packages create.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthfleet/berth/test/freeport"
	"github.com/berthfleet/berth/test/poll"
)

// Server is a running throwaway PostgreSQL.
type Server struct {
	port int
	dbs  atomic.Int64
}

// binDir finds initdb and postgres: $BERTH_PG_BIN, else Debian's newest
// /usr/lib/postgresql/<v>/bin.
func binDir() (string, error) {
	if d := os.Getenv("BERTH_PG_BIN"); d != "" {
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", fmt.Errorf("no PostgreSQL binaries in /usr/lib/postgresql/*/bin: install them (apt-get install postgresql) or set BERTH_PG_BIN")
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}

// Start runs a server in a temporary folder until the test ends. It fails the
// test, never skips it, when the server cannot start.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "berth-pg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cred, err := credential(dir)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	// The port is free when picked but could be taken before postgres binds
	// it: a server that exits while starting is started again on another.
	for attempt := 1; ; attempt++ {
		s, exited, err := launch(t, bin, dir, data, cred, log)
		if err == nil {
			return s
		}
		if !exited || attempt == 3 {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("postgres did not start: %v\n%s", err, b)
		}
		t.Logf("postgres exited while starting (%v); starting it again on another port", err)
	}
}

// launch starts postgres on a free port and waits until it answers. exited
// says whether it failed because the server exited.
func launch(t testing.TB, bin, dir, data string, cred *syscall.Credential, log *os.File) (s *Server, exited bool, err error) {
	port, err := freeport.Port()
	if err != nil {
		return nil, false, err
	}
	srv := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "shared_buffers=32MB")
	srv.Stdout, srv.Stderr = log, log
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := srv.Start(); err != nil {
		return nil, false, fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	s = &Server{port: port}
	var last error
	_, err = poll.Until(context.Background(), 30*time.Second, "postgres answers", func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, s.dsn("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return true, nil
		}
		last = err
		select {
		case <-done:
			exited = true
			return false, fmt.Errorf("postgres exited: %s", srv.ProcessState)
		default:
			return false, nil
		}
	})
	if err != nil {
		return nil, exited, fmt.Errorf("%w (last: %v)", err, last)
	}
	return s, false, nil
}

// credential is the user the server runs as: the current one, or
// "postgres" when running as root (then it must own dir).
func credential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL does not run as root and there is no postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// NewDatabase creates an empty database and returns its DSN.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("berth_%d", s.dbs.Add(1))
	conn, err := pgx.Connect(t.Context(), s.dsn("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return s.dsn(name)
}
