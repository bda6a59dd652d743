// Package plugin is Tollgate's filter logic: key extraction, rule matching, local
// decisions on buckets in Envoy shared data, the 100 ms sync with the service, the circuit
// breaker and the answers. It knows nothing of the proxy-wasm ABI: it talks to the host
// through the small interfaces below, which filter/main.go implements with filter/abi, so
// the same code runs against Envoy, the SDK's emulator and our own wazero host.
package plugin

// Host is everything the plugin asks of the proxy. Context switches (which stream a call
// applies to) are the binding's business: calls made inside a stream callback apply to
// that stream.
type Host interface {
	// RequestHeaders returns all request headers in one host call. They stay valid
	// while the callback runs (the binding reuses their memory for the next request).
	RequestHeaders() ([][2]string, error)
	// AddResponseHeaders, SendLocalReply, SharedSet and HTTPCall copy what they are
	// given before they return, as proxies do: the plugin reuses its buffers.
	// AddResponseHeaders adds the pairs in order and stops at the first failure.
	AddResponseHeaders(pairs [][2]string) error
	// SendLocalReply's grpcStatus is the gRPC status of a gRPC request's answer (-1:
	// none): the proxy then answers trailers-only (HTTP 200, grpc-status, grpc-message
	// from body), as Envoy's local replies to gRPC requests do.
	SendLocalReply(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error
	// SharedGet returns the value and its CAS token; found is false for a missing key.
	// The value is valid until the next SharedGet (the binding reuses one buffer).
	SharedGet(key string) (value []byte, cas uint32, found bool, err error)
	// SharedSet stores value if cas still matches (0: unconditionally); ok is false on a
	// CAS mismatch.
	SharedSet(key string, value []byte, cas uint32) (ok bool, err error)
	Property(path ...string) ([]byte, error)
	// SetProperty sets a one-segment property of the current stream (Envoy: the filter
	// state "wasm.<path>"); the host copies value.
	SetProperty(path string, value []byte) error
	// AppendProperty appends a property's value to dst (the request path's reads: a
	// reused dst makes them allocation-free).
	AppendProperty(dst []byte, path ...string) ([]byte, error)
	SetTickPeriod(ms uint32) error
	// HTTPCall dispatches a callout; the answer arrives through Root.OnHTTPCallResponse
	// (or Stream.OnHTTPCallResponse when dispatched from a stream).
	HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (token uint32, err error)
	// ResponseHeader returns the first value of a response header of the current
	// stream (in its response headers callback).
	ResponseHeader(name string) (value string, found bool)
	// ResponseBody reads up to max bytes of the current response body chunk from start
	// (in its response body callback); the bytes are valid until the next call. It may
	// return fewer than asked (the host's read limit): call again from where it ended.
	ResponseBody(start, max int) ([]byte, error)
	// ResumeRequest continues the paused request of the current stream.
	ResumeRequest() error
	// SetEffectiveContext makes later calls apply to context id (a stream, or RootID()).
	SetEffectiveContext(id uint32) error
	// RootID is the plugin (root) context id.
	RootID() uint32
	Log(level LogLevel, msg string)
	DefineMetric(kind MetricKind, name string) (uint32, error)
	IncrementMetric(id uint32, delta int64)
	RecordMetric(id uint32, value uint64)
	// NowUs is the proxy's wall clock in microseconds.
	NowUs() int64
	// Seed is a random number for this worker (its id and the Retry-After jitter): from
	// the host, not the clock, so that workers started together differ and a simulation
	// can replay them.
	Seed() uint64
}

// LogLevel mirrors proxy-wasm log levels.
type LogLevel uint32

const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// MetricKind mirrors proxy-wasm metric types.
type MetricKind uint32

const (
	Counter MetricKind = iota
	Gauge
	Histogram
)
