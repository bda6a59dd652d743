package wazerohost

import (
	"encoding/binary"
	"strings"
)

// Status is a proxy_status_t value returned by every host function.
type Status uint32

// Status values of proxy-wasm ABI v0.2.1 (and proxy-wasm-cpp-host's WasmResult, which
// adds ResultMismatch and BrokenConnection).
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCasMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusBrokenConnection     Status = 11
	StatusUnimplemented        Status = 12
)

// Log levels (proxy_log_level_t).
const (
	LogTrace    = 0
	LogDebug    = 1
	LogInfo     = 2
	LogWarn     = 3
	LogError    = 4
	LogCritical = 5
)

// LevelName returns the lower-case name of a proxy_log_level_t value.
func LevelName(level int) string {
	switch level {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	case LogCritical:
		return "critical"
	}
	return "unknown"
}

// Map types (proxy_map_type_t).
const (
	mapRequestHeaders           = 0
	mapRequestTrailers          = 1
	mapResponseHeaders          = 2
	mapResponseTrailers         = 3
	mapGrpcInitialMetadata      = 4
	mapGrpcTrailingMetadata     = 5
	mapHTTPCallResponseHeaders  = 6
	mapHTTPCallResponseTrailers = 7
	mapMax                      = 7
)

// Buffer types (proxy_buffer_type_t).
const (
	bufRequestBody          = 0
	bufResponseBody         = 1
	bufDownstreamData       = 2
	bufUpstreamData         = 3
	bufHTTPCallResponseBody = 4
	bufGrpcMessage          = 5
	bufVMConfiguration      = 6
	bufPluginConfiguration  = 7
	bufForeignArguments     = 8
	bufMax                  = 8
)

// Stream types (proxy_stream_type_t).
const (
	streamRequest    = 0
	streamResponse   = 1
	streamDownstream = 2
	streamUpstream   = 3
)

// Metric types (proxy_metric_type_t). Envoy keeps the type in the two low bits of a
// metric id and hands ids out in steps of four, per VM.
const (
	MetricCounter   = 0
	MetricGauge     = 1
	MetricHistogram = 2

	metricTypeMask = 0x3
	metricIDStep   = 0x4
)

// Actions returned by proxy_on_request_headers and friends (proxy_action_t). Envoy reads
// any non-zero value as "stop".
const actionContinue = 0

// Pair is one header (or metadata) entry. Names inside the host are lower case, as in
// Envoy's header maps.
type Pair = [2]string

// encodePairs serialises pairs in the proxy-wasm map format: a little-endian u32 count,
// count pairs of u32 (key length, value length), then each key and value followed by a
// NUL byte. It appends to dst and returns the extended slice.
func encodePairs(dst []byte, pairs []Pair) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + 1 + len(p[1]) + 1
	}
	start := len(dst)
	if cap(dst)-start < size {
		grown := make([]byte, start, start+size)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:start+size]
	b := dst[start:]
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	off := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(b[off:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(b[off+4:], uint32(len(p[1])))
		off += 8
	}
	for _, p := range pairs {
		off += copy(b[off:], p[0])
		b[off] = 0
		off++
		off += copy(b[off:], p[1])
		b[off] = 0
		off++
	}
	return dst
}

// EncodePairs serialises pairs in the proxy-wasm map format (for tests and tools that
// talk to a module directly).
func EncodePairs(pairs []Pair) []byte { return encodePairs(nil, pairs) }

// DecodePairs parses the proxy-wasm map format. Like proxy-wasm-cpp-host's toPairs, a
// buffer shorter than its header yields no pairs; unlike it, lengths that point past the
// end of the buffer are an error instead of an out-of-bounds read.
func DecodePairs(b []byte) ([]Pair, bool) {
	if len(b) < 4 {
		// Envoy: an empty map may be sent as size 0 or as a single 0x00 byte.
		return nil, true
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(4)+uint64(n)*8 > uint64(len(b)) {
		return nil, false
	}
	pairs := make([]Pair, n)
	sizes := b[4:]
	data := 4 + int(n)*8
	for i := range pairs {
		ks := int(binary.LittleEndian.Uint32(sizes[i*8:]))
		vs := int(binary.LittleEndian.Uint32(sizes[i*8+4:]))
		if ks < 0 || vs < 0 || data+ks+1+vs+1 > len(b) || data+ks+1+vs+1 < data {
			return nil, false
		}
		pairs[i][0] = string(b[data : data+ks])
		data += ks + 1
		pairs[i][1] = string(b[data : data+vs])
		data += vs + 1
	}
	return pairs, true
}

// headerMap is an ordered multimap with lower-case keys, Envoy's HeaderMap in miniature.
type headerMap struct {
	pairs []Pair
}

func newHeaderMap(pairs []Pair) *headerMap {
	m := &headerMap{pairs: make([]Pair, 0, len(pairs)+4)}
	for _, p := range pairs {
		m.pairs = append(m.pairs, Pair{strings.ToLower(p[0]), p[1]})
	}
	return m
}

func (m *headerMap) get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, p := range m.pairs {
		if p[0] == key {
			return p[1], true
		}
	}
	return "", false
}

func (m *headerMap) add(key, value string) {
	m.pairs = append(m.pairs, Pair{strings.ToLower(key), value})
}

// replace mirrors Envoy's setCopy: the first entry keeps its position, later duplicates
// go away; a missing key is appended.
func (m *headerMap) replace(key, value string) {
	key = strings.ToLower(key)
	out := m.pairs[:0]
	found := false
	for _, p := range m.pairs {
		if p[0] == key {
			if found {
				continue
			}
			found = true
			p[1] = value
		}
		out = append(out, p)
	}
	m.pairs = out
	if !found {
		m.pairs = append(m.pairs, Pair{key, value})
	}
}

func (m *headerMap) remove(key string) {
	key = strings.ToLower(key)
	out := m.pairs[:0]
	for _, p := range m.pairs {
		if p[0] != key {
			out = append(out, p)
		}
	}
	m.pairs = out
}

func (m *headerMap) set(pairs []Pair) {
	m.pairs = m.pairs[:0]
	for _, p := range pairs {
		m.pairs = append(m.pairs, Pair{strings.ToLower(p[0]), p[1]})
	}
}

// byteSize mirrors Envoy's HeaderMap::byteSize: the sum of key and value lengths.
func (m *headerMap) byteSize() int {
	n := 0
	for _, p := range m.pairs {
		n += len(p[0]) + len(p[1])
	}
	return n
}
