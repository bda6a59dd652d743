package perf

import (
	"time"

	"github.com/tollgate-rl/tollgate/bench/sim"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// SimScenario is one traffic shape of the fleet simulation.
type SimScenario struct {
	Name string
	Cfg  sim.Config
}

// SimKeys and SimDuration size every simulated run: 100 keys, 10 s of simulated time,
// token bucket 100/s (sim.DefaultParams), 2 workers per gateway, 1 ms + 1 ms latency.
const (
	SimKeys     = 100
	SimDuration = 10 * time.Second
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

// The mesh sweep (the bounds of RATIONALE.md §3 at mesh scale): MeshKeys callers behind
// 1 to 1,000 gateways, each caller through MeshSpread of them, a rule of MeshLimit per
// minute, most callers slow (MeshLoad of their limit rate) and MeshAdversarial of them at
// 10× their limit, for MeshDuration (two windows: the worst 1-minute window is measured).
const (
	MeshKeys        = 100_000
	MeshSpread      = 2
	MeshLimit       = 60
	MeshLoad        = 0.1
	MeshAdversarial = 0.001
	MeshDuration    = 120 * time.Second
)

// MeshConfig is the sweep's run for one fleet size. Each gateway's shared-data table
// holds twice the keys it sees (table_slots is sized to the key cardinality in a real
// deployment too: a table far smaller evicts live leases).
func MeshConfig(gateways int) sim.Config {
	spread := MeshSpread
	if gateways < spread {
		spread = 0
	}
	perGateway := MeshKeys
	if spread > 0 {
		perGateway = MeshKeys * spread / gateways
	}
	slots := 4096
	for slots < 2*perGateway {
		slots *= 2
	}
	return sim.Config{
		Seed: 1, Duration: MeshDuration, Gateways: gateways, Spread: spread, Keys: MeshKeys,
		Traffic: sim.Mixed, Load: MeshLoad, AdversarialShare: MeshAdversarial,
		Params:     algo.Params{Kind: algo.TokenBucket, Limit: MeshLimit, WindowUs: 60_000_000},
		TableSlots: slots, Service: lease.DefaultSyncConfig,
		// The leases alone bound the adversarial callers (penalties would only lower
		// what they get).
		NoPenalty: true,
	}
}

// SweepMesh runs MeshConfig for each fleet size.
func SweepMesh(gateways []int) []SimPoint {
	out := make([]SimPoint, 0, len(gateways))
	for _, g := range gateways {
		c := MeshConfig(g)
		out = append(out, SimPoint{Scenario: "mesh", Gateways: g, Interval: 100 * time.Millisecond, Result: sim.Run(c)})
	}
	return out
}
