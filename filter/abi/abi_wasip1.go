//go:build wasip1

package abi

import "unsafe"

// Host functions (module "env"), with the exact v0.2.1 signatures. Every parameter is
// i32 (uint32, int32 or a pointer) except the i64 value of proxy_record_metric and the
// i64 delta of proxy_increment_metric, as the spec declares them.

//go:wasmimport env proxy_log
func proxyLog(level uint32, msgData *byte, msgSize uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bufferType, start, maxSize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mapType uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, keyData *byte, keySize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mapType uint32, keyData *byte, keySize uint32, valueData *byte, valueSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mapType uint32, keyData *byte, keySize uint32, valueData *byte, valueSize uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(statusCode uint32, detailsData *byte, detailsSize uint32,
	bodyData *byte, bodySize uint32, headersData *byte, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(keyData *byte, keySize uint32, retData, retSize, retCas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(keyData *byte, keySize uint32, valueData *byte, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(pathData *byte, pathSize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_set_property
func proxySetProperty(pathData *byte, pathSize uint32, valueData *byte, valueSize uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(period uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(upstreamData *byte, upstreamSize uint32, headersData *byte, headersSize uint32,
	bodyData *byte, bodySize uint32, trailersData *byte, trailersSize uint32, timeoutMs uint32, retCallID *uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(contextID uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, nameData *byte, nameSize uint32, retID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(metricID uint32, delta int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(metricID uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(metricID uint32, retValue *uint64) uint32

// Callbacks (exports). Each one is a thin shell around the dispatch code in
// dispatch.go; enter/leave track nesting, and leave recovers panics (see leave).
//
// Only callbacks with work to do are exported: a proxy-wasm host skips a callback the
// module does not export and goes on as if it had answered Continue (proxy-wasm-cpp-host
// checks every one, in every Envoy release), so the request body and trailers, the
// response trailers and shared queues cost no call into the module. proxy_on_log and
// proxy_on_delete are not exported either (see onDone).

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) unsafe.Pointer {
	return allocate(size)
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentContextID uint32) {
	enter("proxy_on_context_create")
	defer leave()
	onContextCreate(contextID, parentContextID)
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootContextID, vmConfigSize uint32) (ok uint32) {
	enter("proxy_on_vm_start")
	defer leave()
	return boolToU32(onVMStart(rootContextID, vmConfigSize))
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootContextID, pluginConfigSize uint32) (ok uint32) {
	enter("proxy_on_configure")
	defer leave()
	return boolToU32(onConfigure(rootContextID, pluginConfigSize))
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootContextID uint32) {
	enter("proxy_on_tick")
	defer leave()
	onTick(rootContextID)
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(rootContextID, callID, numHeaders, bodySize, numTrailers uint32) {
	enter("proxy_on_http_call_response")
	defer leave()
	onHTTPCallResponse(rootContextID, callID, numHeaders, bodySize)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) (action uint32) {
	enter("proxy_on_request_headers")
	defer leave()
	return uint32(onRequestHeaders(contextID, numHeaders, endOfStream != 0))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) (action uint32) {
	enter("proxy_on_response_headers")
	defer leave()
	return uint32(onResponseHeaders(contextID, numHeaders, endOfStream != 0))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) (action uint32) {
	enter("proxy_on_response_body")
	defer leave()
	return uint32(onResponseBody(contextID, bodySize, endOfStream != 0))
}

// proxy_on_done ends the context: the binding does not export proxy_on_delete (see
// onDone).
//
//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) (done uint32) {
	enter("proxy_on_done")
	// A panic in OnDone must still let the host finalize the context: preset true.
	done = 1
	defer leave()
	onDone(contextID)
	return 1
}

func boolToU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
