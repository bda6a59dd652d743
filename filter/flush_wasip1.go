//go:build wasip1

package main

// flushMetrics hands the counts the plugin keeps in the VM to the host at once
// (plugin.Plugin.FlushMetrics), instead of at the next tick. Envoy never calls it: its
// stats see the counts of the last tick (at most a tick late, RATIONALE.md). The
// project's wazero host (internal/wazerohost) calls it, when the module exports it, before it reads
// the metrics, so that its tests and its /stats see every request answered so far.
//
//go:wasmexport tollgate_flush_metrics
func flushMetrics() { thePlugin.FlushMetrics() }
