package perf

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// BenchmarkMatchConditions compares, in interleaved rounds, the compiled filter deciding
// BenchRequest under a rule matching three conditions (host, path prefix, header exact)
// with the same rule matching its path prefix only. The metric is the ratio
// ("x-prefix"; target ≤ 1.15). b.N is ignored: one comparison runs.
func BenchmarkMatchConditions(b *testing.B) {
	m, err := MeasureMatchCost(wasmtest.BuildWasm(b, FilterPkg), CostOptions{Rounds: 15, Round: 200 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []Cost{m.Prefix, m.Three} {
		b.Logf("%-40s %8.0f ns/request  host calls %.2f  allocs %.2f", c.Module, c.NsPerRequest, c.HostCallsPerRequest, c.AllocsPerRequest)
	}
	b.ReportMetric(m.Ratio(), "x-prefix")
	b.ReportMetric(0, "ns/op")
}

// TestMatchConfigsSelectTheRequest: both configurations apply their rule to BenchRequest
// (a benchmark of a rule that does not match would measure nothing).
func TestMatchConfigsSelectTheRequest(t *testing.T) {
	m, err := MeasureMatchCost(wasmtest.BuildWasm(t, FilterPkg), CostOptions{Rounds: 1, Round: time.Millisecond, CountedReqs: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Cost{m.Prefix, m.Three} {
		// A decided request reads and writes its bucket: one shared-data read each.
		if c.HostCalls["proxy_get_shared_data"] != 1 {
			t.Errorf("%s: %.2f shared-data reads per request, want 1 (the rule applied)", c.Module, c.HostCalls["proxy_get_shared_data"])
		}
	}
}
