// Command probe is a proxy-wasm guest for the host's own tests. It talks to the ABI
// directly (raw //go:wasmimport and //go:wasmexport, no SDK) and exposes one host
// feature per request path, answering with local replies whose status, headers and
// body report what the host returned, so the tests can check the host call by call.
//
// Plugin configuration: a comma-separated list of words; "refuse" makes
// proxy_on_configure fail, "tick=N" sets an N ms tick, "slowdone" makes the root's
// proxy_on_done return false and call proxy_done after a final callout to cluster
// "sink". Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg *byte, size uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(t, start, max uint32, retPtr, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(t uint32, retPtr, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(t uint32, key *byte, keySize uint32, retPtr, retSize *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(t uint32, key *byte, keySize uint32, value *byte, valueSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(t uint32, key *byte, keySize uint32, value *byte, valueSize uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details *byte, detailsSize uint32, body *byte, bodySize uint32, headers *byte, headersSize uint32, grpc int32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key *byte, keySize uint32, retPtr, retSize, retCas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key *byte, keySize uint32, value *byte, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path *byte, pathSize uint32, retPtr, retSize *uint32) uint32

//go:wasmimport env proxy_set_property
func proxySetProperty(path *byte, pathSize uint32, value *byte, valueSize uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriod(ms uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(up *byte, upSize uint32, hdrs *byte, hdrsSize uint32, body *byte, bodySize uint32, trl *byte, trlSize uint32, timeout uint32, retToken *uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(t uint32) uint32

//go:wasmimport env proxy_close_stream
func proxyCloseStream(t uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_get_status
func proxyGetStatus(code *uint32, retPtr, retSize *uint32) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func proxyGetCurrentTimeNanoseconds(ret *uint64) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(t uint32, name *byte, nameSize uint32, retID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(id uint32, ret *uint64) uint32

// Memory handed to the host, pinned until the next callback starts (the guest copies
// what it needs within the callback that received it).
var pins = map[uint32][]byte{}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) *byte {
	if size == 0 {
		size = 1
	}
	b := make([]byte, size)
	p := &b[0]
	pins[uint32(uintptr(unsafe.Pointer(p)))] = b
	return p
}

func enter() { clear(pins) }

// returned looks up a buffer the host returned through two return slots.
func returned(ptr, size uint32) []byte {
	if size == 0 {
		return nil
	}
	b, ok := pins[ptr]
	if !ok || uint32(len(b)) < size {
		return nil
	}
	return append([]byte(nil), b[:size]...)
}

func bp(s string) *byte {
	if s == "" {
		return nil
	}
	return unsafe.StringData(s)
}

func bsp(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return &b[0]
}

func logf(level uint32, msg string) { proxyLog(level, bp(msg), uint32(len(msg))) }

func itoa(n int) string    { return strconv.Itoa(n) }
func utoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

type pair = [2]string

func encode(pairs []pair) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	off := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(b[off:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(b[off+4:], uint32(len(p[1])))
		off += 8
	}
	for _, p := range pairs {
		off += copy(b[off:], p[0]) + 1
		off += copy(b[off:], p[1]) + 1
	}
	return b
}

func decode(b []byte) []pair {
	if len(b) < 4 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	if 4+8*n > len(b) {
		return nil
	}
	out := make([]pair, n)
	data := 4 + 8*n
	for i := range out {
		ks := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vs := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		if data+ks+vs+2 > len(b) {
			return nil
		}
		out[i][0] = string(b[data : data+ks])
		data += ks + 1
		out[i][1] = string(b[data : data+vs])
		data += vs + 1
	}
	return out
}

func headers(t uint32) ([]pair, uint32) {
	var ptr, size uint32
	st := proxyGetHeaderMapPairs(t, &ptr, &size)
	return decode(returned(ptr, size)), st
}

func header(t uint32, key string) (string, uint32) {
	var ptr, size uint32
	st := proxyGetHeaderMapValue(t, bp(key), uint32(len(key)), &ptr, &size)
	return string(returned(ptr, size)), st
}

func addHeader(t uint32, k, v string) uint32 {
	return proxyAddHeaderMapValue(t, bp(k), uint32(len(k)), bp(v), uint32(len(v)))
}

func replaceHeader(t uint32, k, v string) uint32 {
	return proxyReplaceHeaderMapValue(t, bp(k), uint32(len(k)), bp(v), uint32(len(v)))
}

func reply(status uint32, body string, hdrs []pair) uint32 {
	h := encode(hdrs)
	d := "probe"
	return proxySendLocalResponse(status, bp(d), uint32(len(d)), bp(body), uint32(len(body)), bsp(h), uint32(len(h)), -1)
}

func property(path ...string) ([]byte, uint32) {
	p := strings.Join(path, "\x00")
	var ptr, size uint32
	st := proxyGetProperty(bp(p), uint32(len(p)), &ptr, &size)
	return returned(ptr, size), st
}

func query(path string) map[string]string {
	out := map[string]string{}
	_, q, _ := strings.Cut(path, "?")
	for _, kv := range strings.Split(q, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			out[k] = v
		}
	}
	return out
}

// Plugin state, per VM.
var (
	config     string
	rootID     uint32
	counterID  uint32
	gaugeID    uint32
	histID     uint32
	ruleAPI    uint32 // per-rule counters in Istio's tag encoding
	ruleWeb    uint32
	ticksID    uint32
	calls      = map[uint32]call{} // callout token -> waiting stream
	flushToken uint32
	paths      = map[uint32]string{} // stream -> :path
)

type call struct {
	stream uint32
	mode   string
}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	enter()
	if parent == 0 {
		logf(1, "context_create root "+utoa(id))
	}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 {
	enter()
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	enter()
	var ptr, got uint32
	st := proxyGetBufferBytes(7, 0, size, &ptr, &got)
	cfg := string(returned(ptr, got))
	if size > 0 && st != 0 {
		logf(4, "plugin configuration unreadable: status "+utoa(st))
		return 0
	}
	if strings.Contains(cfg, "refuse") {
		logf(5, "refusing configuration "+strconv.Quote(cfg))
		return 0
	}
	config, rootID = cfg, root
	define := func(t uint32, name string) uint32 {
		var id uint32
		proxyDefineMetric(t, bp(name), uint32(len(name)), &id)
		return id
	}
	counterID = define(0, "probe.requests")
	gaugeID = define(1, "probe.gauge")
	histID = define(2, "probe.latency")
	ticksID = define(0, "probe.ticks")
	ruleAPI = define(0, "rule=.=api;.;probe.rule.hits")
	ruleWeb = define(0, "rule=.=web;.;probe.rule.hits")
	for _, w := range strings.Split(cfg, ",") {
		if v, ok := strings.CutPrefix(w, "tick="); ok {
			ms, _ := strconv.Atoi(v)
			proxySetTickPeriod(uint32(ms))
		}
	}
	logf(2, "configured root "+utoa(root)+" with "+strconv.Quote(cfg))
	return 1
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) {
	enter()
	proxyIncrementMetric(ticksID, 1)
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	enter()
	path, _ := header(0, ":path")
	paths[id] = path
	route, _, _ := strings.Cut(path, "?")
	q := query(path)
	switch route {
	case "/local":
		reply(429, "slow down", []pair{{"x-local", "yes"}, {"retry-after", "7"}})
		return 1
	case "/local-json":
		reply(429, `{"error":"slow"}`, []pair{{"content-type", "application/json"}})
		return 1
	case "/local-empty":
		reply(204, "", []pair{{"content-type", "text/html"}, {"content-length", "99"}})
		return 1
	case "/echo":
		pairs, st := headers(0)
		var b strings.Builder
		var out []pair
		for _, p := range pairs {
			b.WriteString(p[0] + "=" + p[1] + "\n")
			if !strings.HasPrefix(p[0], ":") {
				out = append(out, pair{"echo-" + p[0], p[1]})
			}
		}
		out = append(out, pair{"x-pairs-status", utoa(st)}, pair{"x-num-headers", utoa(n)}, pair{"x-eos", utoa(eos)})
		reply(200, b.String(), out)
		return 1
	case "/shared":
		key := q["key"]
		switch q["op"] {
		case "get":
			var ptr, size, cas uint32
			st := proxyGetSharedData(bp(key), uint32(len(key)), &ptr, &size, &cas)
			reply(200, string(returned(ptr, size)), []pair{{"x-status", utoa(st)}, {"x-cas", utoa(cas)}})
		case "set":
			v := q["value"]
			cas, _ := strconv.ParseUint(q["cas"], 10, 32)
			st := proxySetSharedData(bp(key), uint32(len(key)), bp(v), uint32(len(v)), uint32(cas))
			reply(200, "", []pair{{"x-status", utoa(st)}})
		}
		return 1
	case "/props":
		var b strings.Builder
		for _, p := range []string{"source.address", "plugin_root_id", "node.id", "destination.address", "request.path", "missing.thing"} {
			v, st := property(strings.Split(p, ".")...)
			b.WriteString(p + "=" + string(v) + " (" + utoa(st) + ")\n")
		}
		port, st := property("source", "port")
		if st == 0 && len(port) == 8 {
			b.WriteString("source.port=" + strconv.FormatUint(binary.LittleEndian.Uint64(port), 10) + "\n")
		}
		reply(200, b.String(), nil)
		return 1
	case "/metrics":
		st := proxyIncrementMetric(counterID, 1)
		neg := proxyIncrementMetric(counterID, -1)
		proxyRecordMetric(gaugeID, 42)
		proxyIncrementMetric(gaugeID, -2)
		proxyRecordMetric(histID, 7)
		proxyIncrementMetric(ruleAPI, 3)
		proxyIncrementMetric(ruleWeb, 1)
		var v, hv uint64
		gst := proxyGetMetric(counterID, &v)
		hst := proxyGetMetric(histID, &hv)
		var bogus uint64
		nst := proxyGetMetric(4000, &bogus)
		reply(200, "", []pair{{"x-inc", utoa(st)}, {"x-neg", utoa(neg)}, {"x-counter", strconv.FormatUint(v, 10)},
			{"x-get", utoa(gst)}, {"x-hist-get", utoa(hst)}, {"x-unknown", utoa(nst)}})
		return 1
	case "/callout":
		var token uint32
		cl := q["cluster"]
		hdrs := encode([]pair{{":method", "POST"}, {":path", q["path"]}, {":authority", "callout.test"}, {"x-from", "probe"}})
		if q["nopath"] != "" {
			hdrs = encode([]pair{{":method", "GET"}, {":authority", "callout.test"}})
		}
		body := "ping"
		timeout, _ := strconv.Atoi(q["timeout"])
		st := proxyHTTPCall(bp(cl), uint32(len(cl)), bsp(hdrs), uint32(len(hdrs)), bp(body), uint32(len(body)), nil, 0, uint32(timeout), &token)
		if st != 0 {
			reply(500, "http_call status="+utoa(st), []pair{{"x-token", utoa(token)}})
			return 1
		}
		calls[token] = call{stream: id, mode: q["mode"]}
		return 1
	case "/time":
		var ns uint64
		proxyGetCurrentTimeNanoseconds(&ns)
		reply(200, "", []pair{{"x-host-ns", strconv.FormatUint(ns, 10)}, {"x-wasi-ns", strconv.FormatInt(time.Now().UnixNano(), 10)}})
		return 1
	case "/setprop":
		path, v := q["path"], q["value"]
		st := proxySetProperty(bp(path), uint32(len(path)), bp(v), uint32(len(v)))
		reply(200, "", []pair{{"x-status", utoa(st)}})
		return 1
	case "/pause":
		return 1
	case "/close":
		proxyCloseStream(0)
		return 1
	case "/config":
		reply(200, config, []pair{{"x-root", utoa(rootID)}})
		return 1
	case "/trap":
		var m map[string]int
		m["boom"] = 1 // nil map write: a Go panic, which exits the module
		return 0
	}
	addHeader(0, "x-probe", "1")
	replaceHeader(0, "x-replace-me", "done")
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	enter()
	path := paths[id]
	route, _, _ := strings.Cut(path, "?")
	_, reqStatus := header(0, ":path")
	addHeader(2, "x-added", "yes")
	addHeader(2, "x-req-headers-status", utoa(reqStatus))
	addHeader(2, "x-resp-eos", utoa(eos))
	if _, st := header(2, "x-replace"); st == 0 {
		replaceHeader(2, "x-replace", "replaced")
	}
	switch route {
	case "/resp-local":
		reply(503, "replaced by filter", []pair{{"x-resp-local", "yes"}})
		return 1
	case "/local-json":
		replaceHeader(2, "x-seen-status", "")
	}
	return 0
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, token, nh, nb, nt uint32) {
	enter()
	if token == flushToken && flushToken != 0 {
		st := proxyDone()
		logf(2, "flush answered; proxy_done status "+utoa(st))
		return
	}
	c, ok := calls[token]
	if !ok {
		logf(3, "unknown callout token "+utoa(token))
		return
	}
	delete(calls, token)
	status, sst := header(6, ":status")
	var ptr, size uint32
	bst := proxyGetBufferBytes(4, 0, nb, &ptr, &size)
	body := string(returned(ptr, size))
	var code, mptr, msize uint32
	proxyGetStatus(&code, &mptr, &msize)
	msg := string(returned(mptr, msize))
	all, _ := headers(6)
	est := proxySetEffectiveContext(c.stream)
	summary := "status=" + status + " headers=" + utoa(nh) + " body=" + body + " trailers=" + utoa(nt) +
		" status_st=" + utoa(sst) + " body_st=" + utoa(bst) + " code=" + utoa(code) + " msg=" + msg + " pairs=" + itoa(len(all)) + " eff=" + utoa(est)
	switch c.mode {
	case "resume":
		addHeader(0, "x-callout", summary)
		proxyContinueStream(0)
	default:
		reply(200, summary, []pair{{"x-callout-token", utoa(token)}})
	}
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	enter()
	path, st := header(0, ":path")
	status, _ := header(2, ":status")
	logf(2, "on_log "+utoa(id)+" path="+path+" st="+utoa(st)+" status="+status)
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	enter()
	if id == rootID && strings.Contains(config, "slowdone") {
		cl := "sink"
		hdrs := encode([]pair{{":method", "POST"}, {":path", "/flush"}, {":authority", "sink"}})
		st := proxyHTTPCall(bp(cl), uint32(len(cl)), bsp(hdrs), uint32(len(hdrs)), nil, 0, nil, 0, 2000, &flushToken)
		logf(2, "on_done root "+utoa(id)+" flushing, http_call status "+utoa(st))
		return 0
	}
	if id == rootID {
		logf(2, "on_done root "+utoa(id))
	} else {
		logf(2, "on_done "+utoa(id))
	}
	return 1
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	enter()
	delete(paths, id)
	if id == rootID {
		logf(2, "on_delete root "+utoa(id))
		return
	}
	logf(2, "on_delete "+utoa(id))
}
