package wazerohost

// The ways a request reaches the filter: through the full HTTP path (Serve, Handle),
// synchronously with a fixed upstream answer (Exchange, for benchmarks), or by calling
// a worker's exports directly (CallOnVM).

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"

	"github.com/tetratelabs/wazero/api"
)

// Workers reports the number of worker VMs.
func (h *Host) Workers() int { return len(h.vms) }

// PickWorker maps a key (e.g. the downstream connection's address) to a worker, the way
// a connection stays on one Envoy worker for its lifetime.
func (h *Host) PickWorker(key string) int {
	f := fnv.New32a()
	_, _ = io.WriteString(f, key)
	return int(f.Sum32() % uint32(len(h.vms)))
}

// Handle runs req through the filter on the next worker (round robin) and the
// configured Upstream.
func (h *Host) Handle(req *Request) *Response {
	w := int((h.rr.Add(1) - 1) % uint64(len(h.vms)))
	return h.Serve(context.Background(), w, req)
}

// HandleOn is Handle on a chosen worker.
func (h *Host) HandleOn(worker int, req *Request) *Response {
	return h.Serve(context.Background(), worker, req)
}

// Serve runs req through the filter on worker and the configured Upstream. ctx is the
// downstream request's context: if it ends while the filter holds the request, the
// stream is reset. A paused request waits for proxy_continue_stream or a local reply
// (typically from proxy_on_http_call_response) up to Config.StreamIdleTimeout.
func (h *Host) Serve(ctx context.Context, worker int, req *Request) *Response {
	if worker < 0 || worker >= len(h.vms) {
		return &Response{Status: 500, Local: true, Details: fmt.Sprintf("no worker %d", worker)}
	}
	h.inflight.add()
	defer h.inflight.done()
	if h.closing.Load() {
		return &Response{Status: 503, Local: true, Details: "host_closed", Worker: worker}
	}
	// The request also ends when Close gives up waiting for it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(h.streamCtx, cancel)
	defer stop()
	resp, _ := h.vms[worker].serve(ctx, req, h.cfg.Upstream, true)
	return resp
}

// Exchange runs one request through the filter callbacks on worker synchronously,
// with upstream as the upstream's answer: proxy_on_context_create,
// proxy_on_request_headers, proxy_on_response_headers (and body callbacks when there
// are bodies), proxy_on_log, proxy_on_done, proxy_on_delete. No goroutine, timer or
// HTTP is involved, so it measures the filter and the ABI alone. A filter that pauses
// the stream gets it reset and Exchange returns an error.
func (h *Host) Exchange(worker int, req *Request, upstream *Response) (*Response, error) {
	return h.exchange(context.Background(), worker, req, upstream, false)
}

// ExchangeWait is Exchange for a filter that may pause a request (a strict rule, or an
// acquire when a bucket's lease is short): it waits for the filter to continue or answer
// it, as Serve does, with the static upstream answer.
func (h *Host) ExchangeWait(ctx context.Context, worker int, req *Request, upstream *Response) (*Response, error) {
	return h.exchange(ctx, worker, req, upstream, true)
}

// exchange is Exchange and ExchangeWait: wait says whether a paused stream is waited
// for (ExchangeWait) or reset (Exchange).
func (h *Host) exchange(ctx context.Context, worker int, req *Request, upstream *Response, wait bool) (*Response, error) {
	if worker < 0 || worker >= len(h.vms) {
		return nil, fmt.Errorf("host: no worker %d", worker)
	}
	h.inflight.add()
	defer h.inflight.done()
	if h.closing.Load() {
		return nil, errors.New("host: closed")
	}
	up := func(context.Context, *Request) (*Response, error) {
		r := *upstream
		return &r, nil
	}
	resp, err := h.vms[worker].serve(ctx, req, up, wait)
	if err != nil {
		return resp, fmt.Errorf("host: exchange on worker %d: %w", worker, err)
	}
	return resp, nil
}

// CallOnVM runs f with worker i's VM locked, for benchmarks and tests that call the
// module's exports directly. ctx must be passed to those calls: host functions find
// their VM through it, and they act on the worker's root context.
func (h *Host) CallOnVM(i int, f func(ctx context.Context, mod api.Module)) {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	prev := v.cur
	v.cur = v.root
	f(v.ctx, v.mod)
	v.cur = prev
}
