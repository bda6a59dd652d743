package perf

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// BenchmarkDecisionRatio is the decision-cost comparison of `make bench` (MeasureCosts:
// interleaved rounds, the median of each module) for the floor module and the filter
// alone, quick enough to compare a change side by side:
//
//	go test -run '^$' -bench DecisionRatio -benchtime 1x ./bench/perf
//
// TOLLGATE_BASELINE_WASM names filter modules (paths, separated by commas) measured in
// the same rounds, e.g. a build of the previous commit. Each module reports its ns per
// request and its ratio to the floor ("x-floor"). TOLLGATE_RATIO_ROUNDS and
// TOLLGATE_RATIO_ROUND_MS change the rounds (default 15 of 200 ms); on a busy machine
// more, shorter rounds interleave the modules more finely. b.N is ignored: one
// comparison runs.
func BenchmarkDecisionRatio(b *testing.B) {
	mods := []CostModule{
		{Name: "floor", Wasm: wasmtest.BuildWasm(b, FloorPkg)},
		{Name: "filter", Wasm: wasmtest.BuildWasm(b, FilterPkg), Config: LocalConfig("token_bucket", 1_000_000)},
	}
	if env := os.Getenv("TOLLGATE_BASELINE_WASM"); env != "" {
		for _, path := range strings.Split(env, ",") {
			wasm, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			mods = append(mods, CostModule{Name: path, Wasm: wasm, Config: LocalConfig("token_bucket", 1_000_000)})
		}
	}
	o := CostOptions{Rounds: 15, Round: 200 * time.Millisecond}
	if n, err := strconv.Atoi(os.Getenv("TOLLGATE_RATIO_ROUNDS")); err == nil && n > 0 {
		o.Rounds = n
	}
	if ms, err := strconv.Atoi(os.Getenv("TOLLGATE_RATIO_ROUND_MS")); err == nil && ms > 0 {
		o.Round = time.Duration(ms) * time.Millisecond
	}
	costs, err := MeasureCosts(mods, o)
	if err != nil {
		b.Fatal(err)
	}
	floor := costs[0].NsPerRequest
	for _, c := range costs {
		b.Logf("%-28s %8.0f ns/request  %.2fx floor  host calls %.2f  allocs %.2f  %v",
			c.Module, c.NsPerRequest, c.NsPerRequest/floor, c.HostCallsPerRequest, c.AllocsPerRequest, c.HostCalls)
	}
	b.ReportMetric(costs[1].NsPerRequest/floor, "x-floor")
	b.ReportMetric(0, "ns/op")
}
