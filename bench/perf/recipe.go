package perf

import (
	"fmt"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// RecipeCost is what the steps of the filter's build after the Go toolchain's give on the
// project's host: the module as it ships beside the same source built without
// wasmbuild's Thread (every jump through Go's dispatch) and without the profile-guided
// build (filter/default.pgo), for the decision. EnvoyBuildCost judges the steps in
// Envoy.
type RecipeCost struct {
	Shipped, Unthreaded, Unprofiled Cost
	// ThreadPairs and ProfilePairs are shipped/variant time ratios of paired chunks
	// (PairRatios), sorted: below 1, the step makes the decision faster.
	ThreadPairs, ProfilePairs []float64
	// Module sizes in bytes.
	ShippedBytes, UnthreadedBytes, UnprofiledBytes int
}

// ThreadRatio and ProfileRatio are the medians of the pairs (0 when none).
func (c RecipeCost) ThreadRatio() float64  { return median(c.ThreadPairs) }
func (c RecipeCost) ProfileRatio() float64 { return median(c.ProfilePairs) }

// MeasureRecipe builds the variants of the filter and measures them with shipped (the
// module Build makes) on LocalConfig's token-bucket rule: MeasureCosts for the shipped,
// unthreaded and unprofiled modules, then o.Rounds × 100 paired chunks of shipped
// against each of the two.
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
	c.UnthreadedBytes, c.UnprofiledBytes = len(unthreaded), len(unprofiled)
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
