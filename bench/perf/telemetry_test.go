package perf

import (
	"math"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// TestMeasureTelemetry runs the side-by-side measurement briefly and checks what it
// rests on: both configurations admit every request, and telemetry on adds exactly one
// proxy_set_property (the decision metadata) per request, no increment_metric (the
// rule's allowed counter is counted in the VM and handed to the host on the tick) and no
// host→guest allocation. The time it reports is
// logged; the report (make bench) measures it at full length.
func TestMeasureTelemetry(t *testing.T) {
	wasm := wasmtest.BuildWasm(t, FilterPkg)
	c, err := MeasureTelemetry(wasm, CostOptions{Rounds: 3, Round: 100 * time.Millisecond, CountedReqs: 2000})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("telemetry off %.0f ns/request, on %.0f ns/request; paired chunks: %+.1f %%", c.Off.NsPerRequest, c.On.NsPerRequest, 100*c.Overhead())
	if len(c.PairRatios) != 300 {
		t.Errorf("%d pairs, want 300", len(c.PairRatios))
	}
	if c.Off.Status != 200 || c.On.Status != 200 {
		t.Fatalf("statuses %d and %d, want 200", c.Off.Status, c.On.Status)
	}
	for _, tt := range []struct {
		call string
		want float64
	}{
		{"proxy_set_property", 1},
		{"proxy_increment_metric", 0},
		{"proxy_on_memory_allocate", 0},
	} {
		// Per request a call is made or not; what a tick does (the counters handed to
		// Envoy, one call per stat that moved) is spread over the requests between ticks.
		// A tick inside the measured chunk beside a build loop added 0.0015
		// proxy_increment_metric per request: that is the tick's, not the request path's.
		if d := c.On.HostCalls[tt.call] - c.Off.HostCalls[tt.call]; math.Abs(d-tt.want) >= 0.01 {
			t.Errorf("telemetry adds %.2f %s per request, want %.0f (off %v, on %v)", d, tt.call, tt.want, c.Off.HostCalls, c.On.HostCalls)
		}
	}
}

// BenchmarkTelemetry is the decision cost with the telemetry off and on, under go test
// (as BenchmarkDecision).
func BenchmarkTelemetry(b *testing.B) {
	wasm := wasmtest.BuildWasm(b, FilterPkg)
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			h, err := wazerohost.New(wazerohost.Config{Wasm: wasm, PluginConfig: TelemetryConfig(on), Workers: 1, LogLevel: wazerohost.LogWarn})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			req := BenchRequest("k-bench")
			for range 1000 {
				if _, err := h.Exchange(0, req, UpstreamOK); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if resp, err := h.Exchange(0, req, UpstreamOK); err != nil || resp.Status != 200 {
					b.Fatalf("status %v, err %v", resp, err)
				}
			}
		})
	}
}
