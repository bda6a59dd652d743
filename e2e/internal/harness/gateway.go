package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// SyncCluster is the cluster name gateways call the sync service by (as in envoy.yaml).
const SyncCluster = "tollgate_ratelimit"

// Sync is the "sync" section of a gateway's plugin configuration. Zero fields take the
// values below (the filter's documented defaults, except the node id).
type Sync struct {
	IntervalMs      int // 100
	TimeoutMs       int // 250
	LeaseTTLMs      int // the filter's default (60000)
	ExpectedNodes   int // 1
	BreakerFailures int // 3
	BreakerOpenMs   int // 1000
}

func (s Sync) withDefaults() Sync {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&s.IntervalMs, 100)
	def(&s.TimeoutMs, 250)
	def(&s.ExpectedNodes, 1)
	def(&s.BreakerFailures, 3)
	def(&s.BreakerOpenMs, 1000)
	return s
}

// GatewayConfig describes one gateway: a proxy with Workers worker VMs.
type GatewayConfig struct {
	// Host is the proxy the gateway runs on: Wazero (the default, internal/wazerohost in this
	// process) or EnvoyHost(release), a real Envoy process running the shipped envoy.yaml
	// with only addresses, ports, paths and the plugin configuration substituted
	// (EnvoyConfigFrom), the filter on envoy.wasm.runtime.v8.
	Host    string
	Wasm    []byte
	Workers int    // default 2
	NodeID  string // sync.node and the node.id property
	// Name names the gateway in tables and errors (default NodeID).
	Name string
	// Plugin, when set, is the whole plugin configuration, handed to the filter as is:
	// Rules, Pin, Secret, Sync and NodeID's sync.node are ignored (a shipped manifest's
	// configuration, deploy.CheckEnvoy). The sync cluster still lists Services.
	Plugin []byte
	// Properties are extra host properties by dotted path (node.metadata.NAME, ...).
	Properties map[string]string
	// Rules is the rule document (shared/rule/SCHEMA.md) without "sync": the harness
	// adds the sync section.
	Rules []byte
	// Pin, when > 0, is written as the document's "version". A gateway adopts a rule set
	// from the service only when the service's version is newer, so a pinned gateway
	// keeps its own rules whatever other scenarios stored at the service.
	Pin uint64
	// Services are the endpoints of the sync cluster (round robin). Empty: no sync, the
	// gateway limits on its own.
	Services []string
	Secret   string
	Sync     Sync
	// Upstream is the URL allowed requests go to; empty answers 200 "ok".
	Upstream string
	// JWTAuthn stands in for Envoy's jwt_authn filter before the plugin (bearer token
	// payloads in dynamic metadata); nil: none. Wazero host only.
	JWTAuthn *wazerohost.JWTAuthn

	// Bootstrap replaces the shipped envoy.yaml an Envoy host starts from (a scenario's
	// variant of it); nil: the shipped file.
	Bootstrap []byte
	// EnvoyNodeID is the Envoy bootstrap's node.id; "" sets none, as shipped.
	EnvoyNodeID string
	// EnvoyLogLevel is Envoy's log level ("" means warning).
	EnvoyLogLevel string
	// Reloadable makes an Envoy gateway take its listener by LDS from a watched file
	// (EnvoyBootstrap.LDS), so that Reconfigure changes the plugin configuration
	// without restarting Envoy. The wazero host always can.
	Reloadable bool
	// UpstreamHTTP2: the gateway speaks HTTP/2 to Upstream (a gRPC server). The wazero
	// host's proxy picks the protocol by itself.
	UpstreamHTTP2 bool
	// FailurePolicy is what a request meets when its worker's VM has failed: "FAIL_OPEN"
	// (it passes unfiltered, as the shipped envoy.yaml says) or "FAIL_CLOSED" (503). ""
	// is the shipped FAIL_OPEN on Envoy, and FAIL_CLOSED on the wazero host.
	FailurePolicy string
}

// PluginConfig returns the plugin configuration the gateway's filter receives.
func (c GatewayConfig) PluginConfig() ([]byte, error) {
	if c.Plugin != nil {
		return c.Plugin, nil
	}
	dec := json.NewDecoder(bytes.NewReader(c.Rules))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("rules document: %w", err)
	}
	if c.Pin > 0 {
		doc["version"] = c.Pin
	}
	if len(c.Services) > 0 {
		s := c.Sync.withDefaults()
		doc["sync"] = map[string]any{
			"cluster": SyncCluster, "authority": "ratelimit", "secret": c.Secret, "node": c.NodeID,
			"interval_ms": s.IntervalMs, "timeout_ms": s.TimeoutMs,
			"expected_nodes": s.ExpectedNodes, "breaker_failures": s.BreakerFailures,
			"breaker_open_ms": s.BreakerOpenMs,
		}
		if s.LeaseTTLMs > 0 {
			doc["sync"].(map[string]any)["lease_ttl_ms"] = s.LeaseTTLMs
		}
	}
	return json.Marshal(doc)
}

// Gateway is a running gateway on one of the hosts: the wazero host behind an HTTP
// listener in this process, or a real Envoy process. Scenarios talk to it over HTTP
// (URL) and read its filter's metrics, whichever host it runs on.
type Gateway struct {
	Name  string
	URL   string // http://127.0.0.1:port
	Proxy string // the host it runs on (Wazero, EnvoyHost(v))
	// One of the two is set.
	host  *wazerohost.Host
	envoy *envoyGateway

	workers int
	srv     *http.Server
	done    chan struct{}
}

// StartGateway starts a gateway on cfg.Host with its listener on a free loopback port.
func StartGateway(cfg GatewayConfig) (*Gateway, error) {
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Name == "" {
		cfg.Name = cfg.NodeID
	}
	if cfg.Host == "" {
		cfg.Host = Wazero
	}
	pc, err := cfg.PluginConfig()
	if err != nil {
		return nil, err
	}
	if v := envoyRelease(cfg.Host); v != "" {
		eg, err := startEnvoy(v, cfg, pc)
		if err != nil {
			return nil, fmt.Errorf("gateway %q: %w", cfg.Name, err)
		}
		return &Gateway{Name: cfg.Name, URL: fmt.Sprintf("http://127.0.0.1:%d", eg.port), Proxy: cfg.Host,
			envoy: eg, workers: cfg.Workers}, nil
	}
	if cfg.Host != Wazero {
		return nil, fmt.Errorf("gateway %q: unknown host %q", cfg.Name, cfg.Host)
	}
	upstream := wazerohost.StaticUpstream(200, []wazerohost.Pair{{"content-type", "text/plain"}}, []byte("ok\n"))
	if cfg.Upstream != "" {
		if upstream, err = wazerohost.ProxyUpstream(cfg.Upstream); err != nil {
			return nil, err
		}
	}
	clusters := map[string][]string{}
	if len(cfg.Services) > 0 {
		clusters[SyncCluster] = cfg.Services
	}
	h, err := wazerohost.New(wazerohost.Config{
		Wasm:         cfg.Wasm,
		Workers:      cfg.Workers,
		PluginConfig: pc,
		RootID:       "tollgate",
		PluginName:   "tollgate",
		NodeID:       cfg.NodeID,
		Properties:   cfg.Properties,
		Clusters:     clusters,
		Upstream:     upstream,
		LogLevel:     wazerohost.LogInfo,
		// A request the filter pauses waits at most this long (a strict check).
		StreamIdleTimeout: 10 * time.Second,
		UpstreamTimeout:   10 * time.Second,
		JWTAuthn:          cfg.JWTAuthn,
		FailOpen:          cfg.FailurePolicy == "FAIL_OPEN",
	})
	if err != nil {
		return nil, fmt.Errorf("gateway %q: %w", cfg.NodeID, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("gateway %q: listen: %w", cfg.NodeID, err)
	}
	g := &Gateway{Name: cfg.Name, URL: "http://" + ln.Addr().String(), Proxy: Wazero, host: h, workers: cfg.Workers, done: make(chan struct{})}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0), Protocols: wazerohost.Protocols()}
	go func() {
		defer close(g.done)
		// Serve only ends with Shutdown (ErrServerClosed) or a dead listener, which the
		// scenario then sees as failed requests.
		_ = g.srv.Serve(ln)
	}()
	return g, nil
}

// Host is the gateway's wasm host (metrics, logs, shared data) on the wazero host, nil
// on Envoy.
func (g *Gateway) Host() *wazerohost.Host { return g.host }

// Envoy is the Envoy process of a gateway on Envoy (admin API, pid), nil on wazero.
func (g *Gateway) Envoy() *envoyproc.Proc {
	if g.envoy == nil {
		return nil
	}
	return g.envoy.proc
}

// Workers is how many worker VMs the gateway runs.
func (g *Gateway) Workers() int { return g.workers }

// Metric is one of the filter's metrics by its full name ("tollgate.requests_allowed");
// on Envoy it is read from the admin API's /stats (-1 when that fails), after the filter's
// next tick for a counter (the filter hands its counts to Envoy on its tick), so it counts
// every request answered before the call.
func (g *Gateway) Metric(name string) int64 {
	if g.envoy != nil {
		return g.envoy.metric(name, true)
	}
	return g.host.Metrics()[name]
}

// MetricNow is Metric without waiting for a tick on Envoy: a counter as of the filter's
// last tick, for loops that watch a counter rise.
func (g *Gateway) MetricNow(name string) int64 {
	if g.envoy != nil {
		return g.envoy.metric(name, false)
	}
	return g.host.Metrics()[name]
}

// AccessLog is what the gateway wrote to its access log so far (Envoy's stdout, where
// the shipped envoy.yaml sends it); "" on the wazero host.
func (g *Gateway) AccessLog() string {
	if g.envoy == nil {
		return ""
	}
	return g.envoy.log.String()
}

// Reconfigure hands the filter a new plugin configuration without restarting the
// gateway: on Envoy a new listener version by LDS (the gateway must have been started
// Reloadable), on the wazero host the host's own reconfiguration (proxy_on_configure
// on new root contexts of the same VMs).
func (g *Gateway) Reconfigure(cfg GatewayConfig) error {
	pc, err := cfg.PluginConfig()
	if err != nil {
		return err
	}
	if g.envoy != nil {
		return g.envoy.reconfigure(pc)
	}
	return g.host.Reconfigure(pc)
}

// WorkerClient returns a client whose connections to g all land on worker w (as Envoy
// keeps a connection on one worker): the client dials until a connection lands on w
// (bounded; 2 workers need ~2 dials on average). The wazero gateway picks a connection's
// worker from the client's address; on Envoy the dial reads which worker accepted it.
func (g *Gateway) WorkerClient(w int) *Client {
	var d net.Dialer
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		for attempt := 0; attempt < 256; attempt++ {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if g.host.PickWorker(c.LocalAddr().String()) == w {
				return c, nil
			}
			_ = c.Close()
		}
		return nil, fmt.Errorf("no connection to %s landed on worker %d in 256 dials", addr, w)
	}
	if g.envoy != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return g.envoy.dialWorker(ctx, network, addr, w)
		}
	}
	tr := &http.Transport{
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		DialContext:         dial,
	}
	return &Client{hc: &http.Client{Transport: tr, Timeout: 15 * time.Second}}
}

// Close stops the gateway. Safe to call twice.
func (g *Gateway) Close() {
	if g.envoy != nil {
		g.envoy.close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	<-g.done
	_ = g.host.Close()
}

// maxBody bounds a request body the gateway buffers for the filter.
const maxBody = 1 << 20

// ServeHTTP runs one request through the filter, the way e2e/cmd/tollgate-gateway does:
// a client connection stays on one worker.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.host.HTTPFrontend(maxBody).ServeHTTP(w, r)
}
