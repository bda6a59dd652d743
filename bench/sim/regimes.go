package sim

import (
	"time"

	"github.com/tollgate-rl/tollgate/shared/lease"
)

// RegimeGateways is the fleet of the regimes: 16 gateways × 2 workers.
// RegimeKeys and RegimeDuration size the regimes with 100 keys (token bucket 100/s,
// DefaultParams), as BENCHMARKS.md §8's sweeps.
const (
	RegimeGateways = 16
	RegimeKeys     = 100
	RegimeDuration = 10 * time.Second
)

// The realistic regime: RealisticKeys keys of Zipf popularity (exponent
// RealisticZipfS), the most popular at RealisticTopLoad × its limit, sessions of
// RealisticBurst requests within 200 ms, half the keys arriving during the
// RealisticDuration run, token bucket 100/s.
const (
	RealisticKeys     = 100_000
	RealisticZipfS    = 1.1
	RealisticTopLoad  = 2
	RealisticBurst    = 10
	RealisticNewKeys  = 0.5
	RealisticDuration = 60 * time.Second
)

// Target is one bound a regime's result is held to: Value of the result at most
// Bound (below it, when Strict).
type Target struct {
	What   string
	Value  func(Result) float64
	Bound  float64
	Strict bool
}

// Met reports whether r meets t.
func (t Target) Met(r Result) bool {
	v := t.Value(r)
	if r.Requests == 0 {
		return false
	}
	if t.Strict {
		return v < t.Bound
	}
	return v <= t.Bound
}

// Regime is one traffic shape the fleet is held to bounds in.
type Regime struct {
	Name    string
	What    string // the traffic, for the report
	Cfg     Config
	Targets []Target
	// OverLimit: the keys are offered more than their limit, so only over-admission is
	// held against the fleet (a perfect limiter would refuse as many requests).
	OverLimit bool
}

// RegimePoint is a regime and what its run measured.
type RegimePoint struct {
	Regime Regime
	Result Result
}

// Values of a result the targets read.
func calmFalsePct(r Result) float64 { return r.CalmFalsePct }
func overPct(r Result) float64      { return r.OverAdmissionPct }

// HeldPct is the share of requests the gateways held for the service's answer.
func HeldPct(r Result) float64 {
	if r.Requests == 0 {
		return 0
	}
	return 100 * float64(r.Waited) / float64(r.Requests)
}

// Regimes are the regimes of a 16-gateway fleet the lease protocol is held to
// (RATIONALE.md §3): clients at 90 % of their limit and bursty clients as BENCHMARKS.md §8
// simulates them (100 keys, token bucket 100/s, 10 s), the cold start of keys at 10×
// their limit and of keys hit by bursts of 4× their limit at once (without progressive
// penalties, so the leases alone bound them), and the realistic mix of a public API.
var Regimes = []Regime{
	{Name: "ninety", What: "100 keys, each Poisson at 90 % of its limit",
		Cfg:     Config{Traffic: Ninety, Keys: RegimeKeys, Duration: RegimeDuration},
		Targets: []Target{{What: "clients at 90 % of their limit falsely refused < 0.1 %", Value: calmFalsePct, Bound: 0.1, Strict: true}}},
	{Name: "bursty", What: "100 keys, each 200 ms on (Poisson at 4× its limit), 800 ms off",
		Cfg:     Config{Traffic: Bursty, Keys: RegimeKeys, Duration: RegimeDuration},
		Targets: []Target{{What: "bursty clients falsely refused < 2 %", Value: calmFalsePct, Bound: 2, Strict: true}}},
	{Name: "cold start 10x", What: "100 keys, each Poisson at 10× its limit from a cold start, no penalties",
		Cfg: Config{Traffic: Adversarial, Keys: RegimeKeys, Duration: RegimeDuration, NoPenalty: true}, OverLimit: true,
		Targets: []Target{{What: "cold start at 10× the limit: over-admission ≤ limit + 5 %", Value: overPct, Bound: 5}}},
	{Name: "cold bursts 4x", What: "100 keys, each a burst of 4× its capacity within 10 ms every second, the first on a cold key, no penalties",
		Cfg: Config{Traffic: Bursty, Keys: RegimeKeys, Duration: RegimeDuration, NoPenalty: true,
			BurstOn: 10 * time.Millisecond, BurstOff: 990 * time.Millisecond, Load: 4}, OverLimit: true,
		Targets: []Target{{What: "bursts of 4× the limit on cold keys: over-admission ≤ limit + 5 %", Value: overPct, Bound: 5}}},
	{Name: "realistic", What: "100,000 keys of Zipf popularity (s = 1.1, the first at 2× its limit), sessions of 10 requests within 200 ms, half the keys arriving during the 60 s",
		Cfg: Config{Traffic: Realistic, Keys: RealisticKeys, ZipfS: RealisticZipfS, Load: RealisticTopLoad,
			BurstSize: RealisticBurst, NewKeys: RealisticNewKeys, Duration: RealisticDuration, TableSlots: 1 << 15},
		Targets: []Target{
			{What: "keys within their limit falsely refused < 2 % (the bursty bound)", Value: calmFalsePct, Bound: 2, Strict: true},
			{What: "requests held for the service's answer ≤ 1 %", Value: HeldPct, Bound: 1},
			{What: "over-admission ≤ limit + 5 %", Value: overPct, Bound: 5},
		}},
}

// RunRegimes runs every regime of Regimes on RegimeGateways gateways, seed 1,
// the service's default lease settings.
func RunRegimes() []RegimePoint { return RunRegimesExplained(false) }

// RunRegimesExplained is RunRegimes with Config.Explain set to explain: each result
// also counts its held requests and false rejections by cause (Result.Why).
func RunRegimesExplained(explain bool) []RegimePoint {
	return RunRegimesWith(RegimeOptions{Explain: explain})
}

// RegimeOptions vary the regimes' runs: Explain and ColdFleet as in Config.
type RegimeOptions struct {
	Explain   bool
	ColdFleet bool
}

// RunRegimesWith is RunRegimes with o applied to every regime.
func RunRegimesWith(o RegimeOptions) []RegimePoint {
	out := make([]RegimePoint, 0, len(Regimes))
	for _, g := range Regimes {
		c := g.Cfg
		c.Seed, c.Gateways, c.Service, c.Explain, c.ColdFleet = 1, RegimeGateways, lease.DefaultSyncConfig, o.Explain, o.ColdFleet
		out = append(out, RegimePoint{Regime: g, Result: Run(c)})
	}
	return out
}
