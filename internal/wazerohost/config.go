package wazerohost

import (
	"time"

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

// bodyChunk is Config.BodyChunkBytes, or its default.
func (c *Config) bodyChunk() int {
	if c.BodyChunkBytes > 0 {
		return c.BodyChunkBytes
	}
	return 16 << 10
}
