package abi

import (
	"runtime"
	"strconv"
	"strings"
)

// Root is the plugin: the code behind the plugin (root) context. Register it with
// SetRoot from an init function; the module is a WASI reactor and main never runs.
//
// All root contexts the host creates in this VM (normally one per plugin
// configuration) share the one Root.
type Root interface {
	// OnVMStart receives the VM configuration (nil when empty). false fails the VM.
	OnVMStart(vmConfig []byte) bool
	// OnPluginStart receives the plugin configuration (nil when empty); it runs for
	// every proxy_on_configure, so also when the host reconfigures the plugin. false
	// tells the host the configuration was rejected.
	OnPluginStart(pluginConfig []byte) bool
	// OnTick runs every tick period (Host.SetTickPeriod).
	OnTick()
	// OnHTTPCallResponse delivers the answer to a call from Host.DispatchHTTPCall made
	// outside a stream, or from a stream that is gone or is not a CalloutStream.
	// headers is nil when the call failed (the host reports 0 headers: reset, timeout,
	// unknown cluster); body is nil when empty or unreadable.
	OnHTTPCallResponse(token uint32, headers [][2]string, body []byte)
	// NewStream returns the handler of a new HTTP stream, or nil to let the stream
	// pass untouched.
	NewStream(contextID uint32) Stream
}

// RootDeleter is optionally implemented by a Root that wants to know when the host is
// done with one of its root contexts (plugin removed or replaced): its proxy_on_done,
// after which the host deletes it.
type RootDeleter interface {
	OnDelete(rootContextID uint32)
}

// Stream handles one HTTP request/response pair. Host calls made during its callbacks
// apply to this stream.
type Stream interface {
	OnRequestHeaders(numHeaders int, endOfStream bool) Action
	OnResponseHeaders(numHeaders int, endOfStream bool) Action
	// OnLog is kept for handlers written against it; the binding does not export
	// proxy_on_log (no handler here needs the access-log phase, and the host would call
	// it on every request), so it is never called.
	OnLog()
	// OnDone runs when the host is done with the stream, and is the last callback it
	// gets: the binding forgets the stream as OnDone starts (see onDone).
	OnDone()
}

// BodyStream is optionally implemented by a Stream that reads the response body: each
// chunk of it arrives here as it streams through (size is the chunk's, read with
// Host.ReadBody(BufferResponseBody, ...); endOfStream marks the last).
type BodyStream interface {
	OnResponseBody(size int, endOfStream bool) Action
}

// CalloutStream is optionally implemented by a Stream that dispatches HTTP calls
// itself (a strict rule asking the service while the request is paused). The answer to
// a call dispatched during one of its callbacks comes back here, with the stream made
// the effective context so ResumeHTTPRequest and SendLocalReply apply to it.
type CalloutStream interface {
	OnHTTPCallResponse(token uint32, headers [][2]string, body []byte)
}

var (
	root    Root
	roots   = map[uint32]struct{}{}
	streams streamTable
	// callers maps a callout token to the stream that dispatched it.
	callers = map[uint32]uint32{}
	// newestRoot is the most recently created root context.
	newestRoot uint32
	// active is the context of the callback running now, for DispatchHTTPCall.
	active uint32
	// depth counts nested callbacks (a host call such as proxy_continue_stream may
	// run another callback synchronously).
	depth int
	// export names the callback entered last, for the log of a recovered panic.
	export string
)

// SetRoot registers the plugin. Call it from init(): hosts call proxy_on_context_create
// and proxy_on_vm_start right after _initialize.
func SetRoot(r Root) { root = r }

// Streams reports how many streams the binding tracks (for leak tests).
func Streams() int { return streams.n }

// enter opens every export; name is the export's, for the log of a panic.
func enter(name string) {
	export = name
	depth++
}

// leave closes every export, deferred without arguments (so the defer costs no
// closure). It recovers a panic as a last line of defence: a panic escaping an export
// traps the VM, and the host then fails every later request on that worker. The export returns its zero value (Continue, or "failed" for start-up
// callbacks, true for on_done) and the panic is logged at critical level. Panics are
// bugs, not an error channel; nothing in the binding or plugin raises them on purpose.
func leave() {
	if r := recover(); r != nil {
		logPanic(export, r)
	}
	depth--
	if depth <= 0 {
		depth = 0
		if len(pins) > 0 {
			unpinAll()
		}
	}
}

func logPanic(export string, r any) {
	msg := "panic"
	switch v := r.(type) {
	case error:
		msg = v.Error()
	case string:
		msg = v
	}
	Host{}.Log(LogCritical, "tollgate: recovered panic in "+export+": "+msg+" at "+panicSite())
}

// panicSite names the function, file and line that panicked: the first frame of the
// panicking stack outside the runtime (leave's recover runs on top of that stack). The
// module keeps the runtime's line tables so that this names the line.
func panicSite() string {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(4, pcs[:])]) // above panicSite, logPanic and leave
	for {
		f, more := frames.Next()
		if f.Function != "" && !strings.HasPrefix(f.Function, "runtime.") && !strings.HasPrefix(f.Function, "internal/") {
			return f.Function + " (" + f.File + ":" + strconv.Itoa(f.Line) + ")"
		}
		if !more {
			return "an unknown site"
		}
	}
}

func onContextCreate(id, parent uint32) {
	active = id
	if parent == 0 {
		roots[id] = struct{}{}
		newestRoot = id
		return
	}
	if root == nil {
		return
	}
	if s := root.NewStream(id); s != nil {
		streams.put(id, s)
	}
}

func onVMStart(rootID, size uint32) bool {
	active = rootID
	if root == nil {
		Host{}.Log(LogCritical, "tollgate: no root registered (abi.SetRoot missing in init)")
		return false
	}
	cfg, err := readBuffer(BufferVMConfig, size)
	if err != nil {
		Host{}.Log(LogCritical, "tollgate: reading VM configuration: "+err.Error())
		return false
	}
	return root.OnVMStart(cfg)
}

func onConfigure(rootID, size uint32) bool {
	active = rootID
	if root == nil {
		Host{}.Log(LogCritical, "tollgate: no root registered (abi.SetRoot missing in init)")
		return false
	}
	cfg, err := readBuffer(BufferPluginConfig, size)
	if err != nil {
		Host{}.Log(LogCritical, "tollgate: reading plugin configuration: "+err.Error())
		return false
	}
	return root.OnPluginStart(cfg)
}

func onTick(rootID uint32) {
	active = rootID
	if root != nil {
		root.OnTick()
	}
}

func onHTTPCallResponse(rootID, token, numHeaders, bodySize uint32) {
	active = rootID
	var headers [][2]string
	if numHeaders > 0 {
		// A failed read counts as a failed call: the handlers see no headers.
		headers, _ = getPairs(MapCallResponseHeaders, nil)
	}
	var body []byte
	if bodySize > 0 {
		body, _ = readBuffer(BufferCallResponseBody, bodySize)
	}
	if caller, ok := callers[token]; ok {
		delete(callers, token)
		if cs, ok := streams.get(caller).(CalloutStream); ok {
			if err := (Host{}).SetEffectiveContext(caller); err == nil {
				active = caller
				cs.OnHTTPCallResponse(token, headers, body)
				return
			}
		}
	}
	if root != nil {
		root.OnHTTPCallResponse(token, headers, body)
	}
}

func onRequestHeaders(id, numHeaders uint32, eos bool) Action {
	active = id
	if s := streams.get(id); s != nil {
		return s.OnRequestHeaders(int(numHeaders), eos)
	}
	return Continue
}

func onResponseHeaders(id, numHeaders uint32, eos bool) Action {
	active = id
	if s := streams.get(id); s != nil {
		return s.OnResponseHeaders(int(numHeaders), eos)
	}
	return Continue
}

func onResponseBody(id, size uint32, eos bool) Action {
	active = id
	if s, ok := streams.get(id).(BodyStream); ok {
		return s.OnResponseBody(int(size), eos)
	}
	return Continue
}

// onDone ends context id: the stream's OnDone, or the root's deletion. The binding
// forgets the context here rather than at proxy_on_delete, which it does not export:
// that saves the host a callback into the module on every request. Envoy calls
// proxy_on_done and proxy_on_delete back to back when it destroys a context
// (Context::onDestroy) and deletes a root context only after its proxy_on_done
// returned true (which this binding always returns), so nothing happens between the
// two that the context could still be asked about. The stream is forgotten before its
// OnDone runs, so a panic in OnDone cannot leave it tracked.
func onDone(id uint32) {
	active = id
	if s := streams.remove(id); s != nil {
		s.OnDone()
		return
	}
	if _, ok := roots[id]; ok {
		delete(roots, id)
		if d, ok := root.(RootDeleter); ok {
			d.OnDelete(id)
		}
	}
}
