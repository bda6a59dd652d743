package wazerohost

import (
	"context"
	"fmt"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// hostFunc is one proxy-wasm host function. It receives the VM it serves, the calling
// module and the wasm value stack (parameters in, result out) and returns a status.
type hostFunc func(v *vm, mod api.Module, s []uint64) Status

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func i32s(n int) []api.ValueType {
	t := make([]api.ValueType, n)
	for i := range t {
		t[i] = i32
	}
	return t
}

// instantiateEnv builds the "env" host module with every host function of proxy-wasm
// ABI v0.2.1 (plus the v0.2.0 names Envoy still exports), so any module built against
// the ABI links. Calls the host does not implement answer Unimplemented.
func instantiateEnv(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder("env")
	export := func(name string, params []api.ValueType, f hostFunc) {
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, s []uint64) {
				v, _ := ctx.Value(vmKey{}).(*vm)
				if v == nil {
					s[0] = uint64(StatusInternalFailure)
					return
				}
				if v.calls != nil {
					v.calls[name]++
				}
				s[0] = uint64(f(v, mod, s))
			}), params, []api.ValueType{i32}).
			Export(name)
	}
	unimplemented := func(v *vm, mod api.Module, s []uint64) Status { return StatusUnimplemented }

	export("proxy_log", i32s(3), hLog)
	export("proxy_get_log_level", i32s(1), hGetLogLevel)
	export("proxy_get_current_time_nanoseconds", i32s(1), hGetTime)
	export("proxy_set_tick_period_milliseconds", i32s(1), hSetTick)

	export("proxy_get_buffer_bytes", i32s(5), hGetBufferBytes)
	export("proxy_set_buffer_bytes", i32s(5), hSetBufferBytes)
	export("proxy_get_buffer_status", i32s(3), hGetBufferStatus)

	export("proxy_get_header_map_size", i32s(2), hGetHeaderMapSize)
	export("proxy_get_header_map_pairs", i32s(3), hGetHeaderMapPairs)
	export("proxy_set_header_map_pairs", i32s(3), hSetHeaderMapPairs)
	export("proxy_get_header_map_value", i32s(5), hGetHeaderMapValue)
	export("proxy_add_header_map_value", i32s(5), hAddHeaderMapValue)
	export("proxy_replace_header_map_value", i32s(5), hReplaceHeaderMapValue)
	export("proxy_remove_header_map_value", i32s(3), hRemoveHeaderMapValue)

	export("proxy_continue_stream", i32s(1), hContinueStream)
	export("proxy_close_stream", i32s(1), hCloseStream)
	export("proxy_continue_request", nil, func(v *vm, mod api.Module, s []uint64) Status {
		return v.continueStream(streamRequest)
	})
	export("proxy_continue_response", nil, func(v *vm, mod api.Module, s []uint64) Status {
		return v.continueStream(streamResponse)
	})
	export("proxy_clear_route_cache", nil, func(v *vm, mod api.Module, s []uint64) Status { return StatusOK })
	export("proxy_get_status", i32s(3), hGetStatus)
	export("proxy_send_local_response", i32s(8), hSendLocalResponse)

	export("proxy_http_call", i32s(10), hHTTPCall)
	export("proxy_grpc_call", i32s(12), unimplemented)
	export("proxy_grpc_stream", i32s(9), unimplemented)
	export("proxy_grpc_send", i32s(4), unimplemented)
	export("proxy_grpc_cancel", i32s(1), unimplemented)
	export("proxy_grpc_close", i32s(1), unimplemented)

	export("proxy_set_shared_data", i32s(5), hSetSharedData)
	export("proxy_get_shared_data", i32s(5), hGetSharedData)
	export("proxy_register_shared_queue", i32s(3), unimplemented)
	export("proxy_resolve_shared_queue", i32s(5), unimplemented)
	export("proxy_enqueue_shared_queue", i32s(3), unimplemented)
	export("proxy_dequeue_shared_queue", i32s(3), unimplemented)

	export("proxy_define_metric", i32s(4), hDefineMetric)
	export("proxy_increment_metric", []api.ValueType{i32, i64}, hIncrementMetric)
	export("proxy_record_metric", []api.ValueType{i32, i64}, hRecordMetric)
	export("proxy_get_metric", i32s(2), hGetMetric)

	export("proxy_get_property", i32s(4), hGetProperty)
	export("proxy_set_property", i32s(4), hSetProperty)
	export("proxy_call_foreign_function", i32s(6), func(v *vm, mod api.Module, s []uint64) Status {
		return StatusNotFound
	})

	export("proxy_done", nil, hDone)
	export("proxy_set_effective_context", i32s(1), hSetEffectiveContext)

	_, err := b.Instantiate(ctx)
	if err != nil {
		return fmt.Errorf("instantiate proxy-wasm host module: %w", err)
	}
	return nil
}

func u32(x uint64) uint32 { return uint32(x) }

func read(mod api.Module, ptr, size uint32) ([]byte, bool) {
	return mod.Memory().Read(ptr, size)
}

// Logging.

func hLog(v *vm, mod api.Module, s []uint64) Status {
	level := u32(s[0])
	if level > LogCritical {
		return StatusBadArgument
	}
	msg, ok := read(mod, u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	v.host.log(v, int(level), string(msg))
	return StatusOK
}

func hGetLogLevel(v *vm, mod api.Module, s []uint64) Status {
	if !mod.Memory().WriteUint32Le(u32(s[0]), uint32(v.host.cfg.LogLevel)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hGetTime(v *vm, mod api.Module, s []uint64) Status {
	if !mod.Memory().WriteUint64Le(u32(s[0]), uint64(v.host.now().UnixNano())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hSetTick(v *vm, mod api.Module, s []uint64) Status {
	v.setTick(v.active().rootOf(), time.Duration(u32(s[0]))*time.Millisecond)
	return StatusOK
}

// Buffers.

// buffer mirrors Context::getBuffer: it returns the bytes of buffer t as seen from
// context c, or ok=false where Envoy returns no buffer (NotFound).
func (v *vm) buffer(c *pctx, t uint32) ([]byte, bool) {
	switch t {
	case bufRequestBody, bufResponseBody:
		if !c.isRoot() && c.body != nil && c.bodyType == int(t) {
			return c.body, true
		}
		return nil, true
	case bufHTTPCallResponseBody:
		if r := c.rootOf().callResp; r != nil {
			return r.body, true
		}
		return nil, false
	case bufVMConfiguration:
		return v.host.cfg.VMConfig, true
	case bufPluginConfiguration:
		if root := c.rootOf(); root.configuring {
			return root.pluginConfig, true
		}
		return nil, false
	}
	return nil, true
}

func hGetBufferBytes(v *vm, mod api.Module, s []uint64) Status {
	t, start, length := u32(s[0]), uint64(u32(s[1])), uint64(u32(s[2]))
	if t > bufMax {
		return StatusBadArgument
	}
	data, ok := v.buffer(v.active(), t)
	if !ok {
		return StatusNotFound
	}
	size := uint64(len(data))
	if start > size {
		return StatusBadArgument
	}
	if start+length > size {
		length = size - start
	}
	if length == 0 {
		// Envoy returns Ok without touching the return slots.
		return StatusOK
	}
	return v.copyOut(mod, data[start:start+length], u32(s[3]), u32(s[4]))
}

func hSetBufferBytes(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > bufMax {
		return StatusBadArgument
	}
	if _, ok := v.buffer(v.active(), t); !ok {
		return StatusNotFound
	}
	if _, ok := read(mod, u32(s[3]), u32(s[4])); !ok {
		return StatusInvalidMemoryAccess
	}
	// Bodies are not streamed through this host and configuration buffers are
	// read-only (as in Envoy), so nothing can be written.
	return StatusBadArgument
}

func hGetBufferStatus(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > bufMax {
		return StatusBadArgument
	}
	data, ok := v.buffer(v.active(), t)
	if !ok {
		return StatusNotFound
	}
	mem := mod.Memory()
	if !mem.WriteUint32Le(u32(s[1]), uint32(len(data))) || !mem.WriteUint32Le(u32(s[2]), 0) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// Header maps.

// mutableMap mirrors Context::getMap: request headers while the stream's request is
// being filtered (during proxy_on_request_headers or while it is paused there),
// response headers likewise; trailers are never present here.
func mutableMap(c *pctx, t uint32) *headerMap {
	if c.isRoot() {
		return nil
	}
	switch t {
	case mapRequestHeaders:
		if c.reqOpen {
			return c.reqMap
		}
	case mapResponseHeaders:
		if c.respOpen {
			return c.respMap
		}
	}
	return nil
}

// constMap mirrors Context::getConstMap: in proxy_on_log the final request and
// response headers are readable; HTTP call response maps are readable during
// proxy_on_http_call_response.
func constMap(c *pctx, t uint32) []Pair {
	switch t {
	case mapRequestHeaders, mapResponseHeaders:
		if !c.isRoot() && c.logPhase {
			if t == mapRequestHeaders {
				return c.reqMap.pairs
			}
			if c.respMap != nil {
				return c.respMap.pairs
			}
			return nil
		}
		if m := mutableMap(c, t); m != nil {
			return m.pairs
		}
	case mapHTTPCallResponseHeaders:
		if r := c.rootOf().callResp; r != nil {
			return r.headers
		}
	case mapHTTPCallResponseTrailers:
		if r := c.rootOf().callResp; r != nil {
			return r.trailers
		}
	}
	return nil
}

// constMapPresent reports whether Envoy would find a map at all (getHeaderMapValue
// answers BadArgument for a missing map and NotFound for a missing key).
func constMapPresent(c *pctx, t uint32) bool {
	switch t {
	case mapRequestHeaders, mapResponseHeaders:
		if !c.isRoot() && c.logPhase {
			return t == mapRequestHeaders || c.respMap != nil
		}
		return mutableMap(c, t) != nil
	case mapHTTPCallResponseHeaders:
		return c.rootOf().callResp != nil
	case mapHTTPCallResponseTrailers:
		r := c.rootOf().callResp
		return r != nil && r.trailers != nil
	}
	return false
}

func hGetHeaderMapSize(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > mapMax {
		return StatusBadArgument
	}
	m := mutableMap(v.active(), t)
	if m == nil {
		return StatusBadArgument
	}
	if !mod.Memory().WriteUint32Le(u32(s[1]), uint32(m.byteSize())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hGetHeaderMapPairs(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > mapMax {
		return StatusBadArgument
	}
	pairs := constMap(v.active(), t)
	if len(pairs) == 0 {
		return v.copyOut(mod, nil, u32(s[1]), u32(s[2]))
	}
	v.scratch = encodePairs(v.scratch[:0], pairs)
	return v.copyOut(mod, v.scratch, u32(s[1]), u32(s[2]))
}

func hSetHeaderMapPairs(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > mapMax {
		return StatusBadArgument
	}
	data, ok := read(mod, u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	m := mutableMap(v.active(), t)
	if m == nil {
		return StatusBadArgument
	}
	// Envoy's toPairs turns a malformed buffer into an empty map.
	pairs, _ := DecodePairs(data)
	m.set(pairs)
	return StatusOK
}

func hGetHeaderMapValue(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > mapMax {
		return StatusBadArgument
	}
	key, ok := read(mod, u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	c := v.active()
	if !constMapPresent(c, t) {
		return StatusBadArgument
	}
	m := headerMap{pairs: constMap(c, t)}
	value, found := m.get(string(key))
	if !found {
		return StatusNotFound
	}
	v.scratch = append(v.scratch[:0], value...)
	return v.copyOut(mod, v.scratch, u32(s[3]), u32(s[4]))
}

func mapEdit(v *vm, mod api.Module, s []uint64, withValue bool, edit func(m *headerMap, k, val string)) Status {
	t := u32(s[0])
	if t > mapMax {
		return StatusBadArgument
	}
	key, ok := read(mod, u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	var value []byte
	if withValue {
		if value, ok = read(mod, u32(s[3]), u32(s[4])); !ok {
			return StatusInvalidMemoryAccess
		}
	}
	m := mutableMap(v.active(), t)
	if m == nil {
		return StatusBadArgument
	}
	edit(m, string(key), string(value))
	return StatusOK
}

func hAddHeaderMapValue(v *vm, mod api.Module, s []uint64) Status {
	return mapEdit(v, mod, s, true, func(m *headerMap, k, val string) { m.add(k, val) })
}

func hReplaceHeaderMapValue(v *vm, mod api.Module, s []uint64) Status {
	return mapEdit(v, mod, s, true, func(m *headerMap, k, val string) { m.replace(k, val) })
}

func hRemoveHeaderMapValue(v *vm, mod api.Module, s []uint64) Status {
	return mapEdit(v, mod, s, false, func(m *headerMap, k, _ string) { m.remove(k) })
}

// Streams.

func hContinueStream(v *vm, mod api.Module, s []uint64) Status {
	return v.continueStream(u32(s[0]))
}

// continueStream mirrors Context::continueStream: HTTP request or response streams
// resume (after the current callback returns, as Envoy defers continueDecoding), and
// the headers of that direction stop being accessible.
func (v *vm) continueStream(t uint32) Status {
	c := v.active()
	switch t {
	case streamRequest, streamResponse:
	default:
		return StatusBadArgument
	}
	if c.isRoot() {
		return StatusOK
	}
	if t == streamRequest && c.phase == phaseRequest {
		c.reqOpen = false
		signal(c.resume)
	}
	if t == streamResponse && c.phase == phaseResponse {
		c.respOpen = false
		signal(c.resume)
	}
	return StatusOK
}

func hCloseStream(v *vm, mod api.Module, s []uint64) Status {
	t := u32(s[0])
	if t > streamUpstream {
		return StatusBadArgument
	}
	c := v.active()
	if !c.isRoot() && (t == streamRequest || t == streamResponse) && c.phase != phaseDone {
		c.reset = true
		signal(c.resume)
	}
	return StatusOK
}

func hGetStatus(v *vm, mod api.Module, s []uint64) Status {
	root := v.active().rootOf()
	if !mod.Memory().WriteUint32Le(u32(s[0]), root.callStatus) {
		return StatusInvalidMemoryAccess
	}
	return v.copyOut(mod, []byte(root.callStatusMsg), u32(s[1]), u32(s[2]))
}

func hSendLocalResponse(v *vm, mod api.Module, s []uint64) Status {
	details, ok1 := read(mod, u32(s[1]), u32(s[2]))
	body, ok2 := read(mod, u32(s[3]), u32(s[4]))
	hdrs, ok3 := read(mod, u32(s[5]), u32(s[6]))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	pairs, _ := DecodePairs(hdrs)
	v.stopNext = true
	c := v.active()
	if c.isRoot() {
		// Envoy has no decoder callbacks on a root context: nothing is sent.
		return StatusOK
	}
	grpcStatus := int(int32(u32(s[7])))
	if grpcStatus < 0 || grpcStatus > maxGRPCStatus {
		grpcStatus = -1 // Envoy takes only a known status; anything else is "none"
	}
	v.sendLocal(c, &localReply{
		status:     int(u32(s[0])),
		details:    string(details),
		body:       append([]byte(nil), body...),
		headers:    pairs,
		grpc:       c.req != nil && IsGRPC(c.req.Get("content-type")),
		grpcStatus: grpcStatus,
	})
	return StatusOK
}

// HTTP calls.

func hHTTPCall(v *vm, mod api.Module, s []uint64) Status {
	upstream, ok1 := read(mod, u32(s[0]), u32(s[1]))
	hdrs, ok2 := read(mod, u32(s[2]), u32(s[3]))
	body, ok3 := read(mod, u32(s[4]), u32(s[5]))
	trailers, ok4 := read(mod, u32(s[6]), u32(s[7]))
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return StatusInvalidMemoryAccess
	}
	tokenPtr := u32(s[9])
	// Like Envoy, check the token slot before starting anything asynchronous.
	if !mod.Memory().WriteUint32Le(tokenPtr, 0) {
		return StatusInvalidMemoryAccess
	}
	headerPairs, _ := DecodePairs(hdrs)
	trailerPairs, _ := DecodePairs(trailers)
	token, st := v.httpCall(v.active().rootOf(), string(upstream), headerPairs, append([]byte(nil), body...), trailerPairs, int32(u32(s[8])))
	mod.Memory().WriteUint32Le(tokenPtr, token)
	return st
}

// Shared data.

func hSetSharedData(v *vm, mod api.Module, s []uint64) Status {
	key, ok1 := read(mod, u32(s[0]), u32(s[1]))
	value, ok2 := read(mod, u32(s[2]), u32(s[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	if !v.host.shared.Set(string(key), value, u32(s[4])) {
		return StatusCasMismatch
	}
	return StatusOK
}

func hGetSharedData(v *vm, mod api.Module, s []uint64) Status {
	key, ok := read(mod, u32(s[0]), u32(s[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	var cas uint32
	var found bool
	v.scratch, cas, found = v.host.shared.AppendGet(v.scratch[:0], string(key))
	if !found {
		return StatusNotFound
	}
	if st := v.copyOut(mod, v.scratch, u32(s[2]), u32(s[3])); st != StatusOK {
		return st
	}
	if !mod.Memory().WriteUint32Le(u32(s[4]), cas) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// Metrics.

func hDefineMetric(v *vm, mod api.Module, s []uint64) Status {
	name, ok := read(mod, u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	id, st := v.metrics.define(v.host.metrics, u32(s[0]), string(name))
	if st != StatusOK {
		return st
	}
	if !mod.Memory().WriteUint32Le(u32(s[3]), id) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hIncrementMetric(v *vm, mod api.Module, s []uint64) Status {
	return v.metrics.increment(u32(s[0]), int64(s[1]))
}

func hRecordMetric(v *vm, mod api.Module, s []uint64) Status {
	return v.metrics.record(u32(s[0]), s[1])
}

func hGetMetric(v *vm, mod api.Module, s []uint64) Status {
	value, st := v.metrics.get(u32(s[0]))
	if st != StatusOK {
		return st
	}
	if !mod.Memory().WriteUint64Le(u32(s[1]), value) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// Properties.

func hGetProperty(v *vm, mod api.Module, s []uint64) Status {
	path, ok := read(mod, u32(s[0]), u32(s[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, st := v.property(v.active(), string(path))
	if st != StatusOK {
		return st
	}
	return v.copyOut(mod, value, u32(s[2]), u32(s[3]))
}

func hSetProperty(v *vm, mod api.Module, s []uint64) Status {
	path, ok1 := read(mod, u32(s[0]), u32(s[1]))
	value, ok2 := read(mod, u32(s[2]), u32(s[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	c := v.active()
	if c.isRoot() {
		// Envoy keeps set properties in the stream's filter state; a root context
		// has none.
		return StatusNotFound
	}
	c.setProp(path, value)
	return StatusOK
}

// Contexts.

func hDone(v *vm, mod api.Module, s []uint64) Status {
	c := v.active()
	if !c.isRoot() || !c.pendingDone {
		return StatusNotFound
	}
	c.pendingDone = false
	close(c.doneCh)
	return StatusOK
}

func hSetEffectiveContext(v *vm, mod api.Module, s []uint64) Status {
	id := u32(s[0])
	if _, ok := v.contexts[id]; !ok {
		return StatusBadArgument
	}
	v.effective = id
	return StatusOK
}

// signal wakes a waiter without blocking; one pending wake-up is enough.
func signal(ch chan struct{}) {
	if ch == nil {
		return
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}
