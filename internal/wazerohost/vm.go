package wazerohost

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// vmKey carries the *vm a host function serves in the context of every call into the
// module, so a host function finds its VM without a lookup table.
type vmKey struct{}

// guestFns are the module's exports the host calls. A nil entry is an optional callback
// the module does not export; like Envoy, the host then skips it.
type guestFns struct {
	malloc           api.Function
	onContextCreate  api.Function
	onVMStart        api.Function
	onConfigure      api.Function
	onTick           api.Function
	onRequestHeaders api.Function
	onRequestBody    api.Function
	onResponseHead   api.Function
	onResponseBody   api.Function
	onHTTPCallResp   api.Function
	onLog            api.Function
	onDone           api.Function
	onDelete         api.Function
	onQueueReady     api.Function
	// flushMetrics is Tollgate's tollgate_flush_metrics (not proxy-wasm): the counts
	// the filter keeps in the VM between its ticks, handed over before the host's
	// metrics are read (flushGuests).
	flushMetrics api.Function
}

// vm is one module instance: one Envoy worker thread's Wasm. A wasm instance is
// single-threaded, so mu serialises every call into it (requests, ticks, callout
// responses); all fields below mu are guarded by it.
type vm struct {
	host  *Host
	index int // worker index; -1 for a configuration canary
	mod   api.Module
	ctx   context.Context
	fns   guestFns

	mu       sync.Mutex
	failed   error // set when the module trapped; the VM takes no more calls
	starting bool  // inside _initialize: Config.WASI may restrict WASI calls
	contexts map[uint32]*pctx
	nextID   uint32
	root     *pctx // the active root (plugin) context
	metrics  *vmMetrics
	calls    map[string]int64 // host calls by name, when Config.CountHostCalls is set

	// State of the call in progress (see call).
	cur        *pctx
	effective  uint32
	stopNext   bool // proxy_send_local_response ran during this call
	stack      [8]uint64
	allocStack [1]uint64
	scratch    []byte

	tick tickState
}

// pctx is a context in the proxy-wasm sense: a root (plugin) context when parent is
// nil, else an HTTP stream context.
type pctx struct {
	id     uint32
	parent *pctx

	// Root contexts.
	pluginConfig  []byte
	configuring   bool // PLUGIN_CONFIGURATION is readable (inside proxy_on_configure)
	nextToken     uint32
	calls         map[uint32]*callout
	callResp      *calloutResult // the response being delivered to proxy_on_http_call_response
	callStatus    uint32         // proxy_get_status during that callback
	callStatusMsg string
	streams       int  // live stream contexts created under this root
	pendingDone   bool // proxy_on_done returned false; waiting for proxy_done
	doneCh        chan struct{}
	retired       bool          // replaced by Reconfigure or shutting down: takes no new streams or ticks
	finished      bool          // proxy_on_done has been called
	deleted       bool          // proxy_on_delete has been called
	drained       chan struct{} // closed when a retired root's last stream ends
	tickPeriod    time.Duration

	// Stream contexts.
	req      *Request
	phase    int        // phaseRequest, phaseResponse or phaseDone
	reqMap   *headerMap // request headers as the filter left them
	respMap  *headerMap // response headers (with ":status") once the response phase began
	reqOpen  bool       // request headers are accessible (Envoy nulls them once the request continues)
	respOpen bool
	logPhase bool   // inside proxy_on_log: both maps are readable, neither writable
	body     []byte // body readable in proxy_on_request_body / proxy_on_response_body
	bodyType int
	local    *localReply // the local response the filter sent, if any
	reset    bool        // proxy_close_stream was called
	resume   chan struct{}
	props    []prop // set with proxy_set_property (see setProp)
	prop1    [1]prop
}

// Stream phases.
const (
	phaseRequest = iota
	phaseResponse
	phaseDone
)

func (c *pctx) isRoot() bool { return c.parent == nil }

// rootOf returns the root context of c.
func (c *pctx) rootOf() *pctx {
	if c.parent == nil {
		return c
	}
	return c.parent
}

// localReply is what proxy_send_local_response asked for.
type localReply struct {
	status  int
	details string
	body    []byte
	headers []Pair
	// grpc: the request is a gRPC request, answered trailers-only (localResponsePairs);
	// grpcStatus is the status the filter asked for (-1: mapped from status, as Envoy
	// does).
	grpc       bool
	grpcStatus int
}

// sentBody is the body the client receives: none for a gRPC answer, whose message
// travels in grpc-message.
func (lr *localReply) sentBody() []byte {
	if lr.grpc {
		return nil
	}
	return lr.body
}

// errPaused reports that a direct Exchange found the filter paused the stream.
var errPaused = errors.New("filter paused the stream")

// allocID follows proxy-wasm-cpp-host's allocContextId: ids count up from 1, skip 0
// and ids still in use.
func (v *vm) allocID() uint32 {
	for i := 0; i < 1<<20; i++ {
		id := v.nextID
		v.nextID++
		if id == 0 {
			continue
		}
		if _, used := v.contexts[id]; !used {
			return id
		}
	}
	// Over a million live contexts in one VM is a leak; reuse 0 rather than loop.
	return 0
}

// active returns the context host calls act on: the one set with
// proxy_set_effective_context if it still exists, else the one the host called into.
func (v *vm) active() *pctx {
	if v.effective != 0 {
		if c, ok := v.contexts[v.effective]; ok {
			return c
		}
	}
	return v.cur
}

// call runs one callback on context c. The caller holds v.mu. Errors are traps: the
// VM is marked failed (Envoy fails the whole VM) and every later call returns the
// same error.
func (v *vm) call(c *pctx, fn api.Function, args ...uint64) (uint64, error) {
	if v.failed != nil {
		return 0, v.failed
	}
	if fn == nil {
		return 0, nil
	}
	prevCur, prevEff := v.cur, v.effective
	v.cur, v.effective = c, 0
	copy(v.stack[:], args)
	err := fn.CallWithStack(v.ctx, v.stack[:])
	v.cur, v.effective = prevCur, prevEff
	if err != nil {
		v.fail(fmt.Errorf("%s on context %d: %w", fn.Definition().Name(), c.id, err))
		return 0, v.failed
	}
	if len(fn.Definition().ResultTypes()) == 0 {
		return 0, nil
	}
	return v.stack[0], nil
}

// callFilter runs an HTTP filter callback and reports whether the stream stops there:
// a non-Continue action, or a local response sent during the call.
func (v *vm) callFilter(c *pctx, fn api.Function, a, b uint64) (stop bool, err error) {
	if fn == nil {
		return false, nil
	}
	v.stopNext = false
	r, err := v.call(c, fn, uint64(c.id), a, b)
	stop = r != actionContinue || v.stopNext
	v.stopNext = false
	return stop, err
}

func (v *vm) fail(err error) {
	if v.failed != nil {
		return
	}
	v.failed = err
	v.host.stats.vmFailures.Add(1)
	v.host.log(v, LogCritical, "wasm VM failed: "+err.Error())
}

// alloc asks the module for size bytes through proxy_on_memory_allocate (or malloc).
func (v *vm) alloc(size uint32) (uint32, bool) {
	if v.fns.malloc == nil {
		return 0, false
	}
	if v.calls != nil {
		v.calls["proxy_on_memory_allocate"]++
	}
	v.allocStack[0] = uint64(size)
	if err := v.fns.malloc.CallWithStack(v.ctx, v.allocStack[:]); err != nil {
		v.fail(fmt.Errorf("proxy_on_memory_allocate(%d): %w", size, err))
		return 0, false
	}
	ptr := uint32(v.allocStack[0])
	return ptr, ptr != 0
}

// copyOut mirrors WasmBase::copyToPointerSize: an empty value writes (0, 0) without
// allocating; anything else is copied into memory the module allocates, and the
// offset and size are written to the two return slots.
func (v *vm) copyOut(mod api.Module, data []byte, ptrPtr, sizePtr uint32) Status {
	var ptr uint32
	if len(data) > 0 {
		p, ok := v.alloc(uint32(len(data)))
		if !ok {
			return StatusInvalidMemoryAccess
		}
		if !mod.Memory().Write(p, data) {
			return StatusInvalidMemoryAccess
		}
		ptr = p
	}
	mem := mod.Memory()
	if !mem.WriteUint32Le(ptrPtr, ptr) || !mem.WriteUint32Le(sizePtr, uint32(len(data))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// newRoot creates a root context and runs proxy_on_context_create, proxy_on_vm_start
// and proxy_on_configure on it, the sequence of ContextBase::onStart and onConfigure.
// The caller holds v.mu.
func (v *vm) newRoot(pluginConfig []byte) (*pctx, error) {
	root := &pctx{
		pluginConfig: pluginConfig,
		nextToken:    1,
		calls:        make(map[uint32]*callout),
	}
	root.id = v.allocID()
	v.contexts[root.id] = root
	mark := v.host.logs.mark()
	prevTick := v.tick
	fail := func(what string, err error) (*pctx, error) {
		lines := joinLogs(v.host.logsOf(v, mark))
		v.dropRoot(root)
		if v.tick.root == root {
			// The refused root may have taken the timer; give it back.
			v.tick.root, v.tick.period = prevTick.root, prevTick.period
			signal(v.tick.wake)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w (plugin log: %s)", what, err, lines)
		}
		return nil, fmt.Errorf("%s returned false: the plugin refused its configuration (plugin log: %s)", what, lines)
	}
	if _, err := v.call(root, v.fns.onContextCreate, uint64(root.id), 0); err != nil {
		return fail("proxy_on_context_create", err)
	}
	if v.fns.onVMStart != nil {
		ok, err := v.call(root, v.fns.onVMStart, uint64(root.id), uint64(len(v.host.cfg.VMConfig)))
		if err != nil || ok == 0 {
			return fail("proxy_on_vm_start", err)
		}
	}
	if v.fns.onConfigure != nil {
		root.configuring = true
		ok, err := v.call(root, v.fns.onConfigure, uint64(root.id), uint64(len(pluginConfig)))
		root.configuring = false
		if err != nil || ok == 0 {
			return fail("proxy_on_configure", err)
		}
	}
	return root, nil
}

// dropRoot forgets a root context that never became active (its configuration was
// refused): Envoy destroys such a plugin without proxy_on_done.
func (v *vm) dropRoot(root *pctx) {
	delete(v.contexts, root.id)
	for token, c := range root.calls {
		c.cancel()
		delete(root.calls, token)
	}
}

// finishRoot runs proxy_on_done on a root context, waits (bounded) for proxy_done if
// the plugin asked for time, cancels its outstanding callouts and runs proxy_on_delete,
// as WasmBase::startShutdown does. The caller holds v.mu; it is released while waiting.
func (v *vm) finishRoot(root *pctx, wait time.Duration) {
	if root.finished {
		return
	}
	root.finished = true
	root.retired = true
	done, err := v.call(root, v.fns.onDone, uint64(root.id))
	if err == nil && v.fns.onDone != nil && done == 0 {
		root.pendingDone = true
		root.doneCh = make(chan struct{})
		ch := root.doneCh
		v.mu.Unlock()
		timedOut := false
		select {
		case <-ch:
		case <-time.After(wait):
			timedOut = true
		}
		v.mu.Lock()
		if timedOut && root.pendingDone {
			v.host.log(v, LogWarn, fmt.Sprintf("root context %d did not call proxy_done within %s; deleting it", root.id, wait))
		}
		root.pendingDone = false
	}
	for token, c := range root.calls {
		c.cancel()
		delete(root.calls, token)
	}
	// Envoy's timers live as long as the root context: they keep ticking while the
	// plugin finishes (it may flush from proxy_on_tick), and stop with its deletion.
	root.deleted = true
	if v.tick.root == root {
		v.setTick(root, 0)
	}
	_, _ = v.call(root, v.fns.onDelete, uint64(root.id))
	delete(v.contexts, root.id)
}
