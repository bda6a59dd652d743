package wazerohost

// What a Host reports about itself: its own counters (Stats, exported as wasmhost_*),
// the host calls a module made, and each worker's state.

import (
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/internal/shareddata"
)

type hostStats struct {
	requests, localReplies, paused, pauseTimeouts, upstreamErrors atomic.Int64
	callouts, calloutFailures, ticks, vmFailures, reconfigures    atomic.Int64
	pollOneoff, startupRefused                                    atomic.Int64
}

// Stats is the host's own counters, exported next to the plugin's metrics with the
// prefix wasmhost_.
type Stats struct {
	Workers         int   `json:"workers"`
	Requests        int64 `json:"requests"`
	LocalReplies    int64 `json:"local_replies"`
	Paused          int64 `json:"paused"`
	PauseTimeouts   int64 `json:"pause_timeouts"`
	UpstreamErrors  int64 `json:"upstream_errors"`
	Callouts        int64 `json:"callouts"`
	CalloutFailures int64 `json:"callout_failures"`
	Ticks           int64 `json:"ticks"`
	VMFailures      int64 `json:"vm_failures"`
	Reconfigures    int64 `json:"reconfigures"`
	SharedDataKeys  int   `json:"shared_data_keys"`
	SharedDataBytes int   `json:"shared_data_bytes"`
	LogLines        int64 `json:"log_lines"`
	// PollOneoff counts poll_oneoff calls that reached the host (counted under
	// WASIEnvoy133, which answers them with ENOSYS); StartupRefused counts WASI calls
	// refused during _initialize (WASIEnvoy133, WASILegacy).
	PollOneoff     int64 `json:"poll_oneoff"`
	StartupRefused int64 `json:"startup_refused"`
}

// Stats returns the host's counters.
func (h *Host) Stats() Stats {
	return Stats{
		Workers:         len(h.vms),
		Requests:        h.stats.requests.Load(),
		LocalReplies:    h.stats.localReplies.Load(),
		Paused:          h.stats.paused.Load(),
		PauseTimeouts:   h.stats.pauseTimeouts.Load(),
		UpstreamErrors:  h.stats.upstreamErrors.Load(),
		Callouts:        h.stats.callouts.Load(),
		CalloutFailures: h.stats.calloutFailures.Load(),
		Ticks:           h.stats.ticks.Load(),
		VMFailures:      h.stats.vmFailures.Load(),
		Reconfigures:    h.stats.reconfigures.Load(),
		SharedDataKeys:  h.shared.Keys(),
		SharedDataBytes: h.shared.Bytes(),
		LogLines:        int64(h.logs.mark()),
		PollOneoff:      h.stats.pollOneoff.Load(),
		StartupRefused:  h.stats.startupRefused.Load(),
	}
}

// hostMetrics are the host's own counters as metrics.
func (h *Host) hostMetrics() []Metric {
	s := h.Stats()
	return []Metric{
		{Type: MetricCounter, Name: "wasmhost_requests_total", Value: s.Requests},
		{Type: MetricCounter, Name: "wasmhost_local_replies_total", Value: s.LocalReplies},
		{Type: MetricCounter, Name: "wasmhost_paused_total", Value: s.Paused},
		{Type: MetricCounter, Name: "wasmhost_pause_timeouts_total", Value: s.PauseTimeouts},
		{Type: MetricCounter, Name: "wasmhost_upstream_errors_total", Value: s.UpstreamErrors},
		{Type: MetricCounter, Name: "wasmhost_callouts_total", Value: s.Callouts},
		{Type: MetricCounter, Name: "wasmhost_callout_failures_total", Value: s.CalloutFailures},
		{Type: MetricCounter, Name: "wasmhost_ticks_total", Value: s.Ticks},
		{Type: MetricCounter, Name: "wasmhost_vm_failures_total", Value: s.VMFailures},
		{Type: MetricCounter, Name: "wasmhost_reconfigures_total", Value: s.Reconfigures},
		{Type: MetricGauge, Name: "wasmhost_workers", Value: int64(s.Workers)},
		{Type: MetricGauge, Name: "wasmhost_shared_data_keys", Value: int64(s.SharedDataKeys)},
		{Type: MetricGauge, Name: "wasmhost_shared_data_bytes", Value: int64(s.SharedDataBytes)},
	}
}

// HostCalls sums, over the workers, the host function calls by name and the
// allocations the host asked the module for ("proxy_on_memory_allocate"), when
// Config.CountHostCalls is set; otherwise it is empty.
func (h *Host) HostCalls() map[string]int64 {
	out := make(map[string]int64)
	for _, v := range h.vms {
		v.mu.Lock()
		for name, n := range v.calls {
			out[name] += n
		}
		v.mu.Unlock()
	}
	return out
}

// RootContextID reports the id of worker i's active root context (1 until the first
// Reconfigure).
func (h *Host) RootContextID(i int) uint32 {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.root.id
}

// TickPeriod reports worker i's current tick period.
func (h *Host) TickPeriod(i int) time.Duration {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.tick.period
}

// Failed reports why worker i's VM failed, or nil.
func (h *Host) Failed(i int) error {
	v := h.vms[i]
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.failed
}

// SharedData returns the store behind proxy_get_shared_data / proxy_set_shared_data.
func (h *Host) SharedData() *shareddata.Store { return h.shared }

// SharedDataKeys reports how many keys the shared store holds.
func (h *Host) SharedDataKeys() int { return h.shared.Keys() }

// SharedDataBytes reports the key and value bytes the shared store holds.
func (h *Host) SharedDataBytes() int { return h.shared.Bytes() }
