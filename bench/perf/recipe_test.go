package perf

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// TestMeasureRecipe runs the comparison briefly and checks what it rests on: the three
// modules are different builds that make the same decision with the same host calls.
// The ratios it reports are logged; the report (make bench) measures them at full
// length.
func TestMeasureRecipe(t *testing.T) {
	c, err := MeasureRecipe(wasmtest.BuildWasm(t, FilterPkg), CostOptions{Rounds: 2, Round: 100 * time.Millisecond, CountedReqs: 2000})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shipped/unthreaded %.3f, shipped/unprofiled %.3f; bytes %d, %d, %d",
		c.ThreadRatio(), c.ProfileRatio(), c.ShippedBytes, c.UnthreadedBytes, c.UnprofiledBytes)
	if len(c.ThreadPairs) != 200 || len(c.ProfilePairs) != 200 {
		t.Errorf("%d and %d pairs, want 200", len(c.ThreadPairs), len(c.ProfilePairs))
	}
	if c.ShippedBytes == c.UnthreadedBytes || c.ShippedBytes == c.UnprofiledBytes || c.UnthreadedBytes == c.UnprofiledBytes {
		t.Errorf("the builds are not three different modules: %d, %d, %d bytes", c.ShippedBytes, c.UnthreadedBytes, c.UnprofiledBytes)
	}
	for _, v := range []Cost{c.Unthreaded, c.Unprofiled} {
		if v.Status != c.Shipped.Status || v.HostCallsPerRequest != c.Shipped.HostCallsPerRequest || v.AllocsPerRequest != c.Shipped.AllocsPerRequest {
			t.Errorf("%s: status %d, %.2f host calls, %.2f allocs; shipped %d, %.2f, %.2f", v.Module,
				v.Status, v.HostCallsPerRequest, v.AllocsPerRequest, c.Shipped.Status, c.Shipped.HostCallsPerRequest, c.Shipped.AllocsPerRequest)
		}
	}
}

// BenchmarkRecipe is the report's build-step comparison run alone:
//
//	go test -run '^$' -bench Recipe -benchtime 1x ./bench/perf
func BenchmarkRecipe(b *testing.B) {
	c, err := MeasureRecipe(wasmtest.BuildWasm(b, FilterPkg), CostOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("as shipped %.0f ns, not threaded %.0f ns, without the profile %.0f ns; paired: shipped/unthreaded %.3f, shipped/unprofiled %.3f",
		c.Shipped.NsPerRequest, c.Unthreaded.NsPerRequest, c.Unprofiled.NsPerRequest, c.ThreadRatio(), c.ProfileRatio())
	b.ReportMetric(c.ThreadRatio(), "x-unthreaded")
	b.ReportMetric(0, "ns/op")
}
