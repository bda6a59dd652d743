// Package wazerohost runs a proxy-wasm HTTP filter (ABI v0.2.1) on wazero the way Envoy
// runs it, so Tollgate's filter can be tested, demonstrated and benchmarked without an
// Envoy binary.
//
// A Host compiles the module once and instantiates one VM per worker (an Envoy worker
// thread has its own Wasm instance); all VMs share one SharedData store, one metric
// registry and one log. Requests go through Serve/Handle (the HTTP filter chain: request
// headers, pause and resume, local replies, the upstream, response headers, then
// proxy_on_log, proxy_on_done, proxy_on_delete); proxy_http_call performs real HTTP
// requests to the clusters in Config; proxy_set_tick_period_milliseconds drives
// proxy_on_tick. Where the semantics are Envoy's rather than the spec's (CAS values,
// which calls see which headers, how callout failures arrive, reconfiguration through
// a new root context and a configuration canary) the host follows Envoy's
// source/extensions/common/wasm/context.cc and proxy-wasm-cpp-host; README.md lists
// the calls implemented and every known departure.
//
// Spec: https://github.com/proxy-wasm/spec/tree/main/abi-versions/v0.2.1
package wazerohost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/tollgate-rl/tollgate/internal/shareddata"
)

// Config describes one gateway: the plugin, its workers and the clusters it may call.
type Config struct {
	// Wasm is the module; WasmPath is read when Wasm is empty.
	Wasm     []byte
	WasmPath string

	// Workers is the number of worker VMs (Envoy --concurrency). Default 1.
	Workers int

	// PluginConfig is returned for PLUGIN_CONFIGURATION in proxy_on_configure;
	// VMConfig for VM_CONFIGURATION in proxy_on_vm_start.
	PluginConfig []byte
	VMConfig     []byte

	// Identity, served as the properties plugin_root_id, plugin_name, plugin_vm_id and
	// node.id.
	RootID     string
	PluginName string
	VMID       string
	NodeID     string

	// Properties adds or overrides properties by dotted path ("node.metadata.region").
	Properties map[string]string

	// StatsTags are applied to the plugin's stat names when exported to Prometheus, as
	// Envoy's stats_config.stats_tags are (nil: DefaultStatsTags; empty: none).
	StatsTags []StatsTag

	// OnStreamDone, if set, is called once a stream ends with what an access log needs:
	// the request, the status the client got, and the filter state the plugin set.
	// It is called with the VM locked and must not call back into the Host.
	OnStreamDone func(AccessEntry)

	// Clusters maps a cluster name (the proxy_http_call upstream) to its endpoints
	// ("127.0.0.1:8080"), used round robin.
	Clusters map[string][]string

	// Upstream serves requests the filter lets through. Nil answers 404, as a route
	// table without a match would.
	Upstream Upstream

	// Log receives every plugin log line at or above LogLevel (besides the ring buffer
	// read by Logs). It is called with the VM locked and must not call back into the Host.
	Log func(level int, msg string)
	// LogLevel is what proxy_get_log_level reports and the threshold below which log
	// lines are dropped. The zero value (trace) keeps everything; Envoy's default is info.
	LogLevel int
	// LogRingSize is how many log lines Logs keeps. Default 1024.
	LogRingSize int

	// BodyChunkBytes is the size of the chunks a response body is handed to
	// proxy_on_response_body in (the last may be shorter). Default 16 KiB, a typical
	// data frame.
	BodyChunkBytes int

	// StreamIdleTimeout bounds how long a paused request waits for the filter to resume
	// it; then it is answered 408 "stream timeout", like Envoy's stream idle timeout.
	// Default 5 minutes (Envoy's default).
	StreamIdleTimeout time.Duration
	// UpstreamTimeout bounds a call to Upstream, like Envoy's route timeout. Default
	// 15 s (Envoy's default); negative means none.
	UpstreamTimeout time.Duration
	// DrainTimeout bounds how long Close and Reconfigure wait for a root context that
	// returned false from proxy_on_done to call proxy_done, and for in-flight requests
	// to finish. Default 2 s.
	DrainTimeout time.Duration

	// CalloutFailuresAsReset delivers callout timeouts and connection failures as
	// 0 headers / 0 body (the spec's reading) instead of Envoy's synthesised 504/503
	// responses.
	CalloutFailuresAsReset bool

	// FailOpen lets requests through unfiltered when a VM has failed (Envoy's
	// fail_open); otherwise they get 503.
	FailOpen bool

	// SharedData lets several Hosts share one store (several plugins in one Envoy).
	// Nil gives the Host its own.
	SharedData *shareddata.Store

	// CompilationCacheDir keeps compiled code on disk between processes. Empty uses a
	// process-wide in-memory cache.
	CompilationCacheDir string

	// CountHostCalls makes every worker count the host functions the module calls and
	// the proxy_on_memory_allocate calls the host makes into it (HostCalls), so a
	// benchmark can show where a filter's time goes. Off by default: a counted call
	// costs a map update.
	CountHostCalls bool

	// WASI picks the WASI surface offered to the module: all of it (the default), or
	// that of an older Envoy release (WASIEnvoy133, WASILegacy), to run a module the
	// way those releases would.
	WASI WASIMode

	// JWTAuthn, when set, stands in for Envoy's jwt_authn filter running before the
	// plugin: a request's bearer token payload is put in its dynamic metadata (see
	// JWTAuthn). Nil: requests carry only the Metadata they were given.
	JWTAuthn *JWTAuthn

	// Clock replaces the time the module reads (WASI clock_time_get, both clocks, and
	// proxy_get_current_time_nanoseconds), for deterministic tests. The monotonic clock
	// follows it but never goes back. Ticks, timeouts and callouts keep real time.
	// Nil uses the system clocks.
	Clock func() time.Time
}

// Host is a running gateway: K worker VMs of one plugin.
type Host struct {
	cfg      Config
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	vms      []*vm
	shared   *shareddata.Store
	metrics  *metricRegistry
	registry *prometheus.Registry // exports metrics and the host's own counters
	logs     *logRing
	clusters map[string]*cluster
	client   *http.Client

	ctx    context.Context // cancelled by Close: stops ticks and callouts
	cancel context.CancelFunc
	bg     sync.WaitGroup // tick loops, callouts, root retirements

	inflight  inflight
	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error

	// streamCtx is cancelled when Close has given in-flight requests their drain
	// time: paused and proxied requests still running are reset.
	streamCtx    context.Context
	streamCancel context.CancelFunc

	reconfMu sync.Mutex
	canaries atomic.Int64

	rr    atomic.Uint64
	stats hostStats

	monoMu   sync.Mutex
	monoBase time.Time
	monoLast int64
}

type hostStats struct {
	requests, localReplies, paused, pauseTimeouts, upstreamErrors atomic.Int64
	callouts, calloutFailures, ticks, vmFailures, reconfigures    atomic.Int64
	pollOneoff, startupRefused                                    atomic.Int64
}

// Process-wide compilation caches: compiling a large module takes most of a second, so
// every Host of a test binary shares the result.
var (
	cacheMu   sync.Mutex
	memCache  wazero.CompilationCache
	dirCaches = map[string]wazero.CompilationCache{}
)

func compilationCache(dir string) (wazero.CompilationCache, error) {
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if dir == "" {
		if memCache == nil {
			memCache = wazero.NewCompilationCache()
		}
		return memCache, nil
	}
	if c, ok := dirCaches[dir]; ok {
		return c, nil
	}
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		return nil, fmt.Errorf("compilation cache in %q: %w", dir, err)
	}
	dirCaches[dir] = c
	return c, nil
}

// New compiles the module, validates the plugin configuration in a throw-away canary
// VM (as Envoy does before accepting a configuration), then starts cfg.Workers VMs:
// _initialize, proxy_on_context_create(root, 0), proxy_on_vm_start,
// proxy_on_configure. A refused configuration fails New with the plugin's log lines.
func New(cfg Config) (*Host, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = 5 * time.Minute
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = 15 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 2 * time.Second
	}
	wasm := cfg.Wasm
	if len(wasm) == 0 {
		if cfg.WasmPath == "" {
			return nil, errors.New("host: no module: set Config.Wasm or Config.WasmPath")
		}
		b, err := os.ReadFile(cfg.WasmPath)
		if err != nil {
			return nil, fmt.Errorf("host: read module: %w", err)
		}
		wasm = b
	}
	h := &Host{
		cfg:      cfg,
		shared:   cfg.SharedData,
		metrics:  newMetricRegistry(),
		logs:     newLogRing(cfg.LogRingSize),
		clusters: make(map[string]*cluster, len(cfg.Clusters)),
	}
	if h.shared == nil {
		h.shared = shareddata.New()
	}
	tagSpec := cfg.StatsTags
	if tagSpec == nil {
		tagSpec = DefaultStatsTags
	}
	tags, err := compileTags(tagSpec)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h.registry = prometheus.NewRegistry()
	h.registry.MustRegister(&collector{tags: tags, stats: func() []Metric {
		h.flushGuests()
		return append(h.metrics.snapshot(), h.hostMetrics()...)
	}})
	for name, eps := range cfg.Clusters {
		if len(eps) == 0 {
			return nil, fmt.Errorf("host: cluster %q has no endpoints", name)
		}
		h.clusters[name] = &cluster{name: name, endpoints: append([]string(nil), eps...), next: make([]atomic.Uint64, cfg.Workers)}
	}
	h.client = &http.Client{Transport: &http.Transport{
		Proxy:               nil, // callouts go to the cluster, never through an environment proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
	}}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.streamCtx, h.streamCancel = context.WithCancel(context.Background())

	cache, err := compilationCache(cfg.CompilationCacheDir)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	h.rt = wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(cache))
	if err := h.instantiateWASI(ctx); err != nil {
		h.abort()
		return nil, fmt.Errorf("host: instantiate WASI: %w", err)
	}
	if err := instantiateEnv(ctx, h.rt); err != nil {
		h.abort()
		return nil, fmt.Errorf("host: %w", err)
	}
	h.compiled, err = h.rt.CompileModule(ctx, wasm)
	if err != nil {
		h.abort()
		return nil, fmt.Errorf("host: compile module: %w", err)
	}
	if err := checkWASIImports(cfg.WASI, h.compiled); err != nil {
		h.abort()
		return nil, fmt.Errorf("host: load module: %w", err)
	}
	if err := checkExports(h.compiled); err != nil {
		h.abort()
		return nil, fmt.Errorf("host: %w", err)
	}
	if err := h.canary(cfg.PluginConfig); err != nil {
		h.abort()
		return nil, fmt.Errorf("host: %w", err)
	}
	for i := 0; i < cfg.Workers; i++ {
		v, err := h.instantiate(i)
		if err == nil {
			v.mu.Lock()
			v.root, err = v.newRoot(cfg.PluginConfig)
			v.mu.Unlock()
		}
		if err != nil {
			h.abort()
			return nil, fmt.Errorf("host: start worker %d: %w", i, err)
		}
		h.vms = append(h.vms, v)
	}
	for _, v := range h.vms {
		h.bg.Add(1)
		go v.tickLoop()
	}
	return h, nil
}

// checkExports refuses modules Envoy refuses: no ABI version marker, or no allocator
// for data the host returns.
func checkExports(cm wazero.CompiledModule) error {
	exp := cm.ExportedFunctions()
	if _, ok := exp["proxy_abi_version_0_2_1"]; !ok {
		if _, ok := exp["proxy_abi_version_0_2_0"]; !ok {
			return errors.New("module exports neither proxy_abi_version_0_2_1 nor proxy_abi_version_0_2_0")
		}
	}
	_, alloc := exp["proxy_on_memory_allocate"]
	_, malloc := exp["malloc"]
	if !alloc && !malloc {
		return errors.New("module exports neither proxy_on_memory_allocate nor malloc")
	}
	return nil
}

// abort releases what New built before failing.
func (h *Host) abort() {
	h.cancel()
	h.streamCancel()
	h.bg.Wait()
	if h.rt != nil {
		_ = h.rt.Close(context.Background())
	}
}

// instantiate creates one module instance and runs its start-up function.
func (h *Host) instantiate(index int) (*vm, error) {
	v := &vm{
		host:     h,
		index:    index,
		contexts: make(map[uint32]*pctx),
		nextID:   1,
		metrics:  newVMMetrics(),
		tick:     tickState{wake: make(chan struct{}, 1)},
	}
	if h.cfg.CountHostCalls {
		v.calls = make(map[string]int64)
	}
	v.ctx = context.WithValue(context.Background(), vmKey{}, v)
	name := fmt.Sprintf("worker-%d", index)
	if index < 0 {
		name = fmt.Sprintf("canary-%d", h.canaries.Add(1))
	}
	mc := wazero.NewModuleConfig().
		WithName(name).
		WithStartFunctions().
		WithStdout(stdWriter{vm: v, level: LogInfo}).
		WithStderr(stdWriter{vm: v, level: LogError}).
		WithSysNanosleep().
		WithRandSource(rand.Reader)
	if h.cfg.Clock != nil {
		mc = mc.WithWalltime(func() (int64, int32) {
			t := h.cfg.Clock()
			return t.Unix(), int32(t.Nanosecond())
		}, sys.ClockResolution(1)).WithNanotime(h.monotonic, sys.ClockResolution(1))
	} else {
		mc = mc.WithSysWalltime().WithSysNanotime()
	}
	mod, err := h.rt.InstantiateModule(v.ctx, h.compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w", err)
	}
	v.mod = mod
	v.fns = guestFns{
		malloc:           mod.ExportedFunction("proxy_on_memory_allocate"),
		onContextCreate:  mod.ExportedFunction("proxy_on_context_create"),
		onVMStart:        mod.ExportedFunction("proxy_on_vm_start"),
		onConfigure:      mod.ExportedFunction("proxy_on_configure"),
		onTick:           mod.ExportedFunction("proxy_on_tick"),
		onRequestHeaders: mod.ExportedFunction("proxy_on_request_headers"),
		onRequestBody:    mod.ExportedFunction("proxy_on_request_body"),
		onResponseHead:   mod.ExportedFunction("proxy_on_response_headers"),
		onResponseBody:   mod.ExportedFunction("proxy_on_response_body"),
		onHTTPCallResp:   mod.ExportedFunction("proxy_on_http_call_response"),
		onLog:            mod.ExportedFunction("proxy_on_log"),
		onDone:           mod.ExportedFunction("proxy_on_done"),
		onDelete:         mod.ExportedFunction("proxy_on_delete"),
		onQueueReady:     mod.ExportedFunction("proxy_on_queue_ready"),
		flushMetrics:     mod.ExportedFunction("tollgate_flush_metrics"),
	}
	if v.fns.malloc == nil {
		v.fns.malloc = mod.ExportedFunction("malloc")
	}
	// The spec's start-up order: _initialize (then main, if exported), else _start.
	// Host calls made here act on a context with id 0, Envoy's VM context.
	v.mu.Lock()
	defer v.mu.Unlock()
	vmCtx := &pctx{id: 0}
	var start []string
	if mod.ExportedFunction("_initialize") != nil {
		start = append(start, "_initialize")
		if fn := mod.ExportedFunction("main"); fn != nil && len(fn.Definition().ParamTypes()) == 2 {
			start = append(start, "main")
		}
	} else if mod.ExportedFunction("_start") != nil {
		start = append(start, "_start")
	}
	v.starting = true
	defer func() { v.starting = false }()
	for _, name := range start {
		fn := mod.ExportedFunction(name)
		args := make([]uint64, len(fn.Definition().ParamTypes()))
		if _, err := v.call(vmCtx, fn, args...); err != nil {
			_ = mod.Close(context.Background())
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return v, nil
}

// now is the time the module sees.
func (c *Config) bodyChunk() int {
	if c.BodyChunkBytes > 0 {
		return c.BodyChunkBytes
	}
	return 16 << 10
}

func (h *Host) now() time.Time {
	if h.cfg.Clock != nil {
		return h.cfg.Clock()
	}
	return time.Now()
}

// monotonic derives the module's monotonic clock from Config.Clock, never going back.
func (h *Host) monotonic() int64 {
	t := h.cfg.Clock()
	h.monoMu.Lock()
	defer h.monoMu.Unlock()
	if h.monoBase.IsZero() {
		h.monoBase = t
	}
	// Start one second in: Go's runtime refuses a monotonic clock that reads 0.
	n := t.Sub(h.monoBase).Nanoseconds() + int64(time.Second)
	if n < h.monoLast {
		n = h.monoLast
	}
	h.monoLast = n
	return n
}

// canary starts a throw-away VM with pluginConfig and reports whether the plugin
// accepts it: Envoy validates every configuration this way before any worker sees it.
// The canary shares the store, metrics and log with the workers (so did Envoy's), but
// gets no ticks and its callouts are never sent.
func (h *Host) canary(pluginConfig []byte) error {
	v, err := h.instantiate(-1)
	if err != nil {
		return fmt.Errorf("configuration canary: %w", err)
	}
	defer v.mod.Close(context.Background())
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, err := v.newRoot(pluginConfig); err != nil {
		return fmt.Errorf("configuration canary: %w", err)
	}
	return nil
}

// Reconfigure applies a new plugin configuration, as Envoy applies an updated filter
// configuration: the configuration is validated in a canary VM first (a refusal
// returns an error and changes nothing); then every worker VM gets a new root context
// (proxy_on_context_create, proxy_on_vm_start, proxy_on_configure with the new
// configuration) that serves new requests, while the old root context finishes:
// once its in-flight requests are done it gets proxy_on_done (and, if that returns
// false, time until proxy_done) and proxy_on_delete.
func (h *Host) Reconfigure(pluginConfig []byte) error {
	h.reconfMu.Lock()
	defer h.reconfMu.Unlock()
	if h.closing.Load() {
		return errors.New("host: reconfigure: host is closed")
	}
	if err := h.canary(pluginConfig); err != nil {
		return fmt.Errorf("host: reconfigure: %w", err)
	}
	var errs []error
	for _, v := range h.vms {
		v.mu.Lock()
		if v.failed != nil {
			v.mu.Unlock()
			errs = append(errs, fmt.Errorf("worker %d: %w", v.index, v.failed))
			continue
		}
		root, err := v.newRoot(pluginConfig)
		if err != nil {
			v.mu.Unlock()
			errs = append(errs, err)
			continue
		}
		old := v.root
		v.root = root
		old.retired = true
		if v.tick.root == old {
			old.tickPeriod = 0
			if root.tickPeriod == 0 {
				v.tick.root, v.tick.period = root, 0
				signal(v.tick.wake)
			}
		}
		if old.streams > 0 {
			old.drained = make(chan struct{})
		}
		drained := old.drained
		v.mu.Unlock()
		h.bg.Add(1)
		go h.retire(v, old, drained)
	}
	h.stats.reconfigures.Add(1)
	if len(errs) > 0 {
		return fmt.Errorf("host: reconfigure: %w", errors.Join(errs...))
	}
	return nil
}

// retire finishes a replaced root context once its streams are done.
func (h *Host) retire(v *vm, old *pctx, drained chan struct{}) {
	defer h.bg.Done()
	if drained != nil {
		select {
		case <-drained:
		case <-time.After(h.cfg.StreamIdleTimeout):
		case <-h.ctx.Done():
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.finishRoot(old, h.cfg.DrainTimeout)
}

// Close shuts the gateway down the way Envoy drains: new requests are refused,
// in-flight ones get DrainTimeout to finish and are then reset; each root context gets
// proxy_on_done (and, if it returned false, up to DrainTimeout to call proxy_done, with
// ticks and callouts still running) and proxy_on_delete; then ticks and callouts stop
// and the runtime is closed.
func (h *Host) Close() error {
	h.closeOnce.Do(func() {
		h.closing.Store(true)
		h.reconfMu.Lock()
		defer h.reconfMu.Unlock()
		h.inflight.wait(h.cfg.DrainTimeout)
		h.streamCancel()
		h.inflight.wait(-1)
		var wg sync.WaitGroup
		for _, v := range h.vms {
			wg.Add(1)
			go func(v *vm) {
				defer wg.Done()
				v.mu.Lock()
				defer v.mu.Unlock()
				if v.failed == nil {
					v.finishRoot(v.root, h.cfg.DrainTimeout)
				}
			}(v)
		}
		wg.Wait()
		h.cancel()
		h.bg.Wait()
		h.client.CloseIdleConnections()
		h.closeErr = h.rt.Close(context.Background())
	})
	return h.closeErr
}

// inflight counts requests in progress so Close can wait for them; unlike a
// WaitGroup it may be incremented while someone waits.
type inflight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func (f *inflight) add() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inflight) done() {
	f.mu.Lock()
	f.n--
	if f.n == 0 && f.zero != nil {
		close(f.zero)
		f.zero = nil
	}
	f.mu.Unlock()
}

// wait blocks until no request is in progress, or d has passed (d < 0: no limit).
func (f *inflight) wait(d time.Duration) {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return
	}
	if f.zero == nil {
		f.zero = make(chan struct{})
	}
	z := f.zero
	f.mu.Unlock()
	if d < 0 {
		<-z
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-z:
	case <-t.C:
	}
}

// Workers reports the number of worker VMs.
func (h *Host) Workers() int { return len(h.vms) }

// PickWorker maps a key (e.g. the downstream connection's address) to a worker, the way
// a connection stays on one Envoy worker for its lifetime.
func (h *Host) PickWorker(key string) int {
	f := fnv.New32a()
	_, _ = io.WriteString(f, key)
	return int(f.Sum32() % uint32(len(h.vms)))
}

// Handle runs req through the filter on the next worker (round robin) and the
// configured Upstream.
func (h *Host) Handle(req *Request) *Response {
	w := int((h.rr.Add(1) - 1) % uint64(len(h.vms)))
	return h.Serve(context.Background(), w, req)
}

// HandleOn is Handle on a chosen worker.
func (h *Host) HandleOn(worker int, req *Request) *Response {
	return h.Serve(context.Background(), worker, req)
}

// Serve runs req through the filter on worker and the configured Upstream. ctx is the
// downstream request's context: if it ends while the filter holds the request, the
// stream is reset. A paused request waits for proxy_continue_stream or a local reply
// (typically from proxy_on_http_call_response) up to Config.StreamIdleTimeout.
func (h *Host) Serve(ctx context.Context, worker int, req *Request) *Response {
	if worker < 0 || worker >= len(h.vms) {
		return &Response{Status: 500, Local: true, Details: fmt.Sprintf("no worker %d", worker)}
	}
	h.inflight.add()
	defer h.inflight.done()
	if h.closing.Load() {
		return &Response{Status: 503, Local: true, Details: "host_closed", Worker: worker}
	}
	// The request also ends when Close gives up waiting for it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(h.streamCtx, cancel)
	defer stop()
	resp, _ := h.vms[worker].serve(ctx, req, h.cfg.Upstream, true)
	return resp
}

// Exchange runs one request through the filter callbacks on worker synchronously,
// with upstream as the upstream's answer: proxy_on_context_create,
// proxy_on_request_headers, proxy_on_response_headers (and body callbacks when there
// are bodies), proxy_on_log, proxy_on_done, proxy_on_delete. No goroutine, timer or
// HTTP is involved, so it measures the filter and the ABI alone. A filter that pauses
// the stream gets it reset and Exchange returns an error.
func (h *Host) Exchange(worker int, req *Request, upstream *Response) (*Response, error) {
	if worker < 0 || worker >= len(h.vms) {
		return nil, fmt.Errorf("host: no worker %d", worker)
	}
	h.inflight.add()
	defer h.inflight.done()
	if h.closing.Load() {
		return nil, errors.New("host: closed")
	}
	up := func(context.Context, *Request) (*Response, error) {
		r := *upstream
		return &r, nil
	}
	resp, err := h.vms[worker].serve(context.Background(), req, up, false)
	if err != nil {
		return resp, fmt.Errorf("host: exchange on worker %d: %w", worker, err)
	}
	return resp, nil
}

// ExchangeWait is Exchange for a filter that may pause a request (a strict rule, or an
// acquire when a bucket's lease is short): it waits for the filter to continue or answer
// it, as Serve does, with the static upstream answer.
func (h *Host) ExchangeWait(ctx context.Context, worker int, req *Request, upstream *Response) (*Response, error) {
	if worker < 0 || worker >= len(h.vms) {
		return nil, fmt.Errorf("host: no worker %d", worker)
	}
	h.inflight.add()
	defer h.inflight.done()
	if h.closing.Load() {
		return nil, errors.New("host: closed")
	}
	up := func(context.Context, *Request) (*Response, error) {
		r := *upstream
		return &r, nil
	}
	resp, err := h.vms[worker].serve(ctx, req, up, true)
	if err != nil {
		return resp, fmt.Errorf("host: exchange on worker %d: %w", worker, err)
	}
	return resp, nil
}

// CallOnVM runs f with worker i's VM locked, for benchmarks and tests that call the
// module's exports directly. ctx must be passed to those calls: host functions find
// their VM through it, and they act on the worker's root context.
func (h *Host) CallOnVM(i int, f func(ctx context.Context, mod api.Module)) {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	prev := v.cur
	v.cur = v.root
	f(v.ctx, v.mod)
	v.cur = prev
}

// HostCalls sums, over the workers, the host function calls by name and the
// allocations the host asked the module for ("proxy_on_memory_allocate"), when
// Config.CountHostCalls is set; otherwise it is empty.
func (h *Host) HostCalls() map[string]int64 {
	out := make(map[string]int64)
	for _, v := range h.vms {
		v.mu.Lock()
		for name, n := range v.calls {
			out[name] += n
		}
		v.mu.Unlock()
	}
	return out
}

// RootContextID reports the id of worker i's active root context (1 until the first
// Reconfigure).
func (h *Host) RootContextID(i int) uint32 {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.root.id
}

// TickPeriod reports worker i's current tick period.
func (h *Host) TickPeriod(i int) time.Duration {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.tick.period
}

// Failed reports why worker i's VM failed, or nil.
func (h *Host) Failed(i int) error {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.failed
}

// SharedData returns the store behind proxy_get_shared_data / proxy_set_shared_data.
func (h *Host) SharedData() *shareddata.Store { return h.shared }

// SharedDataKeys reports how many keys the shared store holds.
func (h *Host) SharedDataKeys() int { return h.shared.Keys() }

// SharedDataBytes reports the key and value bytes the shared store holds.
func (h *Host) SharedDataBytes() int { return h.shared.Bytes() }

// MetricSnapshot returns every plugin-defined metric, sorted by name.
func (h *Host) MetricSnapshot() []Metric {
	h.flushGuests()
	return h.metrics.snapshot()
}

// flushGuests asks every worker's module that keeps counts between ticks to hand them
// over (tollgate_flush_metrics), so that a read of the metrics sees every callback that
// has returned: Envoy's stats would see them at the filter's next tick.
func (h *Host) flushGuests() {
	for _, v := range h.vms {
		if v.fns.flushMetrics == nil {
			continue
		}
		v.mu.Lock()
		if v.root != nil {
			_, _ = v.call(v.root, v.fns.flushMetrics)
		}
		v.mu.Unlock()
	}
}

// Metrics returns plugin metrics by name: counter and gauge values, and the last
// recorded value of histograms.
func (h *Host) Metrics() map[string]int64 {
	h.flushGuests()
	out := make(map[string]int64)
	for _, m := range h.metrics.snapshot() {
		out[m.Name] = m.Value
	}
	return out
}

// Stats is the host's own counters, exported next to the plugin's metrics with the
// prefix wasmhost_.
type Stats struct {
	Workers         int   `json:"workers"`
	Requests        int64 `json:"requests"`
	LocalReplies    int64 `json:"local_replies"`
	Paused          int64 `json:"paused"`
	PauseTimeouts   int64 `json:"pause_timeouts"`
	UpstreamErrors  int64 `json:"upstream_errors"`
	Callouts        int64 `json:"callouts"`
	CalloutFailures int64 `json:"callout_failures"`
	Ticks           int64 `json:"ticks"`
	VMFailures      int64 `json:"vm_failures"`
	Reconfigures    int64 `json:"reconfigures"`
	SharedDataKeys  int   `json:"shared_data_keys"`
	SharedDataBytes int   `json:"shared_data_bytes"`
	LogLines        int64 `json:"log_lines"`
	// PollOneoff counts poll_oneoff calls that reached the host (counted under
	// WASIEnvoy133, which answers them with ENOSYS); StartupRefused counts WASI calls
	// refused during _initialize (WASIEnvoy133, WASILegacy).
	PollOneoff     int64 `json:"poll_oneoff"`
	StartupRefused int64 `json:"startup_refused"`
}

// Stats returns the host's counters.
func (h *Host) Stats() Stats {
	return Stats{
		Workers:         len(h.vms),
		Requests:        h.stats.requests.Load(),
		LocalReplies:    h.stats.localReplies.Load(),
		Paused:          h.stats.paused.Load(),
		PauseTimeouts:   h.stats.pauseTimeouts.Load(),
		UpstreamErrors:  h.stats.upstreamErrors.Load(),
		Callouts:        h.stats.callouts.Load(),
		CalloutFailures: h.stats.calloutFailures.Load(),
		Ticks:           h.stats.ticks.Load(),
		VMFailures:      h.stats.vmFailures.Load(),
		Reconfigures:    h.stats.reconfigures.Load(),
		SharedDataKeys:  h.shared.Keys(),
		SharedDataBytes: h.shared.Bytes(),
		LogLines:        int64(h.logs.mark()),
		PollOneoff:      h.stats.pollOneoff.Load(),
		StartupRefused:  h.stats.startupRefused.Load(),
	}
}

// WritePrometheus writes the plugin's metrics and the host's own counters (wasmhost_*)
// in the Prometheus text format, as Envoy's /stats/prometheus does (see Gatherer).
func (h *Host) WritePrometheus(w io.Writer) error { return writePrometheus(w, h.registry) }

// Gatherer serves the plugin's metrics as Envoy's /stats/prometheus would: names with
// the stats tags cut out and sanitised (PrometheusName), the tags as labels, counters,
// gauges and histograms (on Envoy's default buckets) as such; and the host's own
// counters, wasmhost_*.
func (h *Host) Gatherer() prometheus.Gatherer { return h.registry }

// hostMetrics are the host's own counters as metrics.
func (h *Host) hostMetrics() []Metric {
	s := h.Stats()
	return []Metric{
		{Type: MetricCounter, Name: "wasmhost_requests_total", Value: s.Requests},
		{Type: MetricCounter, Name: "wasmhost_local_replies_total", Value: s.LocalReplies},
		{Type: MetricCounter, Name: "wasmhost_paused_total", Value: s.Paused},
		{Type: MetricCounter, Name: "wasmhost_pause_timeouts_total", Value: s.PauseTimeouts},
		{Type: MetricCounter, Name: "wasmhost_upstream_errors_total", Value: s.UpstreamErrors},
		{Type: MetricCounter, Name: "wasmhost_callouts_total", Value: s.Callouts},
		{Type: MetricCounter, Name: "wasmhost_callout_failures_total", Value: s.CalloutFailures},
		{Type: MetricCounter, Name: "wasmhost_ticks_total", Value: s.Ticks},
		{Type: MetricCounter, Name: "wasmhost_vm_failures_total", Value: s.VMFailures},
		{Type: MetricCounter, Name: "wasmhost_reconfigures_total", Value: s.Reconfigures},
		{Type: MetricGauge, Name: "wasmhost_workers", Value: int64(s.Workers)},
		{Type: MetricGauge, Name: "wasmhost_shared_data_keys", Value: int64(s.SharedDataKeys)},
		{Type: MetricGauge, Name: "wasmhost_shared_data_bytes", Value: int64(s.SharedDataBytes)},
	}
}

// Logs returns the most recent plugin log lines, oldest first.
func (h *Host) Logs() []LogEntry { return h.logs.entries() }

// log records one plugin log line on behalf of the context running on v. The caller
// holds v.mu.
func (h *Host) log(v *vm, level int, msg string) {
	var id uint32
	if c := v.active(); c != nil {
		id = c.id
	}
	h.logAt(v.index, id, level, msg)
}

// logAt records one log line without looking at a VM (callers that do not hold it).
func (h *Host) logAt(worker int, ctxID uint32, level int, msg string) {
	if level < h.cfg.LogLevel {
		return
	}
	h.logs.add(LogEntry{Time: time.Now(), Level: level, Worker: worker, Context: ctxID, Message: msg})
	if h.cfg.Log != nil {
		h.cfg.Log(level, msg)
	}
}

// logsOf returns worker v's log lines logged since mark.
func (h *Host) logsOf(v *vm, mark uint64) []LogEntry {
	var out []LogEntry
	for _, e := range h.logs.since(mark) {
		if e.Worker == v.index {
			out = append(out, e)
		}
	}
	return out
}
