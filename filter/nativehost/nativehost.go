// Package nativehost runs the filter's logic (filter/plugin) natively, in process, with
// the host behaviour of Envoy that the logic depends on: several worker VMs sharing one
// shared-data store with Envoy's CAS rules (internal/shareddata), root and stream
// contexts, local replies, paused requests resumed later, callouts answered later, ticks,
// and metrics of one name shared by every worker. Time is a virtual clock the caller
// drives, and nothing runs on its own: the caller creates requests, fires ticks and
// answers callouts, so a test or a simulation decides the order of everything.
//
// It exists so that the plugin's decisions, headers and sync can be tested in
// milliseconds and simulated with thousands of gateways (bench/sim), while the tests of
// the compiled module (filter/*_test.go on internal/wazerohost) keep to what only the module shows:
// the ABI, start-up, memory. What it does not reproduce: the ABI itself (no memory
// copies, no host call costs), request and response bodies, trailers, properties beyond
// the ones given, and failures of host calls other than shared data's (Config.SharedFault).
package nativehost

import (
	"errors"
	"sort"

	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/internal/shareddata"
)

// Config configures a Host.
type Config struct {
	// Workers is the number of worker VMs (Envoy's --concurrency); default 1.
	Workers int
	// PluginConfig is the plugin configuration each worker starts with.
	PluginConfig []byte
	// Clock is the virtual time in µs (Unix); required.
	Clock func() int64
	// Properties answer proxy_get_property by path joined with "." ("node.id",
	// "node.metadata.NAME"); a request's own (Request.Properties) are looked up first.
	Properties map[string]string
	// Seed makes the workers' random numbers (their ids, jitter) replayable.
	Seed uint64
	// Shared, when set, is the shared data (default: a new store of this Host's own).
	Shared *shareddata.Store
	// Log receives the plugin's log lines (default: dropped).
	Log func(level plugin.LogLevel, msg string)
	// SharedFault, when set, is asked before every shared-data call: a non-nil error
	// fails the call with it (a host whose shared data is failing).
	SharedFault func(key string) error
	// OnDecided is called when a paused request is decided later (resumed, or answered
	// locally) — the moment the client's answer is known.
	OnDecided func(s *Stream)
	// Upstream answers the requests the filter lets through (default: 200, no headers,
	// no body).
	Upstream func(request [][2]string) Upstream
}

// Upstream is an upstream's response: its headers, its body in the chunks the filter
// receives it in, and whether the stream is reset after them (the body never ends).
type Upstream struct {
	Headers [][2]string
	Body    [][]byte
	Reset   bool
}

// Host is one gateway: its workers and their shared data.
type Host struct {
	cfg     Config
	shared  *shareddata.Store
	workers []*Worker
	metrics map[string]*metric
	byID    []*metric
	calls   []*Callout
	token   uint32
}

// Worker is one worker VM: a plugin instance with its root context.
type Worker struct {
	h       *Host
	index   int
	p       *plugin.Plugin
	cur     *Stream // the context host calls apply to (nil: the root)
	streams map[uint32]*Stream
	nextID  uint32
	tickMs  uint32
	// tickSets counts the plugin's calls to set the tick period (Envoy restarts the timer
	// at each, so a test can bound them).
	tickSets int
	// gen counts the restarts of this worker's VM (Restart): a new VM gets a new seed.
	gen uint64
	// sharedBuf holds the last shared-data value read (see adapter.SharedGet).
	sharedBuf []byte
}

// Stream is one request through one worker.
type Stream struct {
	ID     uint32
	Worker *Worker
	// Request is what the filter saw; Properties are this request's own.
	Request    [][2]string
	Properties map[string]string
	// Paused is set while the filter holds the request.
	Paused bool
	// Decided is set once the request is admitted (continued) or answered locally.
	Decided bool
	// Local is the local reply, if the filter sent one.
	Local *LocalReply
	// Response holds the headers the filter added to the upstream's response.
	Response [][2]string
	// FilterState holds what the filter set with proxy_set_property, by path (Envoy's
	// filter state "wasm.<path>").
	FilterState map[string]string
	// upstream is the response being filtered; chunk the body chunk being delivered.
	upstream Upstream
	chunk    []byte
	// Open is set while an admitted request opened with Host.Open waits for End or
	// Reset (its upstream has not answered).
	Open bool
	// Ended is set once the stream's end reached the filter (OnDone), or its VM was
	// restarted under it.
	Ended bool
	hold  bool
	s     *plugin.Stream
}

// Admitted reports whether the request went to the upstream.
func (s *Stream) Admitted() bool { return s.Decided && s.Local == nil }

// LocalReply is a response the filter sent itself.
type LocalReply struct {
	Status  uint32
	Details string
	Body    []byte
	Headers [][2]string
	// GRPCStatus is the gRPC status the filter asked for (-1: none).
	GRPCStatus int32
}

// Header returns the first value of a header of the answer the client got (the local
// reply's, or those the filter added to the upstream's response), or "".
func (s *Stream) Header(name string) string {
	h := s.Response
	if s.Local != nil {
		h = s.Local.Headers
	}
	for _, kv := range h {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// Status is the answer's status: the local reply's, or 200 for the upstream.
func (s *Stream) Status() uint32 {
	if s.Local != nil {
		return s.Local.Status
	}
	if s.Decided {
		return 200
	}
	return 0
}

// Callout is a proxy_http_call waiting for its answer.
type Callout struct {
	Token     uint32
	Worker    *Worker
	Cluster   string
	Headers   [][2]string
	Body      []byte
	TimeoutMs uint32
	SentUs    int64
	done      bool
}

// Header returns the first value of a callout request header.
func (c *Callout) Header(name string) string {
	for _, kv := range c.Headers {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// ErrRefused is returned by New when the plugin refuses its configuration.
var ErrRefused = errors.New("nativehost: the plugin refused its configuration")

// New starts cfg.Workers plugin instances with the configuration.
func New(cfg Config) (*Host, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Clock == nil {
		return nil, errors.New("nativehost: no clock")
	}
	h := &Host{cfg: cfg, shared: cfg.Shared, metrics: map[string]*metric{}}
	if h.shared == nil {
		h.shared = shareddata.New()
	}
	for i := 0; i < cfg.Workers; i++ {
		w := &Worker{h: h, index: i, streams: map[uint32]*Stream{}, nextID: 2}
		w.p = plugin.New(adapter{w})
		if !w.p.OnVMStart(nil) || !w.p.OnPluginStart(cfg.PluginConfig) {
			return nil, ErrRefused
		}
		h.workers = append(h.workers, w)
	}
	return h, nil
}

// Reconfigure gives every worker a new configuration (Envoy: a new root context); it
// reports false when the plugin refused it (then the previous one keeps serving).
func (h *Host) Reconfigure(cfg []byte) bool {
	ok := true
	for _, w := range h.workers {
		ok = w.p.OnPluginStart(cfg) && ok
	}
	return ok
}

// Workers returns the workers.
func (h *Host) Workers() []*Worker { return h.workers }

// Shared is the gateway's shared data.
func (h *Host) Shared() *shareddata.Store { return h.shared }

// Request runs one request on worker w through the filter: request headers, then — if
// the filter continues it — the upstream's 200 and the response headers, and the end of
// the stream. A paused request stays open until the filter decides it (a callout's
// answer); Config.OnDecided then tells.
func (h *Host) Request(w int, headers [][2]string, props map[string]string) *Stream {
	return h.request(w, headers, props, false)
}

// Open runs one request whose upstream answers later: as Request, but an admitted
// request stays open (Stream.Open) until End or Reset ends it, the life of a slow
// response or a long stream. A refused one ends at once, as in Request.
func (h *Host) Open(w int, headers [][2]string, props map[string]string) *Stream {
	return h.request(w, headers, props, true)
}

// End ends an open or paused stream as Envoy does when the response arrives, or when
// the router answers locally instead (an upstream timeout's 504, a connection failure's
// 503): the response headers run through the filter, then the end of the stream.
func (h *Host) End(s *Stream) {
	if s.Ended {
		return
	}
	s.hold = false
	s.Worker.finish(s)
}

// Reset ends an open or paused stream as Envoy does when the client (or the upstream)
// resets it: no response goes through the filter; the filter is destroyed, which runs
// the access log and the end of the stream (proxy_on_log, proxy_on_done).
func (h *Host) Reset(s *Stream) {
	if s.Ended {
		return
	}
	w := s.Worker
	s.Paused, s.Open, s.hold = false, false, false
	w.cur = s
	w.end(s)
}

// Restart replaces worker w's VM with a new one, as Envoy does when a VM traps: the old
// VM's streams end without reaching it (nothing it held is given back), its callouts'
// answers go nowhere, and the new VM, with a new seed, starts from the configuration
// and the shared data.
func (h *Host) Restart(w int) error {
	old := h.workers[w]
	nw := &Worker{h: h, index: w, streams: map[uint32]*Stream{}, nextID: old.nextID, gen: old.gen + 1}
	nw.p = plugin.New(adapter{nw})
	if !nw.p.OnVMStart(nil) || !nw.p.OnPluginStart(h.cfg.PluginConfig) {
		return ErrRefused
	}
	for _, s := range old.streams {
		s.Paused, s.Open, s.hold, s.Ended = false, false, false, true
	}
	for _, c := range h.calls {
		if c.Worker == old {
			c.done = true
		}
	}
	h.workers[w] = nw
	return nil
}

func (h *Host) request(w int, headers [][2]string, props map[string]string, hold bool) *Stream {
	wk := h.workers[w]
	s := &Stream{ID: wk.nextID, Worker: wk, Request: headers, Properties: props, hold: hold}
	wk.nextID += 2
	wk.streams[s.ID] = s
	s.s = wk.p.NewStream(s.ID)
	wk.cur = s
	act := s.s.OnRequestHeaders(len(headers), true)
	wk.cur = nil
	switch {
	case s.Local != nil:
		wk.finish(s)
	case act == plugin.Continue:
		wk.finish(s)
	default:
		s.Paused = true
	}
	return s
}

// finish completes a decided stream: response headers (the filter's own local reply
// runs through them too, as in Envoy), then the end of the stream.
func (w *Worker) finish(s *Stream) {
	s.Decided, s.Paused = true, false
	if s.hold && s.Local == nil {
		s.Open = true // admitted: the upstream answers when the caller says (End)
		return
	}
	s.Open = false
	w.cur = s
	if s.Local == nil && w.h.cfg.Upstream != nil {
		s.upstream = w.h.cfg.Upstream(s.Request)
	}
	body := s.upstream.Body
	s.s.OnResponseHeaders(len(s.upstream.Headers), len(body) == 0 && !s.upstream.Reset)
	for i, c := range body {
		s.chunk = c
		s.s.OnResponseBody(len(c), i == len(body)-1 && !s.upstream.Reset)
	}
	s.chunk = nil
	w.end(s)
}

// end runs the end of the current stream s (proxy_on_log, proxy_on_done) and forgets it.
func (w *Worker) end(s *Stream) {
	s.s.OnLog()
	s.s.OnDone()
	w.cur = nil
	s.Ended = true
	delete(w.streams, s.ID)
}

// Tick fires worker w's tick (whatever its period: the caller schedules them).
func (h *Host) Tick(w int) {
	wk := h.workers[w]
	wk.cur = nil
	wk.p.OnTick()
	h.settle(wk) // a tick may answer paused requests (the service was found down)
}

// TickPeriodMs is the period worker w asked for (0: none).
func (h *Host) TickPeriodMs(w int) uint32 { return h.workers[w].tickMs }

// TickPeriodSets is how many times worker w's plugin set its tick period.
func (h *Host) TickPeriodSets(w int) int { return h.workers[w].tickSets }

// Callouts returns the callouts waiting for an answer, in the order they were made.
func (h *Host) Callouts() []*Callout {
	out := h.calls[:0:0]
	for _, c := range h.calls {
		if !c.done {
			out = append(out, c)
		}
	}
	return out
}

// TakeCallouts returns the waiting callouts and forgets them (the caller must answer
// each).
func (h *Host) TakeCallouts() []*Callout {
	out := h.Callouts()
	h.calls = h.calls[:0]
	return out
}

// Respond delivers a callout's answer: Envoy calls the root context's
// proxy_on_http_call_response, whichever context made the call.
func (h *Host) Respond(c *Callout, headers [][2]string, body []byte) {
	if c.done {
		return
	}
	c.done = true
	w := c.Worker
	w.cur = nil
	w.p.OnHTTPCallResponse(c.Token, headers, body)
	w.cur = nil
	h.settle(w)
}

// Fail answers a callout as Envoy does when the connection fails (503) or the call
// times out (504): a response from the router, not an error.
func (h *Host) Fail(c *Callout, timeout bool) {
	if timeout {
		h.Respond(c, [][2]string{{":status", "504"}}, []byte("upstream request timeout"))
		return
	}
	h.Respond(c, [][2]string{{":status", "503"}}, []byte("upstream connect error or disconnect/reset before headers. reset reason: connection failure"))
}

// settle finishes the streams of w a callback decided.
func (h *Host) settle(w *Worker) {
	if len(w.streams) == 0 {
		return
	}
	var done []*Stream
	for _, s := range w.streams {
		if s.Paused && (s.Local != nil || s.Decided) {
			done = append(done, s)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].ID < done[j].ID })
	for _, s := range done {
		w.finish(s)
		if h.cfg.OnDecided != nil {
			h.cfg.OnDecided(s)
		}
	}
}

// Metrics returns every metric by name (counters and gauges summed over workers, as
// Envoy keeps one stat per name), after every worker handed over the counts it keeps
// between ticks (plugin.Plugin.FlushMetrics).
func (h *Host) Metrics() map[string]int64 {
	h.flushMetrics()
	out := make(map[string]int64, len(h.metrics))
	for name, m := range h.metrics {
		out[name] = m.value
	}
	return out
}

// Metric returns one metric's value (as Metrics does).
func (h *Host) Metric(name string) int64 {
	h.flushMetrics()
	if m := h.metrics[name]; m != nil {
		return m.value
	}
	return 0
}

func (h *Host) flushMetrics() {
	for _, w := range h.workers {
		if w.p != nil {
			w.p.FlushMetrics()
		}
	}
}

type metric struct {
	kind  plugin.MetricKind
	value int64
}
