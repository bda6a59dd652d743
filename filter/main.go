// Command filter is Tollgate's proxy-wasm HTTP filter. It is built as a WASI reactor
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared, then filter/wasmbuild links a
// WASI shim into it; make wasm does both): the host runs _initialize,
// which runs init below, and never calls main. All logic lives in filter/plugin; this
// file only adapts the ABI binding (filter/abi) to the plugin's Host interface.
package main

import (
	"errors"
	"math/rand/v2"

	"github.com/tollgate-rl/tollgate/filter/abi"
	"github.com/tollgate-rl/tollgate/filter/plugin"
)

// thePlugin is the worker VM's plugin (flush_wasip1.go reaches it from an export).
var thePlugin = plugin.New(&host{})

func init() {
	abi.SetRoot(root{thePlugin})
}

func main() {}

// root adapts *plugin.Plugin to abi.Root.
type root struct{ *plugin.Plugin }

func (r root) NewStream(id uint32) abi.Stream { return stream{r.Plugin.NewStream(id)} }

// OnHTTPCallResponse and OnTick pass through (probeCallback counts them in the soak's
// test build).
func (r root) OnHTTPCallResponse(token uint32, headers [][2]string, body []byte) {
	probeCallback(probeCalloutAnswered)
	r.Plugin.OnHTTPCallResponse(token, headers, body)
}

func (r root) OnTick() {
	probeCallback(probeTicked)
	r.Plugin.OnTick()
}

type stream struct{ *plugin.Stream }

func (s stream) OnRequestHeaders(n int, eos bool) abi.Action {
	probeHeadersStart(s.ID())
	act := abi.Action(s.Stream.OnRequestHeaders(n, eos))
	probeHeadersDone(s.ID(), act == abi.Pause)
	return act
}

func (s stream) OnDone() {
	probeDone(s.ID())
	s.Stream.OnDone()
}

func (s stream) OnResponseHeaders(n int, eos bool) abi.Action {
	return abi.Action(s.Stream.OnResponseHeaders(n, eos))
}

func (s stream) OnResponseBody(size int, eos bool) abi.Action {
	return abi.Action(s.Stream.OnResponseBody(size, eos))
}

// host implements plugin.Host with proxy-wasm host calls. Its methods have pointer
// receivers, and the ones a request calls are spelled out rather than promoted from
// abi.Host: a call through the plugin.Host interface then lands in the method itself,
// not in a compiler-generated wrapper that calls it (one function call less per host
// call, which compiled to wasm is worth saving on the request path).
type host struct{ abi.Host }

// Buffers the host calls of every request reuse (a VM is single threaded), as
// plugin.Host allows: request headers until the next request's are read, a shared-data
// value until the next one.
var (
	requestHeaders [][2]string
	sharedValue    []byte
)

func (h *host) RequestHeaders() ([][2]string, error) {
	probeRequest() // nothing, except in the garbage-collection soak's test build
	var err error
	requestHeaders, err = h.ReadRequestHeaders(requestHeaders[:0])
	return requestHeaders, err
}

func (h *host) AddResponseHeaders(pairs [][2]string) error {
	return h.AddHeaders(abi.MapResponseHeaders, pairs)
}

func (h *host) SendLocalReply(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	probeCallback(probeReplied)
	return h.Host.SendLocalReply(status, details, body, headers, grpcStatus)
}

func (h *host) SharedGet(key string) ([]byte, uint32, bool, error) {
	v, cas, err := h.AppendSharedData(sharedValue[:0], key)
	if errors.Is(err, abi.ErrNotFound) {
		return nil, 0, false, nil
	}
	sharedValue = v
	return v, cas, err == nil, err
}

func (h *host) SharedSet(key string, value []byte, cas uint32) (bool, error) {
	err := h.SetSharedData(key, value, cas)
	if errors.Is(err, abi.ErrCasMismatch) {
		return false, nil
	}
	return err == nil, err
}

func (h *host) Property(path ...string) ([]byte, error) { return h.GetProperty(path...) }

func (h *host) SetProperty(path string, value []byte) error { return h.Host.SetProperty(path, value) }
func (h *host) AppendProperty(dst []byte, path ...string) ([]byte, error) {
	return h.Host.AppendProperty(dst, path...)
}

func (h *host) HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, error) {
	probeCallback(probeCalloutSent)
	return h.DispatchHTTPCall(cluster, headers, body, nil, timeoutMs)
}

func (h *host) ResponseHeader(name string) (string, bool) {
	v, err := h.HeaderValue(abi.MapResponseHeaders, name)
	return v, err == nil
}

func (h *host) ResponseBody(start, max int) ([]byte, error) {
	return h.ReadBody(abi.BufferResponseBody, uint32(start), uint32(max))
}

func (h *host) ResumeRequest() error {
	probeCallback(probeResumed)
	return h.ResumeHTTPRequest()
}

func (h *host) SetEffectiveContext(id uint32) error {
	probeContext(id)
	return h.Host.SetEffectiveContext(id)
}

func (h *host) RootID() uint32 { return abi.RootContextID() }

func (h *host) Log(level plugin.LogLevel, msg string) { h.Host.Log(abi.LogLevel(level), msg) }

func (h *host) DefineMetric(kind plugin.MetricKind, name string) (uint32, error) {
	return h.Host.DefineMetric(abi.MetricType(kind), name)
}

func (h *host) IncrementMetric(id uint32, delta int64) { _ = h.Host.IncrementMetric(id, delta) }

func (h *host) RecordMetric(id uint32, value uint64) { _ = h.Host.RecordMetric(id, value) }

// NowUs reads the wall clock with one WASI clock_time_get (time.Now makes two;
// proxy_get_current_time_nanoseconds is missing from the SDK's emulator, and Envoy
// serves both from the same clock).
func (h *host) NowUs() int64 { return abi.NowUnixMicro() }

// Seed comes from the Go runtime's random source, which WASI's random_get seeds.
func (h *host) Seed() uint64 { return rand.Uint64() }
