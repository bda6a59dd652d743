// Package pgtest starts a real PostgreSQL server (Debian's postgresql package: initdb and
// postgres under /usr/lib/postgresql/*/bin) in a temporary directory on a free loopback
// port, for tests of the durable policy store. As internal/redistest does for Redis, the
// server runs as a child process of the caller (never daemonized), so a test that dies
// takes it with it. Under root the server runs as the "postgres" user, which initdb
// requires.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPostgres: Debian's PostgreSQL server binaries are not installed.
var ErrNoPostgres = errors.New("postgres/initdb not found under /usr/lib/postgresql/*/bin: `make test` installs them (apt-get install postgresql)")

// Server is one running PostgreSQL server with a trust-authenticated superuser
// "tollgate" and its database "tollgate".
type Server struct {
	bin, dir string
	port     int
	cred     *syscall.Credential
	cmd      *exec.Cmd
	done     chan struct{}
}

// binDir is the newest installed major version's bin directory.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

// Launch initialises a cluster in a new temporary directory and starts it.
func Launch() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs the postgres user (Debian's postgresql package creates it): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	initdb := s.command(filepath.Join(bin, "initdb"), "-D", s.data(), "-U", "tollgate", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %w: %s", err, out)
	}
	if err := s.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url("postgres"))
	if err != nil {
		s.Stop()
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE tollgate"); err != nil {
		s.Stop()
		return nil, fmt.Errorf("pgtest: create database: %w", err)
	}
	return s, nil
}

// Start runs Launch, then stops the server when the test ends; a test that cannot
// start PostgreSQL fails (make test installs it).
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (s *Server) url(db string) string {
	return fmt.Sprintf("postgres://tollgate@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// URL is the connection string of the database "tollgate".
func (s *Server) URL() string { return s.url("tollgate") }

// Start (re)starts the server on its port (a new free port the first time) and waits
// until it accepts connections.
func (s *Server) Start() error {
	if s.port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		s.port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return err
	}
	s.cmd = s.command(filepath.Join(s.bin, "postgres"), "-D", s.data(), "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.dir, "-c", "fsync=off")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); _ = log.Close(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.url("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-s.done:
			b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
			return fmt.Errorf("pgtest: postgres exited: %s", b)
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.halt()
	return errors.New("pgtest: postgres did not accept connections within 15 s")
}

// halt stops the running server (fast shutdown: open sessions are ended) and waits.
func (s *Server) halt() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Down stops the server, keeping its data for Start.
func (s *Server) Down() { s.halt() }

// Stop stops the server and removes its directory.
func (s *Server) Stop() {
	s.halt()
	_ = os.RemoveAll(s.dir)
}
