package perf

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/llmapi"
)

// BenchmarkResponseCost compares, in interleaved rounds, the compiled filter on a request
// whose rule does not use cost_from with and without another rule using it ("x-other";
// target ≤ 1.10), and reports what following the response costs per format (ns). b.N
// is ignored: one comparison runs. The revision before response cost is built only by
// make bench.
func BenchmarkResponseCost(b *testing.B) {
	r, err := MeasureRespCost(wasmtest.BuildWasm(b, FilterPkg), nil, CostOptions{Rounds: 9, Round: 200 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.OtherRatio(), "x-other")
	for _, f := range llmapi.Formats {
		b.Logf("%-6s response: %8.0f ns plain, %8.0f ns with cost_from (+%.0f ns)", f, r.Plain[f].NsPerRequest, r.Charged[f].NsPerRequest, r.ParseNs(f))
	}
	b.ReportMetric(0, "ns/op")
}

// TestRespCostConfigsApply: every cost_from case charges what its response reports (the
// measured path is the charging one), and the others charge nothing from responses.
func TestRespCostConfigsApply(t *testing.T) {
	r, err := MeasureRespCost(wasmtest.BuildWasm(t, FilterPkg), nil, CostOptions{Rounds: 1, Round: time.Millisecond, CountedReqs: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range llmapi.Formats {
		// A request with cost_from reads its bucket twice: to decide, and to charge.
		if got := r.Charged[f].HostCalls["proxy_get_shared_data"]; got != 2 {
			t.Errorf("cost_from %s: %.2f shared-data reads per request, want 2 (decide and charge)", f, got)
		}
		if got := r.Plain[f].HostCalls["proxy_get_shared_data"]; got != 1 {
			t.Errorf("no cost_from, %s response: %.2f shared-data reads per request, want 1", f, got)
		}
	}
}
