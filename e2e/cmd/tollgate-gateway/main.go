// Command tollgate-gateway is an HTTP reverse proxy that runs a proxy-wasm filter the way
// Envoy would, on the wazero-based host in internal/wazerohost. It serves the end-to-end scenarios
// that run on the wazero host (e2e/README.md says which) and the benchmarks; the demo and
// the Envoy scenarios run real Envoy.
//
// Each request is filtered on one of --workers VMs (chosen by the client connection,
// as a connection stays on one Envoy worker), then forwarded to --upstream. The
// filter's proxy_http_call reaches the clusters given with --cluster. The admin
// listener (--metrics-listen) serves /metrics (Prometheus text, as Envoy's
// /stats/prometheus), /stats (JSON), and with the token of --admin-token-file /logs and
// POST /config (hot reload); --access-log
// writes one line per request in Envoy's format syntax; SIGHUP re-reads --config. SIGTERM and SIGINT drain
// and stop the gateway.
package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// maxRequestBody bounds a request body the gateway buffers for the filter.
const maxRequestBody = 16 << 20

// clusterFlags collects repeated --cluster name=host:port[,host:port] flags.
type clusterFlags map[string][]string

func (c clusterFlags) String() string {
	names := make([]string, 0, len(c))
	for n, eps := range c {
		names = append(names, n+"="+strings.Join(eps, ","))
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

func (c clusterFlags) Set(v string) error {
	name, eps, ok := strings.Cut(v, "=")
	if !ok || name == "" || eps == "" {
		return fmt.Errorf("cluster %q: want name=host:port[,host:port...]", v)
	}
	for _, ep := range strings.Split(eps, ",") {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return fmt.Errorf("cluster %q: endpoint %q: %w", name, ep, err)
		}
		c[name] = append(c[name], ep)
	}
	return nil
}

// options are the parsed command line.
type options struct {
	wasm                 string
	configPath           string
	workers              int
	listen               string
	upstream             string
	clusters             clusterFlags
	metricsListen        string
	nodeID               string
	rootID               string
	logLevel             string
	streamIdleTimeout    time.Duration
	upstreamTimeout      time.Duration
	drainTimeout         time.Duration
	calloutFailuresReset bool
	failOpen             bool
	cacheDir             string
	accessLog            string
	accessLogFormat      string
	jwtPayloadInMetadata string // --jwt-payload-in-metadata
	adminTokenFile       string // --admin-token-file
	adminTokens          []string
}

var logLevels = map[string]int{
	"trace": wazerohost.LogTrace, "debug": wazerohost.LogDebug, "info": wazerohost.LogInfo,
	"warn": wazerohost.LogWarn, "error": wazerohost.LogError, "critical": wazerohost.LogCritical,
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{clusters: clusterFlags{}}
	fs := flag.NewFlagSet("tollgate-gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.wasm, "wasm", "", "proxy-wasm module to run (required), e.g. build/filter.wasm")
	fs.StringVar(&o.configPath, "config", "", "file with the plugin configuration (JSON) passed to proxy_on_configure; SIGHUP re-reads it")
	fs.IntVar(&o.workers, "workers", 2, "worker VMs, like Envoy's --concurrency")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address of the proxy listener")
	fs.StringVar(&o.upstream, "upstream", "", "URL requests are forwarded to (http://host:port[/prefix]); empty answers 200 itself")
	fs.Var(o.clusters, "cluster", "cluster for proxy_http_call as name=host:port[,host:port...] (repeatable)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "admin address serving /metrics, /stats, /logs and POST /config (empty: off)")
	fs.StringVar(&o.nodeID, "node-id", "", "node id (property node.id); defaults to the host name")
	fs.StringVar(&o.rootID, "root-id", "tollgate", "plugin root id (property plugin_root_id)")
	fs.StringVar(&o.logLevel, "log-level", "info", "plugin log level: trace, debug, info, warn, error, critical")
	fs.DurationVar(&o.streamIdleTimeout, "stream-idle-timeout", 5*time.Minute, "how long a paused request may wait for the filter (then 408)")
	fs.DurationVar(&o.upstreamTimeout, "upstream-timeout", 15*time.Second, "route timeout for the upstream (then 504)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 5*time.Second, "on shutdown, how long in-flight requests and proxy_done may take")
	fs.BoolVar(&o.calloutFailuresReset, "callout-failures-as-reset", false, "deliver callout timeouts/connect failures as 0 headers instead of Envoy's 504/503")
	fs.BoolVar(&o.failOpen, "fail-open", false, "let requests through unfiltered when a VM has failed (else 503)")
	fs.StringVar(&o.cacheDir, "cache-dir", "", "directory for wazero's compilation cache (faster restarts)")
	fs.StringVar(&o.accessLog, "access-log", "", "file to append one access-log line per request to (\"-\": stdout; empty: off)")
	fs.StringVar(&o.accessLogFormat, "access-log-format", wazerohost.DefaultAccessLogFormat, "access-log line in Envoy's format syntax (%REQ(..)%, %RESPONSE_CODE%, %FILTER_STATE(wasm.tollgate:PLAIN)%, ...)")
	fs.StringVar(&o.adminTokenFile, "admin-token-file", "", "file holding the bearer token(s), one per line, that POST /config and GET /logs require (without it they answer 401: a rule set from anyone who reaches the admin listener would open every limit)")
	fs.StringVar(&o.jwtPayloadInMetadata, "jwt-payload-in-metadata", "", "stand in for jwt_authn: put the bearer token's payload (signature NOT checked) in dynamic metadata under this key")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `tollgate-gateway runs a proxy-wasm HTTP filter (ABI v0.2.1) the way Envoy does and
proxies requests through it.

Usage:
  tollgate-gateway --wasm build/filter.wasm --config plugin.json --upstream http://127.0.0.1:9000 \
      --cluster tollgate-ratelimit=127.0.0.1:8081 --metrics-listen 127.0.0.1:9901

Flags:
`)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), `
Admin endpoints (--metrics-listen): GET /metrics (Prometheus), GET /stats (JSON); with
"Authorization: Bearer <token of --admin-token-file>": GET /logs (recent plugin log
lines), POST /config (new plugin configuration in the body).
Signals: SIGHUP re-reads --config; SIGTERM/SIGINT drain and exit.
`)
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.adminTokenFile != "" {
		b, err := os.ReadFile(o.adminTokenFile)
		if err != nil {
			return o, fmt.Errorf("--admin-token-file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				o.adminTokens = append(o.adminTokens, line)
			}
		}
		if len(o.adminTokens) == 0 {
			return o, fmt.Errorf("--admin-token-file %s: no token in it", o.adminTokenFile)
		}
	}
	if o.wasm == "" {
		return o, errors.New("--wasm is required")
	}
	if o.workers < 1 {
		return o, fmt.Errorf("--workers %d: want at least 1", o.workers)
	}
	if _, ok := logLevels[o.logLevel]; !ok {
		return o, fmt.Errorf("--log-level %q: want trace, debug, info, warn, error or critical", o.logLevel)
	}
	if o.nodeID == "" {
		o.nodeID, _ = os.Hostname()
	}
	if _, err := wazerohost.ParseAccessLogFormat(o.accessLogFormat); err != nil {
		return o, fmt.Errorf("--access-log-format: %w", err)
	}
	return o, nil
}

// jwtAuthn is the jwt_authn stand-in for --jwt-payload-in-metadata (nil when empty).
func jwtAuthn(payloadKey string) *wazerohost.JWTAuthn {
	if payloadKey == "" {
		return nil
	}
	return &wazerohost.JWTAuthn{PayloadInMetadata: payloadKey}
}

// gateway is the proxy and admin handlers around one Host.
type gateway struct {
	opts      options
	host      *wazerohost.Host
	logger    *log.Logger
	accessLog *accessLog // nil: off
}

func newGateway(o options, logger *log.Logger) (*gateway, error) {
	var pluginConfig []byte
	if o.configPath != "" {
		b, err := os.ReadFile(o.configPath)
		if err != nil {
			return nil, fmt.Errorf("read --config: %w", err)
		}
		pluginConfig = b
	}
	upstream := wazerohost.StaticUpstream(200, []wazerohost.Pair{{"content-type", "text/plain"}}, []byte("ok\n"))
	if o.upstream != "" {
		u, err := wazerohost.ProxyUpstream(o.upstream)
		if err != nil {
			return nil, err
		}
		upstream = u
	}
	level := logLevels[o.logLevel]
	var al *accessLog
	if o.accessLog != "" {
		var err error
		if al, err = openAccessLog(o.accessLog, o.accessLogFormat); err != nil {
			return nil, err
		}
	}
	var onDone func(wazerohost.AccessEntry)
	if al != nil {
		onDone = al.write
	}
	h, err := wazerohost.New(wazerohost.Config{
		WasmPath:               o.wasm,
		Workers:                o.workers,
		PluginConfig:           pluginConfig,
		RootID:                 o.rootID,
		PluginName:             o.rootID,
		NodeID:                 o.nodeID,
		Clusters:               o.clusters,
		Upstream:               upstream,
		LogLevel:               level,
		Log:                    func(l int, msg string) { logger.Printf("wasm [%s] %s", wazerohost.LevelName(l), msg) },
		StreamIdleTimeout:      o.streamIdleTimeout,
		UpstreamTimeout:        o.upstreamTimeout,
		DrainTimeout:           o.drainTimeout,
		CalloutFailuresAsReset: o.calloutFailuresReset,
		FailOpen:               o.failOpen,
		CompilationCacheDir:    o.cacheDir,
		OnStreamDone:           onDone,
		JWTAuthn:               jwtAuthn(o.jwtPayloadInMetadata),
	})
	if err != nil {
		if al != nil {
			_ = al.Close()
		}
		return nil, err
	}
	return &gateway{opts: o, host: h, logger: logger, accessLog: al}, nil
}

// ServeHTTP filters one request and writes the result.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.host.HTTPFrontend(maxRequestBody).ServeHTTP(w, r)
}

// admin serves the operator endpoints.
func (g *gateway) admin() http.Handler {
	mux := http.NewServeMux()
	// As Envoy's /stats/prometheus: per-rule stats are one series per rule with a rule
	// label (stats tags), histograms are histograms.
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.host.Gatherer(), promhttp.HandlerOpts{ErrorLog: g.logger}))
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{
			"node_id": g.opts.nodeID,
			"host":    g.host.Stats(),
			"metrics": g.host.Metrics(),
		})
	})
	mux.HandleFunc("GET /logs", g.authorized(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/plain")
		for _, e := range g.host.Logs() {
			fmt.Fprintln(w, e.String())
		}
	}))
	mux.HandleFunc("POST /config", g.authorized(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := g.host.Reconfigure(b); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		g.logger.Printf("configuration replaced through POST /config from %s", r.RemoteAddr)
		fmt.Fprintln(w, "ok")
	}))
	return mux
}

// authorized wraps an admin handler that changes the gateway or shows what it logs: it
// answers 401 unless the request carries one of --admin-token-file's tokens (compared
// in constant time); without the file, it answers 401 to everyone.
func (g *gateway) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		match := 0
		for _, want := range g.opts.adminTokens {
			match |= subtle.ConstantTimeCompare([]byte(got), []byte(want))
		}
		if !ok || got == "" || match != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate-gateway-admin"`)
			http.Error(w, "missing or wrong admin token (--admin-token-file)", http.StatusUnauthorized)
			return
		}
		h(w, r)
	}
}

// reload re-reads --config and applies it.
func (g *gateway) reload() error {
	if g.opts.configPath == "" {
		return errors.New("no --config to reload")
	}
	b, err := os.ReadFile(g.opts.configPath)
	if err != nil {
		return fmt.Errorf("read --config: %w", err)
	}
	return g.host.Reconfigure(b)
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := log.New(stderr, "tollgate-gateway ", log.LstdFlags|log.Lmicroseconds)
	g, err := newGateway(o, logger)
	if err != nil {
		return err
	}
	defer g.host.Close()
	if g.accessLog != nil {
		defer g.accessLog.Close() // after the host: the last streams end in its Close
	}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, ErrorLog: logger, Protocols: wazerohost.Protocols()}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	logger.Printf("proxy listening on %s (%d workers, node %q)", ln.Addr(), o.workers, o.nodeID)

	var adminSrv *http.Server
	if o.metricsListen != "" {
		aln, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("listen %s: %w", o.metricsListen, err)
		}
		adminSrv = &http.Server{Handler: g.admin(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: logger}
		go func() { errc <- adminSrv.Serve(aln) }()
		logger.Printf("admin listening on %s", aln.Addr())
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := g.reload(); err != nil {
				logger.Printf("reload: %v", err)
			} else {
				logger.Printf("configuration reloaded from %s", o.configPath)
			}
			continue
		case err := <-errc:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
		}
		break
	}
	logger.Printf("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout+5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Printf("proxy shutdown: %v", err)
	}
	if adminSrv != nil {
		_ = adminSrv.Shutdown(sctx)
	}
	return g.host.Close()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "tollgate-gateway:", err)
		os.Exit(1)
	}
}
