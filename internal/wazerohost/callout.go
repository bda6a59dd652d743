package wazerohost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// maxCalloutBody bounds a callout response body; a larger one is treated as a reset.
const maxCalloutBody = 64 << 20

// cluster is a named upstream for proxy_http_call, Envoy's cluster in miniature:
// static endpoints, round robin. As in Envoy, every worker has its own round-robin
// position (each worker thread builds its own load balancer): a worker's consecutive
// callouts go to consecutive endpoints whatever the other workers do.
type cluster struct {
	name      string
	endpoints []string
	next      []atomic.Uint64 // per worker
}

func (c *cluster) pick(worker int) string {
	if worker < 0 || worker >= len(c.next) {
		worker = 0
	}
	n := c.next[worker].Add(1) - 1
	return c.endpoints[n%uint64(len(c.endpoints))]
}

// callout is one proxy_http_call in flight.
type callout struct {
	token  uint32
	root   *pctx
	cancel context.CancelFunc
}

// calloutResult is what proxy_on_http_call_response can read. A nil result (a reset)
// leaves both maps and the body absent, as in Envoy's onHttpCallFailure.
type calloutResult struct {
	headers  []Pair // with ":status" first
	body     []byte
	trailers []Pair
}

// The bodies Envoy's router puts in the local replies the async client hands to the
// plugin as ordinary responses.
const (
	bodyUpstreamTimeout = "upstream request timeout"
	bodyConnectFailure  = "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
)

// nextCallToken mirrors Context::nextHttpCallToken: tokens count up from 1 per root
// context, skipping 0 and tokens still in flight.
func (root *pctx) nextCallToken() uint32 {
	for i := 0; i < 1<<20; i++ {
		t := root.nextToken
		root.nextToken++
		if t == 0 {
			continue
		}
		if _, used := root.calls[t]; !used {
			return t
		}
	}
	return 0
}

// httpCall starts proxy_http_call on behalf of root (Envoy always dispatches from the
// root context, whichever context called). The checks and their statuses follow
// Context::httpCall: a negative timeout, an unknown cluster or missing :path,
// :method or :authority are BadArgument. The caller holds v.mu.
func (v *vm) httpCall(root *pctx, clusterName string, headers []Pair, body []byte, trailers []Pair, timeoutMS int32) (uint32, Status) {
	h := v.host
	if timeoutMS < 0 {
		return 0, StatusBadArgument
	}
	cl, ok := h.clusters[clusterName]
	if !ok {
		h.log(v, LogDebug, fmt.Sprintf("proxy_http_call: unknown cluster %q", clusterName))
		return 0, StatusBadArgument
	}
	hm := newHeaderMap(headers)
	path, okPath := hm.get(":path")
	method, okMethod := hm.get(":method")
	authority, okAuth := hm.get(":authority")
	if !okPath || !okMethod || !okAuth {
		return 0, StatusBadArgument
	}
	if h.ctx.Err() != nil || v.index < 0 {
		// Closing host, or a configuration canary that is about to be thrown away.
		if v.index < 0 {
			token := root.nextCallToken()
			return token, StatusOK
		}
		return 0, StatusInternalFailure
	}
	token := root.nextCallToken()
	// Envoy: a timeout of 0 means none; the host's lifetime still bounds the call.
	ctx, cancel := context.WithCancel(h.ctx)
	if timeoutMS > 0 {
		cancel()
		ctx, cancel = context.WithTimeout(h.ctx, time.Duration(timeoutMS)*time.Millisecond)
	}
	c := &callout{token: token, root: root, cancel: cancel}
	root.calls[token] = c
	h.stats.callouts.Add(1)
	req := calloutRequest{method: method, path: path, authority: authority, headers: hm.pairs, body: body, trailers: trailers}
	h.bg.Add(1)
	go v.runCallout(ctx, c, cl, req)
	return token, StatusOK
}

type calloutRequest struct {
	method, path, authority string
	headers                 []Pair
	body                    []byte
	trailers                []Pair
}

// runCallout performs the HTTP request and hands the outcome to the VM. Following
// Envoy's async client, a timeout before the response headers arrives as a 504
// response and a connection failure as a 503 (the router's local replies); only a
// failure after the headers (or with Config.CalloutFailuresAsReset, any failure) is a
// reset, delivered as 0 headers, 0 body, 0 trailers.
func (v *vm) runCallout(ctx context.Context, c *callout, cl *cluster, r calloutRequest) {
	h := v.host
	defer h.bg.Done()
	defer c.cancel()
	endpoint := cl.pick(v.index)
	req, err := http.NewRequestWithContext(ctx, r.method, "http://"+endpoint+r.path, bytes.NewReader(r.body))
	if err != nil {
		h.logAt(v.index, c.root.id, LogWarn, fmt.Sprintf("proxy_http_call to %q: %v", cl.name, err))
		v.deliver(c, nil)
		return
	}
	req.Host = r.authority
	for _, p := range r.headers {
		if strings.HasPrefix(p[0], ":") || p[0] == "content-length" || p[0] == "host" {
			continue
		}
		req.Header.Add(p[0], p[1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if h.ctx.Err() != nil || errors.Is(ctx.Err(), context.Canceled) {
			return // cancelled with its root context or the host: no callback, as in Envoy
		}
		h.stats.calloutFailures.Add(1)
		if h.cfg.CalloutFailuresAsReset {
			v.deliver(c, nil)
			return
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			v.deliver(c, localResult(504, bodyUpstreamTimeout))
			return
		}
		v.deliver(c, localResult(503, bodyConnectFailure))
		return
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCalloutBody+1))
	resp.Body.Close()
	if err != nil || len(body) > maxCalloutBody {
		if h.ctx.Err() != nil || errors.Is(ctx.Err(), context.Canceled) {
			return
		}
		h.stats.calloutFailures.Add(1)
		v.deliver(c, nil)
		return
	}
	res := &calloutResult{headers: responsePairs(resp.StatusCode, resp.Header), body: body}
	if len(resp.Trailer) > 0 {
		res.trailers = headerPairs(resp.Trailer)
	}
	v.deliver(c, res)
}

// localResult builds the response Envoy's router would synthesise.
func localResult(status int, body string) *calloutResult {
	return &calloutResult{
		headers: []Pair{
			{":status", strconv.Itoa(status)},
			{"content-length", strconv.Itoa(len(body))},
			{"content-type", "text/plain"},
		},
		body: []byte(body),
	}
}

// deliver runs proxy_on_http_call_response on the callout's root context, unless the
// call was cancelled meanwhile (root context deleted, host closed).
func (v *vm) deliver(c *callout, res *calloutResult) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if cur, ok := c.root.calls[c.token]; !ok || cur != c {
		return
	}
	delete(c.root.calls, c.token)
	if v.failed != nil || v.host.ctx.Err() != nil {
		return
	}
	root := c.root
	var nh, nb, nt int
	if res != nil {
		nh, nb, nt = len(res.headers), len(res.body), len(res.trailers)
		root.callResp = res
		root.callStatus, root.callStatusMsg = 0, ""
	} else {
		root.callResp = nil
		root.callStatus, root.callStatusMsg = uint32(StatusBrokenConnection), "reset"
	}
	_, _ = v.call(root, v.fns.onHTTPCallResp, uint64(root.id), uint64(c.token), uint64(nh), uint64(nb), uint64(nt))
	root.callResp = nil
	root.callStatusMsg = ""
}

// responsePairs turns a status and net/http headers into an Envoy-style header list:
// ":status" first, then lower-case names in sorted order (net/http loses the wire
// order), one entry per value.
func responsePairs(status int, hdr http.Header) []Pair {
	out := make([]Pair, 0, len(hdr)+1)
	out = append(out, Pair{":status", strconv.Itoa(status)})
	return append(out, headerPairs(hdr)...)
}

func headerPairs(hdr http.Header) []Pair {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]Pair, 0, len(keys))
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, val := range hdr[k] {
			out = append(out, Pair{lk, val})
		}
	}
	return out
}
