//go:build tollgate_gcprobe

package main

import (
	"runtime"
	"runtime/metrics"
)

// gcCycles reads the runtime's count of completed garbage collections.
var gcCycles = []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}

// garbage keeps the last allocation of testGC(2) reachable until the next one, so the
// allocator cannot skip it.
var garbage [][]byte

// testGC is built only with the tollgate_gcprobe tag, for the compatibility soak
// (compat_test.go): with force 1 it forces a garbage collection; with force 2 it
// allocates 4 MiB in 1 KiB pieces, which lets the allocator start collections of its
// own with their background work (the steady-state request path allocates nothing, so
// without this a soak would see forced collections only); it returns the number of
// cycles completed so far, so the test can prove collections ran inside the VM while it
// served requests. The shipped module has no such export.
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
	metrics.Read(gcCycles)
	return uint32(gcCycles[0].Value.Uint64())
}
