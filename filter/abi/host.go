package abi

import "unsafe"

// Host is the proxy as seen from the module: every method is one host call (two for
// none). It has no state, so the plugin can keep a Host{} wherever it wants one and
// declare small interfaces that Host satisfies.
//
// Calls made during a Stream callback apply to that stream; calls made during a Root
// callback apply to the root context (see SetEffectiveContext).
type Host struct{}

// encBuf is reused to serialize maps, paths and the like for host calls; the host
// copies what it needs before the call returns.
var encBuf []byte

// maxEncBuf bounds what encBuf keeps between calls, so one large local reply does not
// hold memory forever.
const maxEncBuf = 64 << 10

func releaseEncBuf() {
	if cap(encBuf) > maxEncBuf {
		encBuf = nil
	}
}

// Log writes msg to the host's log at level. Errors are ignored: there is nowhere
// else to report them.
func (Host) Log(level LogLevel, msg string) {
	proxyLog(uint32(level), strData(msg), uint32(len(msg)))
}

// RequestHeaders returns all request headers of the current stream with one
// proxy_get_header_map_pairs call. See DecodePairs for the allocation strategy: the
// strings alias the buffer the host filled; the slice is the only other allocation.
func (h Host) RequestHeaders() ([][2]string, error) {
	return getPairs(MapRequestHeaders, nil)
}

// AppendRequestHeaders is RequestHeaders appending to dst, so a caller that keeps a
// slice across requests allocates only the buffer the host fills.
func (h Host) AppendRequestHeaders(dst [][2]string) ([][2]string, error) {
	return getPairs(MapRequestHeaders, dst)
}

// ReadRequestHeaders is AppendRequestHeaders without the allocation of the buffer the
// host fills: the strings alias a buffer the binding keeps, and stay valid only until
// the next ReadRequestHeaders call. A caller that keeps a header beyond that copies it.
func (h Host) ReadRequestHeaders(dst [][2]string) ([][2]string, error) {
	pairsArmed = true
	return getPairs(MapRequestHeaders, dst)
}

// ResponseHeaders returns all response headers of the current stream.
func (h Host) ResponseHeaders() ([][2]string, error) {
	return getPairs(MapResponseHeaders, nil)
}

// HeaderPairs returns all pairs of map m, appended to dst.
func (h Host) HeaderPairs(m MapType, dst [][2]string) ([][2]string, error) {
	return getPairs(m, dst)
}

// HeaderValue returns one header of map m; ErrNotFound when absent.
func (h Host) HeaderValue(m MapType, name string) (string, error) {
	resetReturn()
	st := proxyGetHeaderMapValue(uint32(m), strData(name), uint32(len(name)), &retPtr, &retSize)
	buf, ok := takeOwned()
	if err := statusErr(st, "proxy_get_header_map_value", name); err != nil {
		return "", err
	}
	if !ok {
		return "", &CallError{Func: "proxy_get_header_map_value", Arg: name, Err: ErrInvalidMemoryAccess}
	}
	return aliasString(buf, 0, len(buf)), nil
}

// ReadBody reads up to max bytes of body buffer b from start (a response body chunk in
// proxy_on_response_body: what this call of it carries). At most 64 KiB are read per
// call; the bytes alias a buffer the next ReadBody reuses. An empty result without
// error means there is nothing at start.
func (h Host) ReadBody(b BufferType, start, max uint32) ([]byte, error) {
	return getBuffer(b, start, min(max, maxBodyRead), true)
}

// AddHeader adds name: value to map m (keeping existing values of name).
func (h Host) AddHeader(m MapType, name, value string) error {
	st := proxyAddHeaderMapValue(uint32(m), strData(name), uint32(len(name)), strData(value), uint32(len(value)))
	return statusErr(st, "proxy_add_header_map_value", name)
}

// AddHeaders adds every pair to map m, in order, with one proxy_add_header_map_value
// each (the ABI has no call that adds several); it stops at the first failure.
func (h Host) AddHeaders(m MapType, pairs [][2]string) error {
	for _, kv := range pairs {
		st := proxyAddHeaderMapValue(uint32(m), strData(kv[0]), uint32(len(kv[0])), strData(kv[1]), uint32(len(kv[1])))
		if err := statusErr(st, "proxy_add_header_map_value", kv[0]); err != nil {
			return err
		}
	}
	return nil
}

// ReplaceHeader sets name: value in map m, replacing existing values.
func (h Host) ReplaceHeader(m MapType, name, value string) error {
	st := proxyReplaceHeaderMapValue(uint32(m), strData(name), uint32(len(name)), strData(value), uint32(len(value)))
	return statusErr(st, "proxy_replace_header_map_value", name)
}

// AddResponseHeader adds a response header of the current stream.
func (h Host) AddResponseHeader(name, value string) error {
	return h.AddHeader(MapResponseHeaders, name, value)
}

// ReplaceResponseHeader sets a response header of the current stream.
func (h Host) ReplaceResponseHeader(name, value string) error {
	return h.ReplaceHeader(MapResponseHeaders, name, value)
}

// AddRequestHeader adds a request header (sent upstream) of the current stream.
func (h Host) AddRequestHeader(name, value string) error {
	return h.AddHeader(MapRequestHeaders, name, value)
}

// SendLocalReply answers the current stream without going upstream. details is the
// response code details string Envoy logs; grpcStatus is -1 for none.
func (h Host) SendLocalReply(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	defer releaseEncBuf()
	var ok bool
	encBuf, ok = AppendPairs(encBuf[:0], headers)
	if !ok || len(body) > maxPairsLen || len(details) > maxPairsLen {
		return &CallError{Func: "proxy_send_local_response", Err: ErrBadArgument}
	}
	st := proxySendLocalResponse(status, strData(details), uint32(len(details)),
		bytesData(body), uint32(len(body)), bytesData(encBuf), uint32(len(encBuf)), grpcStatus)
	return statusErr(st, "proxy_send_local_response", details)
}

// GetSharedData returns the value stored under key and its CAS token; ErrNotFound when
// the key is absent. The value is a fresh slice the caller owns.
func (h Host) GetSharedData(key string) (value []byte, cas uint32, err error) {
	resetReturn()
	st := proxyGetSharedData(strData(key), uint32(len(key)), &retPtr, &retSize, &retU32)
	cas = retU32
	buf, ok := takeOwned()
	if err := statusErr(st, "proxy_get_shared_data", key); err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, 0, &CallError{Func: "proxy_get_shared_data", Arg: key, Err: ErrInvalidMemoryAccess}
	}
	return buf, cas, nil
}

// AppendSharedData is GetSharedData appending the value to dst. Values up to 4 KiB
// pass through a reused scratch buffer, so with a dst of sufficient capacity the call
// allocates nothing.
func (h Host) AppendSharedData(dst []byte, key string) (value []byte, cas uint32, err error) {
	resetReturn()
	scratchArmed = true
	st := proxyGetSharedData(strData(key), uint32(len(key)), &retPtr, &retSize, &retU32)
	cas = retU32
	// The bytes are copied into dst right below, so they may stay in scratch.
	buf, _, ok := takeReturned()
	if err := statusErr(st, "proxy_get_shared_data", key); err != nil {
		return dst, 0, err
	}
	if !ok {
		return dst, 0, &CallError{Func: "proxy_get_shared_data", Arg: key, Err: ErrInvalidMemoryAccess}
	}
	return append(dst, buf...), cas, nil
}

// SetSharedData stores value under key. A non-zero cas must match the current token
// (else ErrCasMismatch); 0 stores unconditionally on Envoy.
func (h Host) SetSharedData(key string, value []byte, cas uint32) error {
	st := proxySetSharedData(strData(key), uint32(len(key)), bytesData(value), uint32(len(value)), cas)
	return statusErr(st, "proxy_set_shared_data", key)
}

// GetProperty reads a host property such as GetProperty("node", "id"); ErrNotFound
// when the host has none at that path.
func (h Host) GetProperty(path ...string) ([]byte, error) {
	encBuf = AppendPropertyPath(encBuf[:0], path)
	if len(encBuf) > maxPairsLen {
		releaseEncBuf()
		return nil, &CallError{Func: "proxy_get_property", Err: ErrBadArgument}
	}
	resetReturn()
	st := proxyGetProperty(bytesData(encBuf), uint32(len(encBuf)), &retPtr, &retSize)
	releaseEncBuf()
	buf, ok := takeOwned()
	if err := statusErr(st, "proxy_get_property", ""); err != nil {
		return nil, err
	}
	if !ok {
		return nil, &CallError{Func: "proxy_get_property", Err: ErrInvalidMemoryAccess}
	}
	return buf, nil
}

// SetProperty sets a property of the current stream. Envoy keeps it in the stream's
// filter state under "wasm." + path (so an access log prints it with
// %FILTER_STATE(wasm.<path>:PLAIN)%); path is one segment here, the only form the
// filter needs, so it is passed as is, without an encoding buffer. The host copies value.
func (h Host) SetProperty(path string, value []byte) error {
	st := proxySetProperty(strData(path), uint32(len(path)), bytesData(value), uint32(len(value)))
	return statusErr(st, "proxy_set_property", path)
}

// AppendProperty is GetProperty appending the value to dst: the host's copy lands in
// the binding's scratch buffer and is copied into dst, so a caller that reuses dst
// reads properties on every request without allocating.
func (h Host) AppendProperty(dst []byte, path ...string) ([]byte, error) {
	encBuf = AppendPropertyPath(encBuf[:0], path)
	if len(encBuf) > maxPairsLen {
		releaseEncBuf()
		return dst, &CallError{Func: "proxy_get_property", Err: ErrBadArgument}
	}
	resetReturn()
	scratchArmed = true
	st := proxyGetProperty(bytesData(encBuf), uint32(len(encBuf)), &retPtr, &retSize)
	releaseEncBuf()
	// The bytes are copied into dst right below, so they may stay in scratch.
	buf, _, ok := takeReturned()
	if err := statusErr(st, "proxy_get_property", ""); err != nil {
		return dst, err
	}
	if !ok {
		return dst, &CallError{Func: "proxy_get_property", Err: ErrInvalidMemoryAccess}
	}
	return append(dst, buf...), nil
}

// PluginConfig reads the plugin configuration; valid only during OnPluginStart (the
// binding already passes it there, this is for code that wants to re-read it).
func (h Host) PluginConfig() ([]byte, error) {
	return readBuffer(BufferPluginConfig, maxPairsLen)
}

// SetTickPeriod makes the host call Root.OnTick every ms milliseconds; 0 stops it.
func (h Host) SetTickPeriod(ms uint32) error {
	return statusErr(proxySetTickPeriodMilliseconds(ms), "proxy_set_tick_period_milliseconds", "")
}

// DispatchHTTPCall sends a request to an upstream cluster. headers must include
// :method, :path and :authority. The answer arrives later through
// Root.OnHTTPCallResponse, or CalloutStream.OnHTTPCallResponse when dispatched during a
// callback of a stream implementing it, with the returned token.
func (h Host) DispatchHTTPCall(cluster string, headers [][2]string, body []byte, trailers [][2]string, timeoutMs uint32) (token uint32, err error) {
	defer releaseEncBuf()
	// One buffer holds both maps; the host reads them during the call.
	var ok1, ok2 bool
	encBuf, ok1 = AppendPairs(encBuf[:0], headers)
	split := len(encBuf)
	encBuf, ok2 = AppendPairs(encBuf, trailers)
	if !ok1 || !ok2 || len(body) > maxPairsLen {
		return 0, &CallError{Func: "proxy_http_call", Arg: cluster, Err: ErrBadArgument}
	}
	hdr, trl := encBuf[:split], encBuf[split:]
	resetReturn()
	st := proxyHTTPCall(strData(cluster), uint32(len(cluster)), bytesData(hdr), uint32(len(hdr)),
		bytesData(body), uint32(len(body)), bytesData(trl), uint32(len(trl)), timeoutMs, &retU32)
	if err := statusErr(st, "proxy_http_call", cluster); err != nil {
		return 0, err
	}
	token = retU32
	if streams.get(active) != nil {
		callers[token] = active
	} else {
		// A reused token must not route a root call to a stream's handler.
		delete(callers, token)
	}
	return token, nil
}

// ResumeHTTPRequest continues the current stream's request after a callback returned
// Pause.
func (h Host) ResumeHTTPRequest() error {
	return statusErr(proxyContinueStream(uint32(streamRequest)), "proxy_continue_stream", "")
}

// ResumeHTTPResponse continues the current stream's response after a callback returned
// Pause.
func (h Host) ResumeHTTPResponse() error {
	return statusErr(proxyContinueStream(uint32(streamResponse)), "proxy_continue_stream", "")
}

// SetEffectiveContext makes later host calls of this callback apply to context id.
func (h Host) SetEffectiveContext(id uint32) error {
	return statusErr(proxySetEffectiveContext(id), "proxy_set_effective_context", "")
}

// DefineMetric defines (or finds) a metric by name and returns its id.
func (h Host) DefineMetric(kind MetricType, name string) (uint32, error) {
	resetReturn()
	st := proxyDefineMetric(uint32(kind), strData(name), uint32(len(name)), &retU32)
	if err := statusErr(st, "proxy_define_metric", name); err != nil {
		return 0, err
	}
	return retU32, nil
}

// IncrementMetric adds delta to a counter or gauge (counters reject negative deltas).
func (h Host) IncrementMetric(id uint32, delta int64) error {
	return statusErr(proxyIncrementMetric(id, delta), "proxy_increment_metric", "")
}

// RecordMetric sets a gauge or records a histogram value.
func (h Host) RecordMetric(id uint32, value uint64) error {
	return statusErr(proxyRecordMetric(id, value), "proxy_record_metric", "")
}

// GetMetric reads a metric's current value.
func (h Host) GetMetric(id uint32) (uint64, error) {
	resetReturn()
	if err := statusErr(proxyGetMetric(id, &retU64), "proxy_get_metric", ""); err != nil {
		return 0, err
	}
	return retU64, nil
}

// getPairs reads a whole header map with one host call and decodes it into dst.
func getPairs(m MapType, dst [][2]string) ([][2]string, error) {
	resetReturn()
	st := proxyGetHeaderMapPairs(uint32(m), &retPtr, &retSize)
	buf, ok := takeOwned()
	if err := statusErr(st, "proxy_get_header_map_pairs", ""); err != nil {
		return dst, err
	}
	if !ok {
		return dst, &CallError{Func: "proxy_get_header_map_pairs", Err: ErrInvalidMemoryAccess}
	}
	out, err := DecodePairs(dst, buf)
	if err != nil {
		return dst, &CallError{Func: "proxy_get_header_map_pairs", Err: err}
	}
	return out, nil
}

// readBuffer reads up to max bytes of a host buffer. An empty or absent buffer is nil
// without error: hosts differ on whether that is OK or NOT_FOUND.
func readBuffer(b BufferType, max uint32) ([]byte, error) { return getBuffer(b, 0, max, false) }

// getBuffer is proxy_get_buffer_bytes: into the reused body buffer (reuse: the caller
// is done with the bytes before the next body read), or into memory the caller owns.
func getBuffer(b BufferType, start, max uint32, reuse bool) ([]byte, error) {
	if max == 0 {
		return nil, nil
	}
	resetReturn()
	bodyArmed = reuse
	st := proxyGetBufferBytes(uint32(b), start, max, &retPtr, &retSize)
	var buf []byte
	var ok bool
	if reuse {
		buf, _, ok = takeReturned()
	} else {
		buf, ok = takeOwned()
	}
	if st == statusNotFound {
		return nil, nil
	}
	if err := statusErr(st, "proxy_get_buffer_bytes", ""); err != nil {
		return nil, err
	}
	if !ok {
		return nil, &CallError{Func: "proxy_get_buffer_bytes", Err: ErrInvalidMemoryAccess}
	}
	return buf, nil
}

func strData(s string) *byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.StringData(s)
}

func bytesData(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return unsafe.SliceData(b)
}
