package wazerohost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Request is one downstream HTTP request as a listener received it.
type Request struct {
	Method     string
	Path       string // path and query, as on the request line (":path")
	Authority  string // Host header (":authority")
	Scheme     string // ":scheme"; "http" when empty
	Protocol   string // "HTTP/1.1" when empty (request.protocol)
	Header     []Pair // regular headers in arrival order; names are lower-cased by the host
	Body       []byte
	RemoteAddr string // downstream peer "ip:port" (source.address, source.port)
	LocalAddr  string // listener address (destination.address, destination.port)
	// Metadata is the request's dynamic metadata as filters before this one left it
	// (served as metadata.filter_metadata.<filter>...); see Config.JWTAuthn.
	Metadata Metadata
	// FilterState holds string filter-state objects by name (filter_state.<name>).
	FilterState map[string]string
}

func (r *Request) scheme() string {
	if r.Scheme == "" {
		return "http"
	}
	return r.Scheme
}

func (r *Request) protocol() string {
	if r.Protocol == "" {
		return "HTTP/1.1"
	}
	return r.Protocol
}

// Get returns the first value of header name (case-insensitive) or "".
func (r *Request) Get(name string) string {
	return getPair(r.Header, name)
}

// Response is what the client receives: the upstream's response after the filter's
// changes, or a local reply.
type Response struct {
	Status int
	Header []Pair // lower-case names, without ":status"
	Body   []byte
	// Trailer is the upstream's trailers (a gRPC response's grpc-status), passed through.
	Trailer []Pair
	Local   bool   // a local reply (the filter's proxy_send_local_response, or the host's own: upstream failure, stream timeout, failed VM)
	Details string // response code details of a local reply, as Envoy's %RESPONSE_CODE_DETAILS%
	Reset   bool   // the stream was reset (proxy_close_stream, client gone): nothing reaches the client
	Worker  int    // the worker VM that filtered the request
}

// Get returns the first value of header name (case-insensitive) or "".
func (r *Response) Get(name string) string {
	return getPair(r.Header, name)
}

// Values returns every value of header name (case-insensitive).
func (r *Response) Values(name string) []string {
	name = strings.ToLower(name)
	var out []string
	for _, p := range r.Header {
		if strings.ToLower(p[0]) == name {
			out = append(out, p[1])
		}
	}
	return out
}

func getPair(pairs []Pair, name string) string {
	name = strings.ToLower(name)
	for _, p := range pairs {
		if strings.ToLower(p[0]) == name {
			return p[1]
		}
	}
	return ""
}

// Upstream serves a request the filter let through: the router and upstream cluster
// of an Envoy listener. The request carries the headers as the filter left them. An
// error becomes Envoy's router reply: 504 "upstream request timeout" when ctx's
// deadline passed, else 503 "upstream connect error ...".
type Upstream func(ctx context.Context, req *Request) (*Response, error)

// StaticUpstream answers every request with the same response (benchmarks, tests).
func StaticUpstream(status int, header []Pair, body []byte) Upstream {
	return func(context.Context, *Request) (*Response, error) {
		return &Response{Status: status, Header: append([]Pair(nil), header...), Body: body}, nil
	}
}

// hopByHop are the connection-specific request headers Envoy's HTTP/1 codec and
// connection manager do not pass to filters.
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "host": true,
}

// RequestPairs builds the request header map a filter sees: the pseudo-headers first
// (as Envoy's header map orders them), then the regular headers lower-cased in
// arrival order, plus the x-forwarded-proto and x-request-id Envoy's connection
// manager adds when they are missing.
func RequestPairs(r *Request) []Pair {
	out := make([]Pair, 0, len(r.Header)+6)
	out = append(out,
		Pair{":authority", r.Authority},
		Pair{":path", r.Path},
		Pair{":method", r.Method},
		Pair{":scheme", r.scheme()},
	)
	hasProto, hasID := false, false
	for _, p := range r.Header {
		k := strings.ToLower(p[0])
		if hopByHop[k] || strings.HasPrefix(k, ":") {
			continue
		}
		switch k {
		case "x-forwarded-proto":
			hasProto = true
		case "x-request-id":
			hasID = true
		}
		out = append(out, Pair{k, p[1]})
	}
	if !hasProto {
		out = append(out, Pair{"x-forwarded-proto", r.scheme()})
	}
	if !hasID {
		out = append(out, Pair{"x-request-id", newRequestID()})
	}
	return out
}

// newRequestID returns a random UUID v4, like Envoy's default request id extension.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// upstreamRequest turns the filtered request headers back into a Request.
func upstreamRequest(orig *Request, m *headerMap) *Request {
	r := &Request{
		Scheme:     orig.Scheme,
		Protocol:   orig.Protocol,
		Body:       orig.Body,
		RemoteAddr: orig.RemoteAddr,
		LocalAddr:  orig.LocalAddr,
	}
	for _, p := range m.pairs {
		switch p[0] {
		case ":method":
			r.Method = p[1]
		case ":path":
			r.Path = p[1]
		case ":authority":
			r.Authority = p[1]
		case ":scheme":
			r.Scheme = p[1]
		default:
			if !strings.HasPrefix(p[0], ":") {
				r.Header = append(r.Header, p)
			}
		}
	}
	return r
}

// localResponsePairs builds the headers of a local reply the way Envoy's
// Utility::sendLocalReply does: ":status", then the plugin's headers (added, not
// replaced), then content-length set to the body size and content-type text/plain
// when the plugin set none; an empty body drops both.
//
// A gRPC request's local reply is trailers-only, as Envoy sends it: ":status" 200,
// content-type application/grpc, grpc-status (the filter's, else mapped from the HTTP
// status) and grpc-message (the body, percent-encoded), then the plugin's headers; no
// body.
func localResponsePairs(lr *localReply) *headerMap {
	if lr.grpc {
		m := newHeaderMap([]Pair{{":status", "200"}, {"content-type", "application/grpc"}})
		st := lr.grpcStatus
		if st < 0 {
			st = HTTPToGRPCStatus(lr.status)
		}
		m.add("grpc-status", strconv.Itoa(st))
		if len(lr.body) > 0 {
			m.add("grpc-message", PercentEncodeGRPC(lr.body))
		}
		for _, p := range lr.headers {
			m.add(p[0], p[1])
		}
		return m
	}
	m := newHeaderMap([]Pair{{":status", strconv.Itoa(lr.status)}})
	for _, p := range lr.headers {
		m.add(p[0], p[1])
	}
	if len(lr.body) > 0 {
		m.replace("content-length", strconv.Itoa(len(lr.body)))
		if _, ok := m.get("content-type"); !ok {
			m.add("content-type", "text/plain")
		}
	} else {
		m.remove("content-length")
		m.remove("content-type")
	}
	return m
}

// sendLocal records a local reply from proxy_send_local_response. The caller holds v.mu.
func (v *vm) sendLocal(c *pctx, lr *localReply) {
	switch {
	case c.phase == phaseDone:
		v.host.log(v, LogDebug, fmt.Sprintf("proxy_send_local_response on finished stream %d ignored", c.id))
		return
	case c.local != nil:
		// A second local reply: Envoy either drops it or, when the first is being
		// encoded, hangs the stream (envoyproxy/envoy#28826). Keep the first.
		v.host.log(v, LogWarn, fmt.Sprintf("second proxy_send_local_response on stream %d ignored", c.id))
		return
	}
	c.local = lr
	v.host.stats.localReplies.Add(1)
	signal(c.resume)
}

// AccessEntry is what the host knows of a finished stream, for an access log.
type AccessEntry struct {
	Request *Request
	Worker  int
	// Status is the status the client got (0: reset, no answer); Details the local
	// reply's details (Envoy's %RESPONSE_CODE_DETAILS%), "via_upstream" otherwise.
	Status  int
	Details string
	// FilterState holds what the plugin set with proxy_set_property, under Envoy's
	// filter-state keys: "wasm." + the property path.
	FilterState map[string]string
}

// accessEntry describes a finished stream context.
func (c *pctx) accessEntry(worker int) AccessEntry {
	e := AccessEntry{Request: c.req, Worker: worker}
	switch {
	case c.local != nil:
		e.Status, e.Details = c.local.status, c.local.details
	case c.respMap != nil && !c.reset:
		if s, ok := c.respMap.get(":status"); ok {
			e.Status, _ = strconv.Atoi(s)
		}
		e.Details = "via_upstream"
	}
	if len(c.props) > 0 {
		e.FilterState = make(map[string]string, len(c.props))
		for _, p := range c.props {
			e.FilterState["wasm."+strings.ReplaceAll(p.path, "\x00", ".")] = string(p.value)
		}
	}
	return e
}

// newStream creates a stream context under the active root and runs
// proxy_on_context_create. The caller holds v.mu.
func (v *vm) newStream(req *Request) (*pctx, error) {
	root := v.root
	if j := v.host.cfg.JWTAuthn; j != nil && req != nil {
		req = j.apply(req)
	}
	c := &pctx{parent: root, req: req, resume: make(chan struct{}, 1)}
	c.id = v.allocID()
	v.contexts[c.id] = c
	root.streams++
	_, err := v.call(c, v.fns.onContextCreate, uint64(c.id), uint64(root.id))
	return c, err
}

// endStream runs proxy_on_log, proxy_on_done and proxy_on_delete, the order Envoy
// produces (the access log runs before the filter is destroyed), and forgets the
// context. The caller holds v.mu.
func (v *vm) endStream(c *pctx) {
	c.phase = phaseDone
	c.reqOpen, c.respOpen = false, false
	c.logPhase = true
	_, _ = v.call(c, v.fns.onLog, uint64(c.id))
	c.logPhase = false
	_, _ = v.call(c, v.fns.onDone, uint64(c.id))
	_, _ = v.call(c, v.fns.onDelete, uint64(c.id))
	if f := v.host.cfg.OnStreamDone; f != nil {
		f(c.accessEntry(v.index))
	}
	delete(v.contexts, c.id)
	c.parent.streams--
	if c.parent.retired && c.parent.streams == 0 && c.parent.drained != nil {
		close(c.parent.drained)
		c.parent.drained = nil
	}
}

// wait blocks (without v.mu) until the filter resumes the stream, sends a local reply,
// resets it, the client goes away or the idle timeout passes. It reports whether the
// timeout fired. The caller holds v.mu; it is held again on return.
func (v *vm) wait(ctx context.Context, c *pctx) (timedOut bool) {
	v.host.stats.paused.Add(1)
	timer := time.NewTimer(v.host.cfg.StreamIdleTimeout)
	defer timer.Stop()
	v.mu.Unlock()
	select {
	case <-c.resume:
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
		v.mu.Lock()
		c.reset = true
		return false
	}
	v.mu.Lock()
	return timedOut
}

// drain forgets a pending wake-up (a continue sent during a callback that then
// returned Continue anyway).
func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// failedResponse is Envoy's answer when the VM is gone and the plugin is not
// fail-open: 503 with details wasm_fail_stream.
func failedResponse() *Response {
	return &Response{Status: 503, Local: true, Details: "wasm_fail_stream"}
}

// serve runs one request through the filter on this VM, the life of one HTTP stream in
// Envoy's filter chain. With allowPause false (Exchange) a paused stream is reset and
// errPaused returned instead of waiting.
func (v *vm) serve(ctx context.Context, req *Request, upstream Upstream, allowPause bool) (*Response, error) {
	h := v.host
	h.stats.requests.Add(1)
	v.mu.Lock()
	if v.failed != nil {
		v.mu.Unlock()
		return v.failedAnswer(ctx, req, upstream), nil
	}
	c, err := v.newStream(req)
	if err != nil {
		return v.abandon(ctx, c, req, upstream), nil
	}
	var pauseErr error

	// Request headers.
	c.reqMap = newHeaderMap(RequestPairs(req))
	c.reqOpen = true
	stop, err := v.callFilter(c, v.fns.onRequestHeaders, uint64(len(c.reqMap.pairs)), boolArg(len(req.Body) == 0))
	if err == nil && stop && c.local == nil && !c.reset {
		if !allowPause {
			c.reset, pauseErr = true, errPaused
		} else if v.wait(ctx, c) && c.local == nil && !c.reset {
			// Envoy's stream idle timeout answers a request paused for too long.
			h.stats.pauseTimeouts.Add(1)
			v.sendLocal(c, &localReply{status: 408, details: "stream_idle_timeout", body: []byte("stream timeout")})
		}
	}
	drain(c.resume)
	c.reqOpen = false
	if v.failed != nil {
		return v.abandon(ctx, c, req, upstream), nil
	}

	// Request body, in one chunk. The filter may read it or answer locally.
	if c.local == nil && !c.reset && len(req.Body) > 0 && v.fns.onRequestBody != nil {
		c.body, c.bodyType = req.Body, bufRequestBody
		_, _ = v.callFilter(c, v.fns.onRequestBody, uint64(len(req.Body)), 1)
		c.body = nil
		drain(c.resume)
		if v.failed != nil {
			return v.abandon(ctx, c, req, upstream), nil
		}
	}

	// Upstream, or the local reply, without holding the VM.
	var resp *Response
	var respMap *headerMap
	switch {
	case c.reset:
		resp = &Response{Reset: true}
	case c.local != nil:
		resp = &Response{Local: true, Details: c.local.details, Body: c.local.sentBody()}
		respMap = localResponsePairs(c.local)
	default:
		up := upstreamRequest(req, c.reqMap)
		v.mu.Unlock()
		resp = v.callUpstream(ctx, up, upstream)
		v.mu.Lock()
		if v.failed != nil {
			return v.abandon(ctx, c, req, upstream), nil
		}
		respMap = newHeaderMap(ResponseHeaderPairs(resp))
	}

	// Response headers: Envoy runs the encoder filters for upstream responses and for
	// local replies alike, including the filter that sent the reply.
	if respMap != nil {
		c.phase = phaseResponse
		c.respMap = respMap
		c.respOpen = true
		localBefore := c.local
		stop, err = v.callFilter(c, v.fns.onResponseHead, uint64(len(respMap.pairs)), boolArg(len(resp.Body) == 0))
		if err == nil && stop && c.local == localBefore && !c.reset {
			if !allowPause {
				c.reset, pauseErr = true, errPaused
			} else if v.wait(ctx, c) {
				h.stats.pauseTimeouts.Add(1)
				h.log(v, LogWarn, fmt.Sprintf("stream %d: response paused longer than %s; sending it as it is", c.id, h.cfg.StreamIdleTimeout))
			}
		}
		drain(c.resume)
		c.respOpen = false
		if v.failed != nil {
			return v.abandon(ctx, c, req, upstream), nil
		}
		if c.local != localBefore {
			// The filter replaced the upstream response with a local reply.
			resp = &Response{Local: true, Details: c.local.details, Body: c.local.sentBody()}
			c.respMap = localResponsePairs(c.local)
		} else if len(resp.Body) > 0 && v.fns.onResponseBody != nil && !c.reset {
			// The body streams through in chunks, as Envoy delivers data frames: a filter
			// that continues sees each chunk once and never the whole body at once.
			chunk := h.cfg.bodyChunk()
			for off := 0; off < len(resp.Body) && !c.reset && v.failed == nil; off += chunk {
				end := min(off+chunk, len(resp.Body))
				c.body, c.bodyType = resp.Body[off:end], bufResponseBody
				_, _ = v.callFilter(c, v.fns.onResponseBody, uint64(end-off), boolArg(end == len(resp.Body)))
			}
			c.body = nil
			drain(c.resume)
			if v.failed != nil {
				return v.abandon(ctx, c, req, upstream), nil
			}
		}
		if c.reset {
			resp = &Response{Reset: true}
		} else {
			resp.Status, resp.Header = splitStatus(c.respMap.pairs, resp.Status)
		}
	}
	resp.Worker = v.index
	v.endStream(c)
	v.mu.Unlock()
	return resp, pauseErr
}

// abandon finishes a stream whose VM died during one of its callbacks: Envoy answers
// that stream 503 (wasm_fail_stream) whatever the failure policy — measured on Envoy
// 1.36.2 and 1.40.0 with FAIL_OPEN (e2e TestVMFailure): only the streams after it pass
// unfiltered — and never calls into the VM again. The caller holds v.mu; it is released.
func (v *vm) abandon(_ context.Context, c *pctx, _ *Request, _ Upstream) *Response {
	delete(v.contexts, c.id)
	c.parent.streams--
	v.mu.Unlock()
	resp := failedResponse()
	resp.Worker = v.index
	return resp
}

// failedAnswer answers a request whose VM has failed: unfiltered when fail-open, else
// Envoy's 503.
func (v *vm) failedAnswer(ctx context.Context, req *Request, upstream Upstream) *Response {
	var resp *Response
	if v.host.cfg.FailOpen {
		resp = v.callUpstream(ctx, req, upstream)
	} else {
		resp = failedResponse()
	}
	resp.Worker = v.index
	return resp
}

// callUpstream calls upstream with Envoy's default route timeout and turns failures
// into the router's local replies.
func (v *vm) callUpstream(ctx context.Context, req *Request, upstream Upstream) *Response {
	h := v.host
	if upstream == nil {
		return &Response{Status: 404, Local: true, Details: "route_not_found"}
	}
	uctx := ctx
	if h.cfg.UpstreamTimeout > 0 {
		var cancel context.CancelFunc
		uctx, cancel = context.WithTimeout(ctx, h.cfg.UpstreamTimeout)
		defer cancel()
	}
	resp, err := upstream(uctx, req)
	if err != nil || resp == nil {
		h.stats.upstreamErrors.Add(1)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(uctx.Err(), context.DeadlineExceeded) {
			return &Response{Status: 504, Local: true, Details: "upstream_response_timeout", Body: []byte(bodyUpstreamTimeout),
				Header: []Pair{{"content-type", "text/plain"}}}
		}
		return &Response{Status: 503, Local: true, Details: "upstream_reset_before_response_started{connection_failure}", Body: []byte(bodyConnectFailure),
			Header: []Pair{{"content-type", "text/plain"}}}
	}
	return resp
}

// ResponseHeaderPairs puts ":status" in front of a response's headers.
func ResponseHeaderPairs(r *Response) []Pair {
	out := make([]Pair, 0, len(r.Header)+2)
	out = append(out, Pair{":status", strconv.Itoa(r.Status)})
	for _, p := range r.Header {
		out = append(out, Pair{strings.ToLower(p[0]), p[1]})
	}
	if len(r.Body) > 0 && getPair(r.Header, "content-length") == "" {
		out = append(out, Pair{"content-length", strconv.Itoa(len(r.Body))})
	}
	return out
}

// splitStatus takes ":status" back out of a header list; a missing or malformed
// value keeps fallback.
func splitStatus(pairs []Pair, fallback int) (int, []Pair) {
	status := fallback
	out := make([]Pair, 0, len(pairs))
	for _, p := range pairs {
		if p[0] == ":status" {
			if n, err := strconv.Atoi(p[1]); err == nil {
				status = n
			}
			continue
		}
		out = append(out, p)
	}
	return status, out
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
