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
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/sys"

	"github.com/tollgate-rl/tollgate/internal/shareddata"
)

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
