package abi

import "strconv"

// Action is what a stream callback tells the host to do with the stream
// (proxy_action_t).
type Action uint32

const (
	// Continue lets the host forward the headers or data.
	Continue Action = 0
	// Pause holds the stream until Host.ResumeHTTPRequest (or a local reply).
	Pause Action = 1
)

// LogLevel is proxy_log_level_t.
type LogLevel uint32

const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
)

// MetricType is proxy_metric_type_t.
type MetricType uint32

const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// MapType is proxy_map_type_t: which header map a header call reads or changes.
type MapType uint32

const (
	MapRequestHeaders       MapType = 0
	MapRequestTrailers      MapType = 1
	MapResponseHeaders      MapType = 2
	MapResponseTrailers     MapType = 3
	MapCallResponseHeaders  MapType = 6
	MapCallResponseTrailers MapType = 7
)

// BufferType is proxy_buffer_type_t.
type BufferType uint32

const (
	BufferRequestBody      BufferType = 0
	BufferResponseBody     BufferType = 1
	BufferCallResponseBody BufferType = 4
	BufferVMConfig         BufferType = 6
	BufferPluginConfig     BufferType = 7
)

// streamType is proxy_stream_type_t.
type streamType uint32

const (
	streamRequest  streamType = 0
	streamResponse streamType = 1
)

// Status codes (proxy_status_t).
const (
	statusOK                  = 0
	statusNotFound            = 1
	statusBadArgument         = 2
	statusSerializationFailed = 3
	statusParseFailure        = 4
	statusInvalidMemAccess    = 6
	statusEmpty               = 7
	statusCasMismatch         = 8
	statusInternalFailure     = 10
	statusUnimplemented       = 12
)

// StatusError is a non-OK proxy_status_t returned by a host call. The exported
// sentinels below are StatusError values, so errors.Is works on them and on the
// CallError that wraps them.
type StatusError uint32

// Error implements error.
func (s StatusError) Error() string {
	switch s {
	case statusNotFound:
		return "proxy-wasm: not found"
	case statusBadArgument:
		return "proxy-wasm: bad argument"
	case statusSerializationFailed:
		return "proxy-wasm: serialization failure"
	case statusParseFailure:
		return "proxy-wasm: parse failure"
	case statusInvalidMemAccess:
		return "proxy-wasm: invalid memory access"
	case statusEmpty:
		return "proxy-wasm: empty"
	case statusCasMismatch:
		return "proxy-wasm: cas mismatch"
	case statusInternalFailure:
		return "proxy-wasm: internal failure"
	case statusUnimplemented:
		return "proxy-wasm: unimplemented"
	}
	return "proxy-wasm: status " + strconv.FormatUint(uint64(s), 10)
}

// Sentinel errors, one per proxy_status_t the host may return.
var (
	ErrNotFound            error = StatusError(statusNotFound)
	ErrBadArgument         error = StatusError(statusBadArgument)
	ErrSerializationFailed error = StatusError(statusSerializationFailed)
	ErrParseFailure        error = StatusError(statusParseFailure)
	ErrInvalidMemoryAccess error = StatusError(statusInvalidMemAccess)
	ErrEmpty               error = StatusError(statusEmpty)
	ErrCasMismatch         error = StatusError(statusCasMismatch)
	ErrInternal            error = StatusError(statusInternalFailure)
	ErrUnimplemented       error = StatusError(statusUnimplemented)
)

// CallError says which host call failed. Outcomes that are part of normal control flow
// (ErrNotFound, ErrCasMismatch, ErrEmpty) are returned bare instead, so the hot path
// allocates nothing for them; everything else is wrapped in a CallError.
type CallError struct {
	Func string // host function, e.g. "proxy_http_call"
	Arg  string // the key, cluster or header name involved, if any
	Err  error
}

// Error implements error.
func (e *CallError) Error() string {
	if e.Arg == "" {
		return e.Func + ": " + e.Err.Error()
	}
	return e.Func + " " + strconv.Quote(e.Arg) + ": " + e.Err.Error()
}

// Unwrap returns the status error.
func (e *CallError) Unwrap() error { return e.Err }

// statusErr maps a host status to an error; see CallError for what is wrapped.
func statusErr(status uint32, fn, arg string) error {
	switch status {
	case statusOK:
		return nil
	case statusNotFound:
		return ErrNotFound
	case statusCasMismatch:
		return ErrCasMismatch
	case statusEmpty:
		return ErrEmpty
	}
	return &CallError{Func: fn, Arg: arg, Err: StatusError(status)}
}
