// Package redistest starts real Redis servers — one standalone server or a six-node Redis
// Cluster (three primaries, three replicas) — on free loopback ports, for tests, the demo
// and the end-to-end suite. Tollgate's service tests run against real Redis rather than a
// mock because the behaviour that matters (Lua semantics, NOSCRIPT after failover,
// CROSSSLOT, MOVED during promotion) only exists in the real server.
//
// Servers run as child processes of the caller (never daemonized) so a test that dies
// takes them with it, and so this package can reap them: a stopped redis-server lingers as
// a zombie in some containers and `kill -0` would call it alive, so liveness
// is read from /proc/PID/stat and state Z counts as dead.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/hashslot"
)

// ErrNoRedis is returned when redis-server (or redis-cli, for a cluster) is not installed.
var ErrNoRedis = errors.New("redis-server/redis-cli not found in PATH: `make test` installs them (apt-get install redis-server redis-tools)")

// Options configures a launch. The zero value is fine.
type Options struct {
	// Dir holds the servers' working directories (nodes.conf, logs). Empty: a new
	// temporary directory removed by Stop.
	Dir string
	// Log receives the servers' stdout/stderr. Nil: each server's log file in Dir.
	Log io.Writer
	// StartTimeout bounds start-up (default 20 s).
	StartTimeout time.Duration
	// ExtraArgs are appended to every redis-server command line.
	ExtraArgs []string
	// TLS, when set, makes every server accept TLS connections only (port 0, the port
	// as tls-port; replication and the cluster bus use TLS too) with these files
	// (GenerateTLS). Server.Addr and Cluster.Addrs are then TLS addresses.
	TLS *TLS
	// User and Password, when User is set, create an ACL user with every permission
	// and turn the default user off: every client must authenticate as this user.
	// Replicas and Sentinels authenticate to their primary as it too.
	User, Password string
}

func (o *Options) startTimeout() time.Duration {
	if o.StartTimeout > 0 {
		return o.StartTimeout
	}
	return 20 * time.Second
}

// proc is one redis-server child process.
type proc struct {
	port    int
	dir     string
	args    []string
	log     io.Writer
	logFile *os.File

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("redis-server on port %d is already running", p.port)
		}
	}
	cmd := exec.Command("redis-server", p.args...)
	cmd.Dir = p.dir
	out := p.log
	if out == nil {
		f, err := os.OpenFile(filepath.Join(p.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open redis log: %w", err)
		}
		p.logFile = f
		out = f
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group: a Ctrl-C on the test binary must not race our orderly stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server on port %d: %w", p.port, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// kill sends sig and waits (bounded) until the process is gone.
// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return fmt.Errorf("redis-server on port %d is not running", p.port)
	}
	return cmd.Process.Signal(sig)
}

func (p *proc) kill(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Signal(sig)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return nil
		case <-time.After(10 * time.Millisecond):
		}
		if !Alive(pid) {
			return nil
		}
	}
	if sig != syscall.SIGKILL {
		return p.kill(syscall.SIGKILL, wait)
	}
	return fmt.Errorf("redis-server pid %d on port %d did not exit within %v", pid, p.port, wait)
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return Alive(p.cmd.Process.Pid)
	}
}

func (p *proc) close() {
	if p.logFile != nil {
		_ = p.logFile.Close()
	}
}

// Alive reports whether pid is a live process. A zombie (state Z in /proc/PID/stat) is
// dead: it has exited and only waits to be reaped.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if _, e := os.Stat("/proc/self/stat"); e == nil {
			return false // /proc works and the process has no entry: gone
		}
		return syscall.Kill(pid, 0) == nil
	}
	// Format: pid (comm) state ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}

// lookPath checks that the binaries are installed.
func lookPath(names ...string) error {
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			return ErrNoRedis
		}
	}
	return nil
}

// freePorts returns n distinct loopback ports that are free, each with port+10000 free
// too when withBus (the cluster bus port Redis derives from the client port).
func freePorts(n int, withBus bool) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 2000; tries++ {
		var p int
		if withBus {
			p = 20000 + rand.IntN(25000)
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, fmt.Errorf("find free port: %w", err)
			}
			p = l.Addr().(*net.TCPAddr).Port
			_ = l.Close()
		}
		if seen[p] || seen[p+10000] || seen[p-10000] || !portFree(p) || (withBus && !portFree(p+10000)) {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("found only %d of %d free ports", len(ports), n)
	}
	return ports, nil
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// waitPing polls addr until PING answers or the deadline passes.
func waitPing(ctx context.Context, acc *access, addr string) error {
	c := acc.client(addr, 200*time.Millisecond, 0)
	defer c.Close()
	var last error
	for {
		if last = c.Ping(ctx).Err(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis at %s did not answer PING: %w (last: %v)", addr, ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// portArgs make the server listen on port: plain, or TLS only.
func (o *Options) portArgs(port int) []string {
	if o.TLS != nil {
		return o.TLS.serverArgs(port)
	}
	return []string{"--port", strconv.Itoa(port)}
}

func makeDir(o Options) (dir string, temp bool, err error) {
	if o.Dir != "" {
		return o.Dir, false, os.MkdirAll(o.Dir, 0o755)
	}
	d, err := os.MkdirTemp("", "tollgate-redis-")
	return d, true, err
}

// Server is one standalone redis-server.
type Server struct {
	p       *proc
	acc     *access
	dir     string
	tempDir bool
}

// Launch starts a standalone redis-server (no persistence) on a free loopback port and
// waits until it answers PING. Call Stop when done.
func Launch(o Options) (*Server, error) {
	if err := lookPath("redis-server"); err != nil {
		return nil, err
	}
	dir, temp, err := makeDir(o)
	if err != nil {
		return nil, fmt.Errorf("redis dir: %w", err)
	}
	acc, err := newAccess(o)
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, tempDir: temp, acc: acc}
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(1, false)
		if err != nil {
			return nil, err
		}
		args := append(append(append(o.portArgs(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir), o.aclArgs()...), o.ExtraArgs...)
		s.p = &proc{port: ports[0], dir: dir, args: args, log: o.Log}
		if last = s.p.start(); last != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), o.startTimeout())
		last = waitPing(ctx, acc, s.p.addr())
		cancel()
		if last == nil {
			return s, nil
		}
		// Most likely another process took the port between probe and bind: retry.
		_ = s.p.kill(syscall.SIGKILL, 5*time.Second)
		s.p.close()
	}
	s.cleanupDir()
	return nil, fmt.Errorf("start standalone redis: %w", last)
}

// StartStandalone is Launch for tests: it fails the test when Redis cannot start
// (including when it is not installed: CI must not silently skip) and stops it at cleanup.
func StartStandalone(t testing.TB) *Server { t.Helper(); return StartStandaloneWith(t, Options{}) }

// StartStandaloneWith is StartStandalone with options (TLS, an ACL user).
func StartStandaloneWith(t testing.TB, o Options) *Server {
	t.Helper()
	s, err := Launch(o)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.p.addr() }

// Addrs is Addr as a one-element list (the shape client options take).
func (s *Server) Addrs() []string { return []string{s.Addr()} }

// Kill SIGKILLs the server and waits until it is gone.
func (s *Server) Kill() error { return s.p.kill(syscall.SIGKILL, 10*time.Second) }

// Pause stops the server with SIGSTOP: it keeps its connections and accepts new ones
// (the kernel does), and answers nothing until Resume. A hung Redis, as a stalled
// host or a partition without resets shows it to clients.
func (s *Server) Pause() error { return s.p.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.p.signal(syscall.SIGCONT) }

// Restart starts a killed server again on the same port and waits for PING.
func (s *Server) Restart() error {
	if err := s.p.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return waitPing(ctx, s.acc, s.Addr())
}

// Stop terminates the server and removes its temporary directory. Safe to call twice.
func (s *Server) Stop() {
	_ = s.p.kill(syscall.SIGTERM, 5*time.Second)
	s.p.close()
	s.cleanupDir()
}

func (s *Server) cleanupDir() {
	if s.tempDir {
		_ = os.RemoveAll(s.dir)
		s.tempDir = false
	}
}

// LaunchSentinel starts a Redis Sentinel (redis-server --sentinel) monitoring the
// primary at masterAddr under name, with a quorum of 1 and short timeouts, and waits
// until it answers PING. Call Stop when done.
func LaunchSentinel(masterAddr, name string, o Options) (*Server, error) {
	if err := lookPath("redis-server"); err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		return nil, fmt.Errorf("master address %q: %w", masterAddr, err)
	}
	dir, temp, err := makeDir(o)
	if err != nil {
		return nil, fmt.Errorf("sentinel dir: %w", err)
	}
	acc, err := newAccess(o)
	if err != nil {
		return nil, err
	}
	// The Sentinel itself takes no password (clients query it unauthenticated); it
	// authenticates to the primary as the ACL user.
	acc.user, acc.pass = "", ""
	s := &Server{dir: dir, tempDir: temp, acc: acc}
	ports, err := freePorts(1, false)
	if err != nil {
		s.cleanupDir()
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	// Config-file form of the same settings as the servers' command lines.
	var listen strings.Builder
	pa := o.portArgs(ports[0])
	for i := 0; i+1 < len(pa); i += 2 {
		fmt.Fprintf(&listen, "%s %s\n", strings.TrimPrefix(pa[i], "--"), pa[i+1])
	}
	if o.User != "" {
		fmt.Fprintf(&listen, "sentinel auth-user %s %s\nsentinel auth-pass %s %s\n", name, o.User, name, o.Password)
	}
	body := fmt.Sprintf("%sbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
		listen.String(), dir, name, host, port, name, name)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		s.cleanupDir()
		return nil, fmt.Errorf("sentinel config: %w", err)
	}
	s.p = &proc{port: ports[0], dir: dir, args: append([]string{conf, "--sentinel"}, o.ExtraArgs...), log: o.Log}
	if err := s.p.start(); err != nil {
		s.cleanupDir()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.startTimeout())
	defer cancel()
	if err := waitPing(ctx, acc, s.p.addr()); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Cluster is a six-node Redis Cluster: three primaries with one replica each.
type Cluster struct {
	nodes   []*proc
	acc     *access
	dir     string
	tempDir bool
}

// ClusterSize is the number of nodes LaunchCluster starts.
const ClusterSize = 6

// LaunchCluster starts six cluster-enabled servers (node timeout 1 s, diskless
// replication without delay so a restarted node resyncs at once), joins them with
// `redis-cli --cluster create --cluster-replicas 1`, and waits until every node reports
// cluster_state:ok. Call Stop when done.
func LaunchCluster(o Options) (*Cluster, error) {
	if err := lookPath("redis-server", "redis-cli"); err != nil {
		return nil, err
	}
	// A port found free can be taken by another process before redis-server binds it
	// (several test binaries start servers at once): try again on other ports.
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var c *Cluster
		if c, err = launchCluster(o); err == nil {
			return c, nil
		}
	}
	return nil, err
}

func launchCluster(o Options) (*Cluster, error) {
	dir, temp, err := makeDir(o)
	if err != nil {
		return nil, fmt.Errorf("redis dir: %w", err)
	}
	acc, err := newAccess(o)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, tempDir: temp, acc: acc}
	ports, err := freePorts(ClusterSize, true)
	if err != nil {
		c.Stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.startTimeout())
	defer cancel()
	for _, port := range ports {
		nd := filepath.Join(dir, strconv.Itoa(port))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			c.Stop()
			return nil, fmt.Errorf("node dir: %w", err)
		}
		args := append(append(o.portArgs(port),
			"--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(nd, "nodes.conf"),
			"--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", "--dir", nd,
		), append(o.aclArgs(), o.ExtraArgs...)...)
		p := &proc{port: port, dir: nd, args: args, log: o.Log}
		c.nodes = append(c.nodes, p)
		if err := p.start(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	for _, p := range c.nodes {
		if err := waitPing(ctx, acc, p.addr()); err != nil {
			c.Stop()
			return nil, err
		}
	}
	args := append(o.cliArgs(), "--cluster", "create")
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// StartCluster is LaunchCluster for tests: it fails the test when the cluster cannot
// start (including when Redis is not installed) and stops it at cleanup.
func StartCluster(t testing.TB) *Cluster { t.Helper(); return StartClusterWith(t, Options{}) }

// StartClusterWith is StartCluster with options (TLS, an ACL user).
func StartClusterWith(t testing.TB, o Options) *Cluster {
	t.Helper()
	c, err := LaunchCluster(o)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Addrs lists every node's host:port (primaries and replicas).
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		out[i] = p.addr()
	}
	return out
}

// Stop terminates every node and removes the temporary directory. Safe to call twice.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, p := range c.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.kill(syscall.SIGTERM, 5*time.Second); p.close() }()
	}
	wg.Wait()
	if c.tempDir {
		_ = os.RemoveAll(c.dir)
		c.tempDir = false
	}
}

// clusterInfo returns CLUSTER INFO fields of one node.
func clusterInfo(ctx context.Context, acc *access, addr string) (map[string]string, error) {
	cl := acc.client(addr, 300*time.Millisecond, time.Second)
	defer cl.Close()
	s, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// WaitHealthy waits until every running node reports cluster_state:ok and all slots are
// served by a running primary.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var last error
	for {
		if last = c.healthy(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not healthy: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) error {
	running := map[string]bool{}
	for _, p := range c.nodes {
		if p.running() {
			running[p.addr()] = true
		}
	}
	for _, p := range c.nodes {
		if !running[p.addr()] {
			continue
		}
		info, err := clusterInfo(ctx, c.acc, p.addr())
		if err != nil {
			return fmt.Errorf("cluster info %s: %w", p.addr(), err)
		}
		if info["cluster_state"] != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", p.addr(), info["cluster_state"])
		}
		if info["cluster_slots_ok"] != "16384" {
			return fmt.Errorf("%s: cluster_slots_ok:%s", p.addr(), info["cluster_slots_ok"])
		}
	}
	// Every slot must be owned by a primary that is actually running (a node may still
	// believe a killed primary owns its slots until the failure is detected).
	for addr := range running {
		slots, err := c.slotOwners(ctx, addr)
		if err != nil {
			return err
		}
		for _, owner := range slots {
			if !running[owner] {
				return fmt.Errorf("%s still routes slots to stopped node %s", addr, owner)
			}
		}
		break
	}
	return nil
}

// slotOwners maps each slot range start to the primary's address, as seen by addr.
func (c *Cluster) slotOwners(ctx context.Context, addr string) (map[int]string, error) {
	cl := c.acc.client(addr, 300*time.Millisecond, time.Second)
	defer cl.Close()
	//lint:ignore SA1019 CLUSTER SLOTS is what Redis 7.0 (Debian's) answers in one call; SHARDS needs more parsing for no gain here.
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster slots %s: %w", addr, err)
	}
	m := map[int]string{}
	for _, s := range slots {
		if len(s.Nodes) > 0 {
			m[s.Start] = s.Nodes[0].Addr
		}
	}
	return m, nil
}

// PrimaryForKey returns the address of the running primary that owns key's slot.
func (c *Cluster) PrimaryForKey(ctx context.Context, key string) (string, error) {
	slot := Slot(key)
	for _, p := range c.nodes {
		if !p.running() {
			continue
		}
		cl := c.acc.client(p.addr(), 300*time.Millisecond, time.Second)
		//lint:ignore SA1019 CLUSTER SLOTS is what Redis 7.0 (Debian's) answers in one call; SHARDS needs more parsing for no gain here.
		slots, err := cl.ClusterSlots(ctx).Result()
		_ = cl.Close()
		if err != nil {
			continue
		}
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End && len(s.Nodes) > 0 {
				return s.Nodes[0].Addr, nil
			}
		}
	}
	return "", fmt.Errorf("no running node knows the owner of slot %d (key %q)", slot, key)
}

func (c *Cluster) node(addr string) *proc {
	for _, p := range c.nodes {
		if p.addr() == addr {
			return p
		}
	}
	return nil
}

// KillPrimaryForKey SIGKILLs the primary owning key's slot and returns once a replica has
// been promoted and the cluster reports cluster_state:ok on every running node again. It
// returns the killed node's address (for Restart).
func (c *Cluster) KillPrimaryForKey(key string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := c.PrimaryForKey(ctx, key)
	if err != nil {
		return "", err
	}
	if err := c.Kill(addr); err != nil {
		return addr, err
	}
	for {
		owner, err := c.PrimaryForKey(ctx, key)
		if err == nil && owner != addr {
			if err := c.WaitHealthy(ctx); err != nil {
				return addr, err
			}
			return addr, nil
		}
		select {
		case <-ctx.Done():
			return addr, fmt.Errorf("no replica promoted for key %q after killing %s: %w", key, addr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill SIGKILLs the node at addr and waits until the process is gone (not until the
// cluster has noticed).
func (c *Cluster) Kill(addr string) error {
	p := c.node(addr)
	if p == nil {
		return fmt.Errorf("no cluster node %q", addr)
	}
	return p.kill(syscall.SIGKILL, 10*time.Second)
}

// Restart starts the node at addr again with its old nodes.conf (so it rejoins with its
// identity, as a replica when it was failed over) and waits until the cluster is healthy.
func (c *Cluster) Restart(addr string) error {
	p := c.node(addr)
	if p == nil {
		return fmt.Errorf("no cluster node %q", addr)
	}
	if err := p.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := waitPing(ctx, c.acc, addr); err != nil {
		return err
	}
	return c.WaitHealthy(ctx)
}

// Slot is the Redis Cluster hash slot of key.
func Slot(key string) int { return hashslot.Of(key) }

// RunPackage runs a test package (from TestMain) with one standalone server and one
// cluster shared by all its tests — start-up is most of what such tests cost — and stops
// both afterwards. It returns m.Run's exit code, or 1 with a message naming what (for
// example "store tests") when Redis cannot be started.
func RunPackage(m *testing.M, what string, standalone **Server, cluster **Cluster) int {
	var err error
	if *standalone, err = Launch(Options{}); err != nil {
		fmt.Fprintln(os.Stderr, what+" need Redis:", err)
		return 1
	}
	defer (*standalone).Stop()
	if *cluster, err = LaunchCluster(Options{}); err != nil {
		fmt.Fprintln(os.Stderr, what+" need a Redis Cluster:", err)
		return 1
	}
	defer (*cluster).Stop()
	return m.Run()
}
