package harness

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// BuildCommand compiles the command in package pkg (for example
// "./e2e/cmd/tollgate-gateway") into dir, with the Makefile's flags, and returns the
// executable's path.
func BuildCommand(dir, pkg string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	if err := goBuild(root, nil, "-o", out, pkg); err != nil {
		return "", err
	}
	return out, nil
}

// GatewayProcess is the tollgate-gateway executable running as a child process: the
// gateway as an operator runs it, with its admin listener and access log.
type GatewayProcess struct {
	URL      string // proxy listener, http://127.0.0.1:port
	AdminURL string // admin listener (/metrics, /stats, /logs)
	cmd      *exec.Cmd
	done     chan struct{}
	mu       sync.Mutex
	log      strings.Builder // its stderr
}

// StartGatewayProcess runs bin with args plus loopback listeners on free ports, and waits
// until both listen (the gateway prints their addresses).
func StartGatewayProcess(bin string, args ...string) (*GatewayProcess, error) {
	g := &GatewayProcess{done: make(chan struct{})}
	g.cmd = exec.Command(bin, append(args, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")...)
	g.cmd.Stdout = io.Discard
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		defer close(g.done)
		var proxy, admin string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			g.mu.Lock()
			g.log.WriteString(line + "\n")
			g.mu.Unlock()
			if _, rest, ok := strings.Cut(line, "proxy listening on "); ok {
				proxy, _, _ = strings.Cut(rest, " ")
			}
			if _, rest, ok := strings.Cut(line, "admin listening on "); ok {
				admin = strings.TrimSpace(rest)
				addrs <- [2]string{proxy, admin}
			}
		}
		_ = g.cmd.Wait()
	}()
	select {
	case a := <-addrs:
		g.URL, g.AdminURL = "http://"+a[0], "http://"+a[1]
		return g, nil
	case <-g.done:
		return nil, fmt.Errorf("%s exited before listening:\n%s", bin, g.Log())
	case <-time.After(60 * time.Second):
		g.Stop()
		return nil, fmt.Errorf("%s did not listen within 60 s:\n%s", bin, g.Log())
	}
}

// Log is what the gateway wrote to stderr so far.
func (g *GatewayProcess) Log() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.log.String()
}

// Stop ends the gateway (SIGTERM: it drains, flushes its access log and exits) and
// waits for it, killing it after 10 s.
func (g *GatewayProcess) Stop() {
	if g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Signal(os.Interrupt)
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}
