package perf

import (
	"math/rand/v2"
	"time"
)

// Distribution is a key distribution of the Redis-cost measurement.
type Distribution struct {
	Name     string
	What     string // how keys are drawn, for the report
	KeySpace int
	Keys     func(*rand.Rand) func() int
}

// Distributions are three shapes of traffic: one hot key far above its limit,
// Zipf-distributed keys, and uniform keys from a space so large that nearly every
// request is a key the gateway has not seen (cold).
var Distributions = []Distribution{
	{Name: "hot key", What: "every request for one key", KeySpace: 1, Keys: Hot},
	{Name: "Zipf", What: "10,000 keys, Zipf s = 1.1 (key 0 takes ~10 % of requests)", KeySpace: 10_000, Keys: Zipf(10_000, 1.1)},
	{Name: "uniform cold", What: "uniform over 10,000,000 keys (almost every request a new key)", KeySpace: 10_000_000, Keys: Uniform(10_000_000)},
}

// RedisCost is the Redis work of one distribution, normalized per 1M requests.
type RedisCost struct {
	Dist                                   Distribution
	Load                                   LoadResult
	RoundTripsPer1M, CommandsPer1M         float64
	ScriptsPer1M, CPUSecPer1M, DeltasPer1M float64
	AdmittedPct                            float64
}

// Per1M scales n events over checks to 1M requests.
func Per1M(n float64, checks int64) float64 {
	if checks == 0 {
		return 0
	}
	return n * 1e6 / float64(checks)
}

// RunRedisCost drives the synced filter with d's keys (closed loop, as fast as the
// machine goes) and reports the Redis round trips (pipelines the service sent),
// commands (INFO total_commands_processed, commands inside scripts included), script
// calls and CPU, per 1M requests. The rule is a token bucket of limit/s per key.
func (s *Stack) RunRedisCost(d Distribution, o LoadOptions, limit int) (RedisCost, error) {
	o.KeySpace, o.Keys = d.KeySpace, d.Keys
	if o.Duration == 0 {
		o.Duration = 3 * time.Second
	}
	res, err := s.RunTollgate(o, "token_bucket", limit, true)
	if err != nil {
		return RedisCost{}, err
	}
	c := RedisCost{Dist: d, Load: res}
	c.RoundTripsPer1M = Per1M(float64(res.RoundTrips), res.Checks)
	c.CommandsPer1M = Per1M(float64(res.Redis.Commands), res.Checks)
	c.ScriptsPer1M = Per1M(float64(res.Redis.Scripts()), res.Checks)
	c.CPUSecPer1M = Per1M(res.Redis.CPU, res.Checks)
	c.DeltasPer1M = Per1M(float64(res.Metrics["tollgate.sync_deltas_sent"]), res.Checks)
	if res.Checks > 0 {
		c.AdmittedPct = 100 * float64(res.Admitted) / float64(res.Checks)
	}
	return c, nil
}
