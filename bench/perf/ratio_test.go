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
// the same rounds, e.g. a build of an earlier commit, and TOLLGATE_BASELINE_FLOOR_WASM
// the floor module built with them (their binding may differ): each module reports its
// ns per request and its ratio to its floor. The benchmark's metric is the current
// filter's ratio ("x-floor"). TOLLGATE_RATIO_ROUNDS and TOLLGATE_RATIO_ROUND_MS change
// the rounds (default 15 of 200 ms); on a busy machine more, shorter rounds interleave
// the modules more finely. TOLLGATE_RATIO_NATIVE=1 adds the filter's plugin code run
// natively (filter/nativehost) to the rounds. TOLLGATE_RATIO_PAIRS=N, with a baseline,
// also times N pairs of back-to-back chunks of the filter and the first baseline and
// reports the median ratio, which resolves a difference of a per cent or two. b.N is
// ignored: one comparison runs.
func BenchmarkDecisionRatio(b *testing.B) {
	config := LocalConfig("token_bucket", 1_000_000)
	mods := []CostModule{
		{Name: "floor", Wasm: wasmtest.BuildWasm(b, FloorPkg)},
		{Name: "filter", Wasm: wasmtest.BuildWasm(b, FilterPkg), Config: config},
	}
	if os.Getenv("TOLLGATE_RATIO_NATIVE") != "" {
		mods = append(mods, CostModule{Name: "filter natively", Config: config, Native: true})
	}
	read := func(path string) []byte {
		wasm, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		return wasm
	}
	baseFloor := 0 // index of the baselines' floor
	if path := os.Getenv("TOLLGATE_BASELINE_FLOOR_WASM"); path != "" {
		baseFloor = len(mods)
		mods = append(mods, CostModule{Name: path, Wasm: read(path)})
	}
	baselines := len(mods)
	if env := os.Getenv("TOLLGATE_BASELINE_WASM"); env != "" {
		for _, path := range strings.Split(env, ",") {
			mods = append(mods, CostModule{Name: path, Wasm: read(path), Config: config})
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
	for i, c := range costs {
		floor := costs[0].NsPerRequest
		if i >= baselines || (baseFloor > 0 && i == baseFloor) {
			floor = costs[baseFloor].NsPerRequest
		}
		b.Logf("%-28s %8.0f ns/request  %.2fx its floor  host calls %.2f  allocs %.2f  %v",
			c.Module, c.NsPerRequest, c.NsPerRequest/floor, c.HostCallsPerRequest, c.AllocsPerRequest, c.HostCalls)
	}
	if n, err := strconv.Atoi(os.Getenv("TOLLGATE_RATIO_PAIRS")); err == nil && n > 0 && len(mods) > baselines {
		// Paired chunks see a difference of a per cent or two that the rounds' medians
		// cannot: the current filter's time over the first baseline's, back to back.
		r, err := PairModules(mods[baselines].Wasm, mods[1].Wasm, config, costs[1].NsPerRequest, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("paired chunks, filter / %s: median %.3f (quartiles %.3f–%.3f, %d pairs)",
			mods[baselines].Name, r[len(r)/2], r[len(r)/4], r[3*len(r)/4], len(r))
	}
	b.ReportMetric(costs[1].NsPerRequest/costs[0].NsPerRequest, "x-floor")
	b.ReportMetric(0, "ns/op")
}
