//go:build wasip1 && tollgate_heapstats

package main

import "runtime"

// Test builds only (-tags tollgate_heapstats): the module's own allocation counter, so
// a test on the host can show the request path allocates nothing in steady state. The
// shipping module does not export it.

var memStats runtime.MemStats

// heapAllocs returns how many heap objects the Go runtime inside the module has
// allocated since it started (runtime.MemStats.Mallocs; reading it allocates nothing).
//
//go:wasmexport tollgate_heap_allocs
func heapAllocs() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.Mallocs
}

// gcCycles returns how many garbage collections the module's runtime has completed.
//
//go:wasmexport tollgate_gc_cycles
func gcCycles() uint32 {
	runtime.ReadMemStats(&memStats)
	return memStats.NumGC
}
