//go:build tollgate_gcprobe

package main

import (
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"strconv"

	"github.com/tollgate-rl/tollgate/filter/abi"
)

// gcMetrics reads the runtime's count of completed garbage collections and the memory
// it has mapped (in a wasm module, the linear memory it has grown to).
var gcMetrics = []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/memory/classes/total:bytes"}, {Name: "/gc/heap/live:bytes"}}

// garbage keeps the last allocation of testGC(2) reachable until the next one, so the
// allocator cannot skip it.
var garbage [][]byte

// testGC is built only with the tollgate_gcprobe tag, for the compatibility soaks
// (compat_test.go on the project's host, envoysoak_test.go in Envoy): with force 1 it
// forces a garbage collection; with force 2 it allocates 4 MiB in 1 KiB pieces, which
// lets the allocator start collections of its own with their background work (the
// steady-state request path allocates nothing, so without this a soak would see forced
// collections only); it returns the number of cycles completed so far, so the test can
// prove collections ran inside the VM while it served requests. The shipped module has
// no such export.
//
//go:wasmexport tollgate_test_gc
func testGC(force uint32) uint32 {
	switch force {
	case 1:
		runtime.GC()
	case 2:
		garbage = garbage[:0]
		for range 4096 {
			garbage = append(garbage, make([]byte, 1024))
		}
	}
	metrics.Read(gcMetrics)
	return uint32(gcMetrics[0].Value.Uint64())
}

// In a host that cannot call tollgate_test_gc (Envoy), the requests drive it: every
// probeGarbageEvery requests a VM serves it makes garbage (testGC(2)), every
// probeForceEvery it forces a collection (testGC(1)), the same rhythm as the soak on
// the project's host. What happened is published as Envoy stats, summed over the VMs:
// counters tollgate_test.gc_cycles (collections completed) and tollgate_test.gc_forced,
// and gauges per VM: tollgate_test.vm_<id>.memory_bytes (the memory the runtime has
// mapped, which a wasm module's linear memory only grows with) and
// tollgate_test.vm_<id>.heap_live_bytes (the live heap right after the last forced
// collection: what the module keeps, without the garbage's peaks).
const (
	probeGarbageEvery = 2_000
	probeForceEvery   = 20_000
)

var probe struct {
	requests           int
	cycles             uint32
	defined            bool
	cyclesID, forcedID uint32
	memoryID, liveID   uint32
}

// probeRequest runs as each request's headers are read (main.go's RequestHeaders).
func probeRequest() {
	h := abi.Host{}
	if !probe.defined {
		probe.defined = true
		probe.cyclesID, _ = h.DefineMetric(abi.MetricCounter, "tollgate_test.gc_cycles")
		probe.forcedID, _ = h.DefineMetric(abi.MetricCounter, "tollgate_test.gc_forced")
		vm := "tollgate_test.vm_" + strconv.FormatUint(uint64(rand.Uint32()), 16)
		probe.memoryID, _ = h.DefineMetric(abi.MetricGauge, vm+".memory_bytes")
		probe.liveID, _ = h.DefineMetric(abi.MetricGauge, vm+".heap_live_bytes")
		probe.cycles = testGC(0)
	}
	probe.requests++
	if probe.requests%probeGarbageEvery != 0 {
		return
	}
	if probe.requests%probeForceEvery == 0 {
		testGC(1)
		_ = h.IncrementMetric(probe.forcedID, 1)
		_ = h.RecordMetric(probe.liveID, gcMetrics[2].Value.Uint64())
	} else {
		testGC(2)
	}
	c := testGC(0)
	_ = h.IncrementMetric(probe.cyclesID, int64(c-probe.cycles))
	probe.cycles = c
	_ = h.RecordMetric(probe.memoryID, gcMetrics[1].Value.Uint64())
}

// The request-path trace: what the plugin asked of the host for held requests, as
// counters (tollgate_test.trace.*, summed over the VMs), so that a request the soak
// finds unanswered can be placed — still held by the plugin (held_at_done counts
// requests Envoy ended while the plugin still held them), or let go by the plugin and
// not continued by the host.
const (
	probeCalloutSent = iota
	probeCalloutAnswered
	probeTicked
	probeReplied
	probeResumed
	probeHeld       // the request's headers callback returned Pause without a reply
	probeHeldAtDone // ended while held: neither resumed nor answered
	probeLetGo      // a held request resumed or answered later
	probeKinds
)

var probeNames = [probeKinds]string{"callouts_sent", "callouts_answered", "ticks", "replies", "resumes", "held", "held_at_done", "let_go"}

var trace struct {
	ids            [probeKinds]uint32
	defined        bool
	cur            uint32 // the context the plugin's host calls apply to
	replies        int    // local replies sent so far
	repliesAtStart int
	held           map[uint32]bool // streams held and not yet let go
}

func probeCallback(kind int) {
	h := abi.Host{}
	if !trace.defined {
		trace.defined = true
		trace.held = map[uint32]bool{}
		for k, name := range probeNames {
			trace.ids[k], _ = h.DefineMetric(abi.MetricCounter, "tollgate_test.trace."+name)
		}
	}
	_ = h.IncrementMetric(trace.ids[kind], 1)
	if kind == probeReplied {
		trace.replies++
	}
	if (kind == probeReplied || kind == probeResumed) && trace.held[trace.cur] {
		delete(trace.held, trace.cur)
		_ = h.IncrementMetric(trace.ids[probeLetGo], 1)
	}
}

func probeContext(id uint32) { trace.cur = id }

// probeHeadersStart and probeHeadersDone run around a request's headers callback:
// paused tells whether it held the request (a reply sent within it also returns Pause).
func probeHeadersStart(id uint32) {
	trace.cur = id
	trace.repliesAtStart = trace.replies
}

func probeHeadersDone(id uint32, paused bool) {
	if !paused || trace.replies != trace.repliesAtStart {
		return
	}
	probeCallback(probeHeld)
	trace.held[id] = true
}

func probeDone(id uint32) {
	if trace.held[id] {
		delete(trace.held, id)
		probeCallback(probeHeldAtDone)
	}
}
