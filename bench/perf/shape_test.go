package perf

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// BenchmarkShaping reports how evenly a shaped burst reaches the upstream (the rule
// spaces it 10 ms apart) and another caller's latency on the same worker while the
// burst is held, against none held. b.N is ignored: one measurement runs.
func BenchmarkShaping(b *testing.B) {
	r, err := MeasureShaping(wasmtest.BuildWasm(b, FilterPkg))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d through, %d refused; gaps mean %s p50 %s min %s max %s; another caller %s idle, %s while held",
		r.Through, r.Refused, r.GapMean, r.GapP50, r.GapMin, r.GapMax, r.OtherIdle, r.OtherHeld)
	b.ReportMetric(float64(r.GapMean.Microseconds())/1000, "ms-gap")
	b.ReportMetric(0, "ns/op")
}
