package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	// The backend cluster's HTTP/2 option (EnvoyBootstrap.UpstreamHTTP2) is checked by
	// deploy.CheckEnvoy, which resolves typed configs through the linked types.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/deploy"
	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// Wazero names the project's own proxy-wasm host (internal/wazerohost) as a gateway's host.
const Wazero = "wazero"

// EnvoyHost names the real Envoy of release v as a gateway's host ("envoy-1.40.0").
func EnvoyHost(v string) string { return "envoy-" + v }

// Hosts are the hosts a scenario that applies to every proxy runs on: the wazero host
// and each Envoy release the suite supports (envoyproc.Releases).
func Hosts() []string {
	out := []string{Wazero}
	for _, v := range envoyproc.Releases {
		out = append(out, EnvoyHost(v))
	}
	return out
}

// EnvoyHosts are Hosts without the wazero host.
func EnvoyHosts() []string { return Hosts()[1:] }

// envoyRelease returns the release of an Envoy host name, "" for another host.
func envoyRelease(host string) string {
	v, ok := strings.CutPrefix(host, "envoy-")
	if !ok {
		return ""
	}
	return v
}

// EnvoyBootstrap is what EnvoyConfigFrom substitutes in a shipped bootstrap: addresses,
// ports, paths and the plugin configuration. Nothing else of the file changes.
type EnvoyBootstrap struct {
	Wasm     string   // path of the compiled filter (vm_config.code.local.filename)
	Plugin   []byte   // the plugin configuration (configuration.value); nil keeps the file's
	Services []string // host:port of each sync service replica (cluster tollgate_ratelimit)
	Upstream string   // host:port of the backend cluster
	NodeID   string   // the bootstrap's node.id; "" sets none (as shipped)
	// LDS, when set, is the path of a file the listeners move to: Envoy reads them by
	// LDS from that file and takes a new version when the file is replaced (renamed
	// over), so the plugin configuration can change without restarting Envoy. The
	// listener then binds ListenPort (a port picked for it: Envoy cannot keep an
	// ephemeral port across listener versions).
	LDS        string
	ListenPort int
	// UpstreamHTTP2 makes the backend cluster speak HTTP/2 (a gRPC upstream needs it;
	// the shipped backend is HTTP/1.1).
	UpstreamHTTP2 bool
	// FailurePolicy replaces the filter's failure_policy ("FAIL_CLOSED"); "" keeps the
	// shipped one.
	FailurePolicy string
}

// EnvoyConfigFrom rewrites a shipped Envoy bootstrap (envoy.yaml) for a test: the admin
// and proxy listeners on 127.0.0.1 with ports Envoy picks (read back from the admin API),
// the filter's file and plugin configuration, the endpoints of the backend and sync
// clusters. The result is checked with deploy.CheckEnvoy, as the shipped file is. With
// b.LDS set it also returns the content of the LDS file (see EnvoyBootstrap.LDS).
func EnvoyConfigFrom(shipped []byte, b EnvoyBootstrap) (bootstrap, lds []byte, err error) {
	js, err := yaml.YAMLToJSON(shipped)
	if err != nil {
		return nil, nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, nil, err
	}
	loopback := map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 0}}
	doc["admin"].(map[string]any)["address"] = loopback
	listen := map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": b.ListenPort}}
	if b.NodeID != "" {
		node, _ := doc["node"].(map[string]any)
		if node == nil {
			node = map[string]any{}
		}
		node["id"] = b.NodeID
		doc["node"] = node
	}
	sr, _ := doc["static_resources"].(map[string]any)
	if sr == nil {
		return nil, nil, fmt.Errorf("envoy bootstrap: no static_resources")
	}
	filters := 0
	for _, l := range list(sr["listeners"]) {
		lm := l.(map[string]any)
		lm["address"] = listen
		for _, fc := range list(lm["filter_chains"]) {
			for _, nf := range list(fc.(map[string]any)["filters"]) {
				tc, _ := nf.(map[string]any)["typed_config"].(map[string]any)
				for _, hf := range list(tc["http_filters"]) {
					hm := hf.(map[string]any)
					if hm["name"] != "envoy.filters.http.wasm" {
						continue
					}
					cfg := hm["typed_config"].(map[string]any)["config"].(map[string]any)
					if cfg["root_id"] != deploy.RootID {
						continue
					}
					cfg["vm_config"].(map[string]any)["code"] = map[string]any{"local": map[string]any{"filename": b.Wasm}}
					if b.Plugin != nil {
						cfg["configuration"].(map[string]any)["value"] = string(b.Plugin)
					}
					if b.FailurePolicy != "" {
						cfg["failure_policy"] = b.FailurePolicy
					}
					filters++
				}
			}
		}
	}
	if filters != 1 {
		return nil, nil, fmt.Errorf("envoy bootstrap: %d Tollgate filters, want 1", filters)
	}
	for _, c := range list(sr["clusters"]) {
		cm := c.(map[string]any)
		var addrs []string
		switch cm["name"] {
		case "backend":
			addrs = []string{b.Upstream}
		case SyncCluster:
			addrs = b.Services
		default:
			continue
		}
		var eps []any
		for _, a := range addrs {
			h, p, err := net.SplitHostPort(a)
			if err != nil {
				return nil, nil, fmt.Errorf("cluster %v: %w", cm["name"], err)
			}
			port, _ := strconv.Atoi(p)
			eps = append(eps, map[string]any{"endpoint": map[string]any{"address": map[string]any{
				"socket_address": map[string]any{"address": h, "port_value": port}}}})
		}
		cm["load_assignment"] = map[string]any{"cluster_name": cm["name"], "endpoints": []any{map[string]any{"lb_endpoints": eps}}}
		if cm["name"] == "backend" && b.UpstreamHTTP2 {
			cm["typed_extension_protocol_options"] = map[string]any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": map[string]any{
				"@type":                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
				"explicit_http_config": map[string]any{"http2_protocol_options": map[string]any{}}}}
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, err
	}
	if _, err := deploy.CheckEnvoy(out); err != nil {
		return nil, nil, fmt.Errorf("rewritten bootstrap: %w", err)
	}
	if b.LDS == "" {
		return out, nil, nil
	}
	var resources []any
	for _, l := range list(sr["listeners"]) {
		l.(map[string]any)["@type"] = "type.googleapis.com/envoy.config.listener.v3.Listener"
		resources = append(resources, l)
	}
	delete(sr, "listeners")
	doc["dynamic_resources"] = map[string]any{"lds_config": map[string]any{
		"resource_api_version": "V3", "path_config_source": map[string]any{"path": b.LDS}}}
	if out, err = json.Marshal(doc); err != nil {
		return nil, nil, err
	}
	if lds, err = json.Marshal(map[string]any{"resources": resources}); err != nil {
		return nil, nil, err
	}
	return out, lds, nil
}

func list(v any) []any { l, _ := v.([]any); return l }

// ShippedEnvoyYAML reads the repository's envoy.yaml.
func ShippedEnvoyYAML() ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(root, "envoy.yaml"))
}

// envoyGateway is a real Envoy process running the shipped bootstrap.
type envoyGateway struct {
	proc    *envoyproc.Proc
	dir     string
	port    int // the proxy listener's port
	workers int
	log     *lockedBuffer // Envoy's stdout: the access log

	dialMu sync.Mutex // one WorkerClient dial at a time (see dialWorker)

	shipped []byte         // the bootstrap it started from
	boot    EnvoyBootstrap // what was substituted in it
	// flushWait is how late the filter's counters reach Envoy's stats (metric).
	flushWait time.Duration
}

// reconfigure delivers a new plugin configuration by LDS: the listener file is written
// beside the watched one and renamed over it (Envoy's file watch sees a move), and the
// call returns once Envoy counts one more successful LDS update and no listener is
// warming — the new filter configuration serves from then on. A rejected configuration
// (lds.update_rejected) is returned as an error.
func (g *envoyGateway) reconfigure(plugin []byte) error {
	if g.boot.LDS == "" {
		return fmt.Errorf("envoy gateway not started Reloadable: its listener is static")
	}
	b := g.boot
	b.Plugin = plugin
	g.flushWait = flushWait(plugin)
	_, lds, err := EnvoyConfigFrom(g.shipped, b)
	if err != nil {
		return err
	}
	const counters = `^listener_manager\.(lds\.update_success|lds\.update_rejected|total_listeners_warming)$`
	before, err := g.stats(counters)
	if err != nil {
		return err
	}
	tmp := g.boot.LDS + ".new"
	if err := os.WriteFile(tmp, lds, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, g.boot.LDS); err != nil {
		return err
	}
	return Poll(30*time.Second, 10*time.Millisecond, func() (bool, error) {
		now, err := g.stats(counters)
		if err != nil {
			return false, err
		}
		if now["listener_manager.lds.update_rejected"] > before["listener_manager.lds.update_rejected"] {
			return false, fmt.Errorf("envoy rejected the listener update: %s", g.proc.LogTail(5))
		}
		return now["listener_manager.lds.update_success"] > before["listener_manager.lds.update_success"] &&
			now["listener_manager.total_listeners_warming"] == 0, nil
	})
}

// startEnvoy starts release v with the shipped envoy.yaml rewritten for cfg.
func startEnvoy(v string, cfg GatewayConfig, plugin []byte) (*envoyGateway, error) {
	if cfg.JWTAuthn != nil || len(cfg.Properties) > 0 {
		return nil, fmt.Errorf("envoy %s: JWTAuthn and Properties are wazero host stand-ins", v)
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	bin, err := envoyproc.Binary(root, v)
	if err != nil {
		return nil, err
	}
	shipped := cfg.Bootstrap
	if shipped == nil {
		if shipped, err = ShippedEnvoyYAML(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "tollgate-envoy-")
	if err != nil {
		return nil, err
	}
	wasm := filepath.Join(dir, "filter.wasm")
	if err := os.WriteFile(wasm, cfg.Wasm, 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	upstream := "127.0.0.1:9" // discard: a scenario without an upstream never reaches it
	if cfg.Upstream != "" {
		u, err := url.Parse(cfg.Upstream)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		upstream = u.Host
	}
	services := cfg.Services
	if len(services) == 0 {
		services = []string{"127.0.0.1:9"}
	}
	b := EnvoyBootstrap{Wasm: wasm, Plugin: plugin, Services: services, Upstream: upstream, NodeID: cfg.EnvoyNodeID,
		UpstreamHTTP2: cfg.UpstreamHTTP2, FailurePolicy: cfg.FailurePolicy}
	if cfg.Reloadable {
		b.LDS = filepath.Join(dir, "lds.json")
		if b.ListenPort, err = envoyproc.FreePort(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	boot, lds, err := EnvoyConfigFrom(shipped, b)
	if err == nil && lds != nil {
		err = os.WriteFile(b.LDS, lds, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	g := &envoyGateway{dir: dir, workers: cfg.Workers, log: &lockedBuffer{}, shipped: shipped, boot: b, flushWait: flushWait(b.Plugin)}
	var args []string
	if b.LDS != "" {
		// Envoy takes dynamic resources only from a node with an id and a cluster.
		node := cfg.EnvoyNodeID
		if node == "" {
			node = cfg.NodeID
		}
		if node == "" {
			node = filepath.Base(dir)
		}
		args = []string{"--service-node", node, "--service-cluster", "tollgate-e2e"}
	}
	// V8 compiles the whole module with TurboFan before Envoy is ready (2 s on an idle
	// core, 15–60 s when several start at once on a loaded 2-core machine).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g.proc, err = envoyproc.Start(ctx, envoyproc.Options{Binary: bin, Config: boot, Concurrency: cfg.Workers, Dir: dir, LogLevel: cfg.EnvoyLogLevel, Stdout: g.log, Args: args})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("envoy %s: %w", v, err)
	}
	if b.ListenPort != 0 {
		g.port = b.ListenPort
	} else if g.port, err = g.listenerPort(ctx); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// listenerPort reads the proxy listener's port from /listeners.
func (g *envoyGateway) listenerPort(ctx context.Context) (int, error) {
	body, err := g.proc.Get(ctx, "/listeners?format=json")
	if err != nil {
		return 0, err
	}
	var ls struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					PortValue int `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal([]byte(body), &ls); err != nil {
		return 0, fmt.Errorf("/listeners: %w", err)
	}
	for _, l := range ls.ListenerStatuses {
		if p := l.LocalAddress.SocketAddress.PortValue; p != 0 {
			return p, nil
		}
	}
	return 0, fmt.Errorf("/listeners: no listener port in %s", body)
}

// stats returns Envoy's counters and gauges whose names match re.
func (g *envoyGateway) stats(re string) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := g.proc.Get(ctx, "/stats?filter="+url.QueryEscape(re))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(val, 10, 64); err == nil {
			out[name] = n
		}
	}
	return out, nil
}

// flushWait is how long a read of the filter's counters waits first: the filter hands
// its counts to Envoy on its tick (a quarter sync interval with sync, plugin.MetricsFlushMs
// without), so the stats see every answered request one tick later; 50 ms more for a
// loaded machine's late timer.
func flushWait(pluginConfig []byte) time.Duration {
	tick := time.Duration(plugin.MetricsFlushMs) * time.Millisecond
	if cfg, err := rule.Parse(pluginConfig); err == nil && cfg.Sync.Cluster != "" {
		tick = time.Duration(max(cfg.Sync.IntervalMs/4, 1)) * time.Millisecond
	}
	return tick + 50*time.Millisecond
}

// metric is a filter metric ("tollgate.requests_allowed"). Envoy names the stats a
// module defines with a "wasmcustom." prefix (and keeps the rule tag in the name). A
// counter is read one tick late (flushWait) when wait is set; a stat the filter sets at
// once is never waited for.
func (g *envoyGateway) metric(name string, wait bool) int64 {
	if wait && !slices.Contains(plugin.RecordedMetrics, name) {
		time.Sleep(g.flushWait)
	}
	st, err := g.stats("^(wasmcustom\\.)?" + regexp.QuoteMeta(name) + "$")
	if err != nil {
		return -1
	}
	var n int64
	for _, v := range st {
		n += v
	}
	return n
}

// workerConns counts the connections each worker accepted on the proxy listener
// (listener.<configured address>.worker_<n>.downstream_cx_total; the bootstrap has
// one listener, and its stats name the configured port, 0).
func (g *envoyGateway) workerConns() ([]int64, error) {
	st, err := g.stats(`^listener\.127\.0\.0\.1_[0-9]+\.worker_[0-9]+\.downstream_cx_total$`)
	if err != nil {
		return nil, err
	}
	out := make([]int64, g.workers)
	for name, v := range st {
		i := strings.Index(name, ".worker_")
		w, err := strconv.Atoi(strings.TrimSuffix(name[i+len(".worker_"):], ".downstream_cx_total"))
		if err == nil && w < len(out) {
			out[w] = v
		}
	}
	return out, nil
}

// dialWorker dials the proxy listener until a connection lands on worker w. The kernel
// spreads connections over the workers' sockets (SO_REUSEPORT), so the only way to know
// a connection's worker is to see which worker's accept counter it moved. Dials through
// WorkerClient are serialised per gateway; other traffic opening connections to the same
// gateway meanwhile would be misread, so scenarios open worker clients before their load.
func (g *envoyGateway) dialWorker(ctx context.Context, network, addr string, w int) (net.Conn, error) {
	g.dialMu.Lock()
	defer g.dialMu.Unlock()
	var d net.Dialer
	for attempt := 0; attempt < 64; attempt++ {
		before, err := g.workerConns()
		if err != nil {
			return nil, err
		}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		landed := -1
		for wait := 0; wait < 200 && landed < 0; wait++ {
			after, err := g.workerConns()
			if err != nil {
				c.Close()
				return nil, err
			}
			for i := range after {
				if after[i] > before[i] {
					landed = i
				}
			}
			if landed < 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if landed == w {
			return c, nil
		}
		c.Close()
	}
	return nil, fmt.Errorf("no connection to %s landed on envoy worker %d in 64 dials", addr, w)
}

func (g *envoyGateway) close() {
	_ = g.proc.Stop()
	os.RemoveAll(g.dir)
}

// lockedBuffer collects a process's output for reading while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
