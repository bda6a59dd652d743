package abi

import "unsafe"

// Host-to-guest data transfer. A host call that returns data (headers, shared data,
// properties, buffers) calls proxy_on_memory_allocate, copies the data into the memory
// it gets back and writes that offset into a return slot. The Go GC cannot see an
// offset held by the host, so every buffer allocated for the host is pinned here until
// the host call returns and the binding adopts it (takeReturned). Anything still pinned
// after that (the host allocated but did not return it, e.g. it failed halfway) is
// unpinned at the same moment, and again when the outermost callback returns, so pins
// never outlive the call that made them: PinnedBuffers is 0 between callbacks.
//
// Data-returning host calls never re-enter the module except through
// proxy_on_memory_allocate, so at most one such call is in flight and one set of pins
// and return slots suffices; the module is single-threaded.

// maxAlloc bounds one allocation requested by the host. Larger requests get 0, which the
// spec defines as failure, instead of an out-of-memory crash of the whole VM.
const maxAlloc = 64 << 20

// maxScratch bounds the reusable scratch buffer.
const maxScratch = 4 << 10

// maxPairsBuf bounds the reusable header-map buffer (Envoy's default limit on request
// headers is 60 KiB).
const maxPairsBuf = 64 << 10

// maxBodyRead bounds one ReadBody: a larger body chunk is read in pieces, so the
// reusable body buffer never grows beyond it.
const maxBodyRead = 64 << 10

var (
	pins [][]byte

	// bodyBuf receives what ReadBody reads: the returned bytes alias it until the next
	// ReadBody, so following a streamed body costs no allocation once it has grown.
	bodyBuf   []byte
	bodyArmed bool

	// scratch is handed to the host instead of a fresh buffer when the caller will copy
	// the result out before the next host call (scratchArmed); it saves one allocation
	// per call on paths such as AppendSharedData.
	scratch      []byte
	scratchArmed bool

	// pairsBuf receives the header maps ReadRequestHeaders reads: the decoded strings
	// alias it until the next such read, so a request's headers cost no allocation once
	// it has grown. Maps above maxPairsBuf get a buffer of their own.
	pairsBuf   []byte
	pairsArmed bool

	// Return slots for host calls. Package variables rather than locals because a
	// pointer passed to a //go:wasmimport function escapes, which would move locals to
	// the heap on every call.
	retPtr  uint32
	retSize uint32
	retU32  uint32
	retU64  uint64
)

// PinnedBuffers reports how many buffers handed to the host are still pinned. It is 0
// whenever no callback is running; a leak test checks that after many requests.
func PinnedBuffers() int { return len(pins) }

// allocate implements proxy_on_memory_allocate. It returns nil (offset 0, failure in
// the spec) for requests above maxAlloc.
func allocate(size uint32) unsafe.Pointer {
	if size > maxAlloc {
		return nil
	}
	n := int(size)
	if n == 0 {
		// A zero-size request still needs a distinct, valid, non-zero offset.
		n = 1
	}
	if pairsArmed && n <= maxPairsBuf {
		pairsArmed = false
		if cap(pairsBuf) < n {
			pairsBuf = make([]byte, max(n, 2*cap(pairsBuf), 1<<10))
		}
		return unsafe.Pointer(unsafe.SliceData(pairsBuf))
	}
	if bodyArmed && n <= maxBodyRead {
		bodyArmed = false
		if cap(bodyBuf) < n {
			bodyBuf = make([]byte, max(n, 2*cap(bodyBuf), 4<<10))
		}
		return unsafe.Pointer(unsafe.SliceData(bodyBuf))
	}
	if scratchArmed && n <= maxScratch {
		scratchArmed = false
		if cap(scratch) < n {
			scratch = make([]byte, maxScratch)
		}
		return unsafe.Pointer(unsafe.SliceData(scratch))
	}
	buf := make([]byte, n)
	pins = append(pins, buf)
	return unsafe.Pointer(unsafe.SliceData(buf))
}

// resetReturn clears the return slots before a host call: some hosts return OK without
// writing them when there is no data (e.g. an empty buffer).
func resetReturn() {
	retPtr, retSize, retU32, retU64 = 0, 0, 0, 0
}

// takeReturned adopts the buffer the host returned through retPtr/retSize and unpins
// everything. inScratch reports that the bytes live in the scratch buffer and must be
// copied out before the next host call. ok is false when the host returned an offset
// this binding never allocated, which would mean a broken host.
func takeReturned() (buf []byte, inScratch, ok bool) {
	addr, size := retPtr, retSize
	scratchArmed, pairsArmed, bodyArmed = false, false, false
	defer unpinAll()
	if size == 0 {
		return nil, false, true
	}
	if bodyBuf != nil && addrOf(bodyBuf) == addr {
		if int(size) > cap(bodyBuf) {
			return nil, false, false
		}
		return bodyBuf[:size:size], false, true
	}
	if pairsBuf != nil && addrOf(pairsBuf) == addr {
		if int(size) > cap(pairsBuf) {
			return nil, false, false
		}
		return pairsBuf[:size:size], false, true
	}
	if scratch != nil && addrOf(scratch) == addr {
		if int(size) > cap(scratch) {
			return nil, false, false
		}
		return scratch[:size:size], true, true
	}
	for _, p := range pins {
		if addrOf(p) == addr {
			if int(size) > len(p) {
				return nil, false, false
			}
			return p[:size:size], false, true
		}
	}
	return nil, false, false
}

// takeOwned is takeReturned for callers that keep the bytes: a result that landed in
// the scratch buffer is copied out, so nothing returned to the plugin aliases scratch.
func takeOwned() (buf []byte, ok bool) {
	buf, inScratch, ok := takeReturned()
	if inScratch {
		buf = append([]byte(nil), buf...)
	}
	return buf, ok
}

// unpinAll drops every pin, keeping the slice's capacity so steady state allocates
// nothing here.
func unpinAll() {
	clear(pins)
	pins = pins[:0]
}

func addrOf(b []byte) uint32 {
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
