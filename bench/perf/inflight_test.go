package perf

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// BenchmarkInFlight compares, in interleaved rounds, the compiled filter deciding
// BenchRequest under a rate-limit rule with and without max_in_flight. The metric is the
// ratio ("x-without"). b.N is ignored: one comparison runs.
func BenchmarkInFlight(b *testing.B) {
	c, err := MeasureInFlightCost(wasmtest.BuildWasm(b, FilterPkg), CostOptions{Rounds: 15, Round: 200 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	for _, x := range []Cost{c.Off, c.On} {
		b.Logf("%-40s %8.0f ns/request  host calls %.2f  allocs %.2f", x.Module, x.NsPerRequest, x.HostCallsPerRequest, x.AllocsPerRequest)
	}
	b.ReportMetric(c.Ratio(), "x-without")
	b.ReportMetric(0, "ns/op")
}

// TestInFlightConfigsTakeASlot: the configuration with max_in_flight takes a slot per
// request and gives it back (a record read when taken and one when given back, beside
// the bucket's), and the other does not: a comparison of two equal configurations would
// measure nothing.
func TestInFlightConfigsTakeASlot(t *testing.T) {
	c, err := MeasureInFlightCost(wasmtest.BuildWasm(t, FilterPkg), CostOptions{Rounds: 1, Round: time.Millisecond, CountedReqs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		cost   Cost
		lo, hi float64 // shared-data reads per request (a liveness beat adds one a second)
	}{
		{c.Off, 1, 1},
		{c.On, 3, 3.1},
	} {
		if got := tt.cost.HostCalls["proxy_get_shared_data"]; got < tt.lo || got > tt.hi {
			t.Errorf("%s: %.3f shared-data reads per request, want %.1f..%.1f", tt.cost.Module, got, tt.lo, tt.hi)
		}
		if tt.cost.Status != 200 {
			t.Errorf("%s: status %d", tt.cost.Module, tt.cost.Status)
		}
	}
}
