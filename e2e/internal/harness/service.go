package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ServiceConfig starts one tollgate-ratelimit process.
type ServiceConfig struct {
	Bin        string   // the executable (Binaries.Service)
	RedisMode  string   // standalone (default) or cluster
	RedisAddrs []string // server, or cluster seed nodes
	AdminToken string
	SyncSecret string
	// KeyHashSecret, when set, is passed as --key-hash-secret-file: caller keys are
	// stored as keyed hashes.
	KeyHashSecret string
	// Args are extra flags (for example --penalty-base 250ms).
	Args []string
	// LogDir receives the process's log (service-<port>.log). Empty: a temporary
	// directory removed by Stop.
	LogDir string
}

// Service is a running tollgate-ratelimit child process. It can be killed and started
// again on the same address.
type Service struct {
	cfg     ServiceConfig
	addr    string
	logPath string
	tempDir string
	// secretDir holds the admin token and sync secret files the service reads (never
	// flags: a command line is visible to every local user).
	secretDir string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startTimeout bounds how long a start may take to print its listening address.
const startTimeout = 20 * time.Second

// StartService starts the service on a free loopback port and returns once it listens.
func StartService(cfg ServiceConfig) (*Service, error) {
	s := &Service{cfg: cfg}
	d, err := os.MkdirTemp("", "tollgate-secrets-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	s.secretDir = d
	if err := s.writeSecret("admin-token", cfg.AdminToken); err != nil {
		s.removeTemp()
		return nil, err
	}
	if err := s.writeSecret("sync-secret", cfg.SyncSecret); err != nil {
		s.removeTemp()
		return nil, err
	}
	if err := s.writeSecret("key-hash-secret", cfg.KeyHashSecret); err != nil {
		s.removeTemp()
		return nil, err
	}
	if cfg.LogDir == "" {
		d, err := os.MkdirTemp("", "tollgate-svc-")
		if err != nil {
			return nil, fmt.Errorf("temp dir: %w", err)
		}
		s.tempDir = d
		s.cfg.LogDir = d
	}
	if err := s.start("127.0.0.1:0"); err != nil {
		s.removeTemp()
		return nil, err
	}
	return s, nil
}

// Addr is the service's host:port.
func (s *Service) Addr() string { return s.addr }

// URL is the service's base URL.
func (s *Service) URL() string { return "http://" + s.addr }

// LogPath is the file holding the process's output.
func (s *Service) LogPath() string { return s.logPath }

func (s *Service) start(listen string) error {
	mode := s.cfg.RedisMode
	if mode == "" {
		mode = "standalone"
	}
	args := []string{
		"--listen", listen, "--redis-mode", mode, "--redis-addrs", strings.Join(s.cfg.RedisAddrs, ","),
		"--log-format", "json", "--admin-listen", "shared",
	}
	if s.cfg.AdminToken != "" {
		args = append(args, "--admin-token-file", filepath.Join(s.secretDir, "admin-token"))
	}
	if s.cfg.SyncSecret != "" {
		args = append(args, "--sync-secret-file", filepath.Join(s.secretDir, "sync-secret"))
	}
	if s.cfg.KeyHashSecret != "" {
		args = append(args, "--key-hash-secret-file", filepath.Join(s.secretDir, "key-hash-secret"))
	}
	args = append(args, s.cfg.Args...)
	cmd := exec.Command(s.cfg.Bin, args...)
	// Own process group, and killed with the test binary if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("service stderr: %w", err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %q: %w", s.cfg.Bin, err)
	}
	addrc := make(chan string, 1)
	done := make(chan struct{})
	logFile := make(chan string, 1)
	go func() {
		// Copy the log to a file named after the port once it is known; lines before
		// that are kept in memory.
		var pre bytes.Buffer
		var f *os.File
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if f == nil {
				pre.Write(line)
				pre.WriteByte('\n')
				if a := servingAddr(line); a != "" {
					name := filepath.Join(s.cfg.LogDir, "service-"+portOf(a)+".log")
					if nf, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
						f = nf
						_, _ = f.Write(pre.Bytes())
						logFile <- name
					} else {
						logFile <- ""
					}
					addrc <- a
				}
				continue
			}
			_, _ = f.Write(line)
			_, _ = f.Write([]byte{'\n'})
		}
		if f == nil {
			// Never listened: keep what it said for the error.
			name := filepath.Join(s.cfg.LogDir, "service-failed.log")
			_ = os.WriteFile(name, pre.Bytes(), 0o644)
		} else {
			_ = f.Close()
		}
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case a := <-addrc:
		name := <-logFile
		s.mu.Lock()
		s.cmd, s.done, s.addr, s.logPath = cmd, done, a, name
		s.mu.Unlock()
		return nil
	case <-done:
		out, _ := os.ReadFile(filepath.Join(s.cfg.LogDir, "service-failed.log"))
		return fmt.Errorf("tollgate-ratelimit exited before listening: %s", tail(out, 2000))
	case <-time.After(startTimeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("tollgate-ratelimit did not listen within %v", startTimeout)
	}
}

// cleanEnv drops TOLLGATE_* variables of the caller so they cannot change the flags
// a scenario chose.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOLLGATE_") {
			env = append(env, kv)
		}
	}
	return env
}

// servingAddr returns the address of the service's "serving" log line, or "".
func servingAddr(line []byte) string {
	if !bytes.Contains(line, []byte(`"serving"`)) {
		return ""
	}
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal(line, &rec) != nil || rec.Msg != "serving" {
		return ""
	}
	return rec.Addr
}

func portOf(addr string) string {
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		return addr[i+1:]
	}
	return addr
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Running reports whether the process is alive.
func (s *Service) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Pid is the running process's id (0 when none runs).
func (s *Service) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Kill SIGKILLs the process (no draining: in-flight requests die with it) and waits
// until it is gone.
func (s *Service) Kill() error { return s.signal(syscall.SIGKILL, 10*time.Second) }

// Pause stops the process with SIGSTOP: the kernel still accepts connections on its
// port and takes in requests, but nothing answers them — a hung service. Resume ends it.
func (s *Service) Pause() error { return s.send(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Service) Resume() error { return s.send(syscall.SIGCONT) }

func (s *Service) send(sig syscall.Signal) error {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || !s.Running() {
		return fmt.Errorf("service %s is not running", s.addr)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to service %s: %w", sig, s.addr, err)
	}
	return nil
}

// Restart starts a stopped or killed service again on the same address.
func (s *Service) Restart() error {
	if s.Running() {
		return fmt.Errorf("service %s is still running", s.addr)
	}
	var last error
	// The port may linger briefly after a kill: a few bounded attempts.
	for attempt := 0; attempt < 20; attempt++ {
		if last = s.start(s.addr); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("restart service on %s: %w", s.addr, last)
}

// Stop terminates the process (SIGTERM, then SIGKILL after a grace period) and removes
// its temporary directory. Safe to call twice.
func (s *Service) Stop() {
	_ = s.signal(syscall.SIGTERM, 10*time.Second)
	s.removeTemp()
}

// writeSecret writes one secret file (owner-only), one secret per line.
func (s *Service) writeSecret(name string, secrets ...string) error {
	if err := os.WriteFile(filepath.Join(s.secretDir, name), []byte(strings.Join(secrets, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("secret file: %w", err)
	}
	return nil
}

// SetSyncSecrets replaces the sync secrets the service accepts (one or several, as
// during a rotation) and makes it read them again (SIGHUP).
func (s *Service) SetSyncSecrets(secrets ...string) error {
	if err := s.writeSecret("sync-secret", secrets...); err != nil {
		return err
	}
	return s.send(syscall.SIGHUP)
}

func (s *Service) removeTemp() {
	if s.secretDir != "" {
		_ = os.RemoveAll(s.secretDir)
		s.secretDir = ""
	}
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
		s.tempDir = ""
	}
}

func (s *Service) signal(sig syscall.Signal, wait time.Duration) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process acts on the signal only once continued
	select {
	case <-done:
		return nil
	case <-time.After(wait):
	}
	if sig != syscall.SIGKILL {
		return s.signal(syscall.SIGKILL, wait)
	}
	return fmt.Errorf("service pid %d did not exit within %v", cmd.Process.Pid, wait)
}

// LogTail returns the last n bytes of the service's log.
func (s *Service) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	return string(tail(b, n))
}

// Metric reads one sample of the service's Prometheus /metrics: the value of the
// line that starts with series (a name with its labels, as printed). It returns 0 when
// the series has not been created yet.
func (s *Service) Metric(series string) (float64, error) {
	resp, err := httpClient.Get(s.URL() + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("service metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("service metrics: status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				return 0, fmt.Errorf("metric %q: %w", series, err)
			}
			return v, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("service metrics: %w", err)
	}
	return 0, nil
}

// ErrNotFound is returned by admin calls answered 404.
var ErrNotFound = errors.New("not found")
