package perf

import (
	"fmt"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// RecipeCost is what the steps of the filter's build after the Go toolchain's give: the
// module as it ships beside the same source built without wasmbuild's Thread (every
// jump through Go's dispatch) and without the profile-guided build (filter/default.pgo),
// for the decision; and beside the module without Pack, for a VM's start.
type RecipeCost struct {
	Shipped, Unthreaded, Unprofiled Cost
	// ThreadPairs and ProfilePairs are shipped/variant time ratios of paired chunks
	// (PairRatios), sorted: below 1, the step makes the decision faster.
	ThreadPairs, ProfilePairs []float64
	// Module sizes in bytes.
	ShippedBytes, UnthreadedBytes, UnprofiledBytes, UnpackedBytes int
	// StartShipped and StartUnpacked are the medians of StartRuns starts of a VM
	// (wasmtest.StartTimes: instantiation and _initialize), taken in turns.
	StartShipped, StartUnpacked time.Duration
	StartRuns                   int
}

// ThreadRatio and ProfileRatio are the medians of the pairs (0 when none).
func (c RecipeCost) ThreadRatio() float64  { return median(c.ThreadPairs) }
func (c RecipeCost) ProfileRatio() float64 { return median(c.ProfilePairs) }

// MeasureRecipe builds the variants of the filter and measures them with shipped (the
// module Build makes) on LocalConfig's token-bucket rule: MeasureCosts for the shipped,
// unthreaded and unprofiled modules, then o.Rounds × 100 paired chunks of shipped
// against each of the two; and 5 × o.Rounds starts of the shipped and unpacked modules.
func MeasureRecipe(shipped []byte, o CostOptions) (RecipeCost, error) {
	o = o.withDefaults()
	c := RecipeCost{ShippedBytes: len(shipped)}
	unthreaded, err := wasmbuild.Recipe{NoThread: true}.Build(FilterPkg)
	if err != nil {
		return c, err
	}
	unprofiled, err := wasmbuild.Recipe{NoProfile: true}.Build(FilterPkg)
	if err != nil {
		return c, err
	}
	unpacked, err := wasmbuild.Recipe{NoPack: true}.Build(FilterPkg)
	if err != nil {
		return c, err
	}
	c.UnthreadedBytes, c.UnprofiledBytes, c.UnpackedBytes = len(unthreaded), len(unprofiled), len(unpacked)
	c.StartRuns = 5 * o.Rounds
	starts, err := wasmtest.StartTimes(c.StartRuns, shipped, unpacked)
	if err != nil {
		return c, fmt.Errorf("starts: %w", err)
	}
	c.StartShipped, c.StartUnpacked = starts[0][len(starts[0])/2], starts[1][len(starts[1])/2]
	config := LocalConfig("token_bucket", 1_000_000)
	costs, err := MeasureCosts([]CostModule{
		{Name: "filter as shipped", Wasm: shipped, Config: config},
		{Name: "filter, jumps not threaded", Wasm: unthreaded, Config: config},
		{Name: "filter, built without the profile", Wasm: unprofiled, Config: config},
	}, o)
	if err != nil {
		return c, err
	}
	c.Shipped, c.Unthreaded, c.Unprofiled = costs[0], costs[1], costs[2]
	if c.ThreadPairs, err = PairModules(unthreaded, shipped, config, c.Shipped.NsPerRequest, 100*o.Rounds); err != nil {
		return c, fmt.Errorf("threading pairs: %w", err)
	}
	if c.ProfilePairs, err = PairModules(unprofiled, shipped, config, c.Shipped.NsPerRequest, 100*o.Rounds); err != nil {
		return c, fmt.Errorf("profile pairs: %w", err)
	}
	return c, nil
}
