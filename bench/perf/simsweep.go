package perf

import (
	"time"

	"github.com/tollgate-rl/tollgate/bench/sim"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// SimScenario is one traffic shape of the fleet simulation.
type SimScenario struct {
	Name string
	Cfg  sim.Config
}

// SimKeys and SimDuration size every simulated run: 100 keys, 20 s of simulated time,
// token bucket 100/s (sim.DefaultParams), 2 workers per gateway, 1 ms + 1 ms latency.
const (
	SimKeys     = 100
	SimDuration = 20 * time.Second
)

// SimScenarios are the shapes the charts show: an adversarial client at 10× its limit
// without progressive penalties (so the leases alone bound over-admission), bursty
// clients (200 ms on, 800 ms off, 0.8× the limit on average) and clients at 90 % of their
// limit, both with penalties on as deployed.
var SimScenarios = []SimScenario{
	{Name: "adversarial 10x", Cfg: sim.Config{Traffic: sim.Adversarial, NoPenalty: true}},
	{Name: "bursty", Cfg: sim.Config{Traffic: sim.Bursty}},
	{Name: "ninety", Cfg: sim.Config{Traffic: sim.Ninety}},
}

// SimPoint is one simulated run.
type SimPoint struct {
	Scenario string
	Gateways int
	Interval time.Duration
	Result   sim.Result
}

func simRun(sc SimScenario, gateways int, interval time.Duration) SimPoint {
	c := sc.Cfg
	c.Seed = 1
	c.Keys = SimKeys
	c.Duration = SimDuration
	c.Gateways = gateways
	c.Interval = interval
	c.Service = lease.DefaultSyncConfig
	return SimPoint{Scenario: sc.Name, Gateways: gateways, Interval: interval, Result: sim.Run(c)}
}

// SweepGateways runs every scenario for each fleet size at a 100 ms sync interval.
func SweepGateways(gateways []int) []SimPoint {
	var out []SimPoint
	for _, sc := range SimScenarios {
		for _, g := range gateways {
			out = append(out, simRun(sc, g, 100*time.Millisecond))
		}
	}
	return out
}

// SweepInterval runs every scenario for each sync interval with 4 gateways.
func SweepInterval(intervals []time.Duration) []SimPoint {
	var out []SimPoint
	for _, sc := range SimScenarios {
		for _, iv := range intervals {
			out = append(out, simRun(sc, 4, iv))
		}
	}
	return out
}
