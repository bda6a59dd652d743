//go:build tollgate_gcprobe

package main

import (
	"runtime"
	"runtime/metrics"
)

// gcCycles reads the runtime's count of completed garbage collections.
var gcCycles = []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}

// testGC is built only with the tollgate_gcprobe tag, for the compatibility soak
// (compat_test.go): it forces a garbage collection when force is non-zero and returns
// the number of cycles completed so far, so the test can prove collections ran inside
// the VM while it served requests. The shipped module has no such export.
//
//go:wasmexport tollgate_test_gc
func testGC(force uint32) uint32 {
	if force != 0 {
		runtime.GC()
	}
	metrics.Read(gcCycles)
	return uint32(gcCycles[0].Value.Uint64())
}
