package main

import (
	"fmt"
	"io"
	"log"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/bench/sim"
)

// pacedRegime is one per-key rate of the paced comparison: keys keys, each offered
// perKey requests/s, and the bound on Tollgate's Redis CPU per check as a share of
// redis_rate's. Fewer keys at the higher rates keep the load runnable on 2 cores:
// 500 requests/s in all at 0.05 per key, 5,000 at the others.
type pacedRegime struct {
	perKey float64
	keys   int
	bound  float64
}

var pacedRegimes = []pacedRegime{
	{perKey: 0.05, keys: 10_000, bound: 1.0 / 3},
	{perKey: 0.5, keys: 10_000, bound: 0.1},
	{perKey: 5, keys: 1_000, bound: 0.1},
	{perKey: 50, keys: 100, bound: 0.1},
}

// Bounds of the regimes that hold at every rate, and of the hot keys at their limit.
const (
	heldBoundPct  = 1.0                    // requests held for an acquire, % of checks
	addedP99Bound = time.Millisecond       // p99 over the pass-through's, same load
	hotLimitBound = 1.0 / 30               // Redis CPU per check, 100 keys at their limit
	pacedLimit    = loadLimit              // GCRA per key per second, never reached
	syncWarmup    = 12 * time.Second       // Tollgate's: longer than stale_ms (10 s)
	plainWarmup   = time.Second            // redis_rate's and the pass-through's
	pacedMeasured = 5 * time.Second        // every paced run
	hotWarmup     = 2 * time.Second        // the hot keys' closed-loop runs
	hotMeasured   = 5 * time.Second        //
	pacedSeed     = uint64(0x7265676d6573) // the same schedule for every limiter
)

// pacedRun is one regime's three runs on the same schedule.
type pacedRun struct {
	regime                    pacedRegime
	pass, tollgate, redisRate perf.PacedResult
}

// regimeRuns is what the regime sections measured; alone is set when they were
// measured without the rest of the report (-sections).
type regimeRuns struct {
	paced      []pacedRun
	hot, hotRR perf.LoadResult // 100 keys, closed loop, at their limit
	sim        []sim.RegimePoint
	alone      *aloneRun
}

// aloneRun is the provenance of sections measured on their own.
type aloneRun struct {
	started time.Time
	args    []string
	loadAvg string
}

// scaled is d as -scale measured it.
func (r *report) scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * r.scale) }

// cpuRatio is Tollgate's Redis CPU per check over redis_rate's in a regime.
func (p pacedRun) cpuRatio() float64 {
	return ratio(p.tollgate.RedisWholeCPUPerCheck(), p.redisRate.RedisWholeCPUPerCheck())
}

// addedP99 is a limiter's p99 over the pass-through's at the same load.
func (p pacedRun) addedP99(x perf.PacedResult) time.Duration { return x.P99 - p.pass.P99 }

// carried reports whether every run of the regime sent its whole schedule and got an
// answer to each request.
func (p pacedRun) carried() bool {
	for _, x := range []perf.PacedResult{p.pass, p.tollgate, p.redisRate} {
		if x.Checks == 0 || x.Dropped > 0 || x.Errors > 0 {
			return false
		}
	}
	return true
}

// measurePaced runs every paced regime (pass-through, redis_rate, Tollgate on the same
// schedule) and the hot keys at their limit.
func (rg *regimeRuns) measurePaced(st *perf.Stack, o options, logger *log.Logger) error {
	for _, pr := range pacedRegimes {
		// -regime-keys scales the key counts (and so the load) alike; the report
		// names the counts run.
		pr.keys = max(1, int(float64(pr.keys)*o.regimeKeys+0.5))
		run := pacedRun{regime: pr}
		for _, x := range []struct {
			name   string
			kind   perf.HTTPKind
			warmup time.Duration
			dst    *perf.PacedResult
		}{
			{"pass-through", perf.HTTPPassThrough, plainWarmup, &run.pass},
			{"redis_rate", perf.HTTPRedisRate, plainWarmup, &run.redisRate},
			{"tollgate", perf.HTTPTollgate, syncWarmup, &run.tollgate},
		} {
			logger.Printf("regimes: %g requests/s per key, %d keys: %s", pr.perKey, pr.keys, x.name)
			po := perf.PacedOptions{Keys: pr.keys, PerKey: pr.perKey, Warmup: o.dur(x.warmup), Duration: o.dur(pacedMeasured), Seed: pacedSeed}
			res, err := st.RunPaced(po, x.kind, pacedLimit)
			if err != nil {
				return fmt.Errorf("paced %g/s per key, %s: %w", pr.perKey, x.name, err)
			}
			*x.dst = res
		}
		rg.paced = append(rg.paced, run)
	}
	hot := perf.LoadOptions{KeySpace: hotKeys, Warmup: o.dur(hotWarmup), Duration: o.dur(hotMeasured)}
	var err error
	logger.Print("regimes: 100 hot keys closed loop: tollgate")
	if rg.hot, err = st.RunTollgate(hot, "gcra", loadLimit, true); err != nil {
		return fmt.Errorf("hot keys, tollgate: %w", err)
	}
	logger.Print("regimes: 100 hot keys closed loop: redis_rate")
	if rg.hotRR, err = st.RunRedisRate(hot, loadLimit); err != nil {
		return fmt.Errorf("hot keys, redis_rate: %w", err)
	}
	return nil
}

// measureSim runs the fleet simulation's regimes.
func (rg *regimeRuns) measureSim(logger *log.Logger) {
	logger.Printf("regimes: fleet simulation, %d gateways", sim.RegimeGateways)
	rg.sim = sim.RunRegimes()
}

// hotRatio is Tollgate's Redis CPU per check over redis_rate's, 100 keys closed loop.
func (rg *regimeRuns) hotRatio() float64 {
	return ratio(rg.hot.RedisWholeCPUPerCheck(), rg.hotRR.RedisWholeCPUPerCheck())
}

func fmtSignedDur(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

// Markers around each block the regime sections write, so that `-sections` can
// replace them in an existing report without regenerating the rest.
func blockBegin(name string) string { return "<!-- " + name + ":begin -->" }
func blockEnd(name string) string   { return "<!-- " + name + ":end -->" }

// block writes body between name's markers.
func block(w io.Writer, name string, body func(io.Writer) error) error {
	if _, err := io.WriteString(w, blockBegin(name)+"\n"); err != nil {
		return err
	}
	if err := body(w); err != nil {
		return err
	}
	_, err := io.WriteString(w, blockEnd(name)+"\n\n")
	return err
}

// Block names: the Targets table's rows of each section, and the sections.
const (
	blockPacedTargets = "targets-paced-regimes"
	blockSimTargets   = "targets-sim-regimes"
	blockPaced        = "paced-regimes"
	blockSim          = "sim-regimes"
)

// pacedTargetsView is the paced regimes' rows of the Targets table.
type pacedTargetsView struct {
	Regimes          []pacedTarget
	Held, P99        []regimeRate
	HeldMet, P99Met  bool
	HotKeys          int
	HotBound         float64
	HotRatio         float64
	HotCPU, HotRRCPU float64 // Redis CPU µs per check
	HotLoadPct       float64 // each hot key's load, % of its limit
	HotMet           bool
}

// pacedTarget is one regime's Redis CPU target.
type pacedTarget struct {
	Keys                   int
	PerKey, Bound          float64
	Ratio, TgCPU, RrCPU    float64
	Carried                bool
	PassErrors, RrErrors   int64
	TgErrors               int64
	PassDropped, RrDropped int64
	TgDropped              int64
	Met                    bool
}

// regimeRate is a regime's held share or added p99.
type regimeRate struct {
	PerKey         float64
	HeldPct        float64
	Added, RRAdded time.Duration
}

func (rg *regimeRuns) pacedTargetsView() pacedTargetsView {
	v := pacedTargetsView{HeldMet: true, P99Met: true, HotKeys: hotKeys, HotBound: hotLimitBound}
	for _, p := range rg.paced {
		c := p.cpuRatio()
		v.Regimes = append(v.Regimes, pacedTarget{Keys: p.regime.keys, PerKey: p.regime.perKey, Bound: p.regime.bound,
			Ratio: c, TgCPU: p.tollgate.RedisWholeCPUPerCheck(), RrCPU: p.redisRate.RedisWholeCPUPerCheck(), Carried: p.carried(),
			PassErrors: p.pass.Errors, RrErrors: p.redisRate.Errors, TgErrors: p.tollgate.Errors,
			PassDropped: p.pass.Dropped, RrDropped: p.redisRate.Dropped, TgDropped: p.tollgate.Dropped,
			Met: p.carried() && c > 0 && c <= p.regime.bound})
		h := p.tollgate.HeldShare()
		a := p.addedP99(p.tollgate)
		v.Held = append(v.Held, regimeRate{PerKey: p.regime.perKey, HeldPct: h})
		v.P99 = append(v.P99, regimeRate{PerKey: p.regime.perKey, Added: a, RRAdded: p.addedP99(p.redisRate)})
		v.HeldMet = v.HeldMet && p.carried() && h <= heldBoundPct
		v.P99Met = v.P99Met && p.carried() && a <= addedP99Bound
	}
	v.HotRatio = rg.hotRatio()
	v.HotCPU, v.HotRRCPU = rg.hot.RedisWholeCPUPerCheck(), rg.hotRR.RedisWholeCPUPerCheck()
	v.HotLoadPct = keyLoadPct(rg.hot, hotKeys)
	v.HotMet = rg.hot.Checks > 0 && v.HotRatio > 0 && v.HotRatio <= hotLimitBound
	return v
}

// simTargetsView is the simulation regimes' rows of the Targets table.
type simTargetsView struct {
	Gateways int
	Rows     []simTarget
}

// simTarget is one target of one simulated regime.
type simTarget struct {
	Regime, What string
	Value        float64 // %
	Met          bool
}

func (rg *regimeRuns) simTargetsView() simTargetsView {
	v := simTargetsView{Gateways: sim.RegimeGateways}
	for _, p := range rg.sim {
		for _, t := range p.Regime.Targets {
			v.Rows = append(v.Rows, simTarget{p.Regime.Name, t.What, t.Value(p.Result), t.Met(p.Result)})
		}
	}
	return v
}

// writeRegimeTargets is the Targets section's part for the regimes: one table each.
func (r *report) writeRegimeTargets(w io.Writer) error {
	if err := r.writeRegimeTarget(w, blockPacedTargets); err != nil {
		return err
	}
	return r.writeRegimeTarget(w, blockSimTargets)
}

// writeRegimeTarget writes one of the regimes' Targets blocks.
func (r *report) writeRegimeTarget(w io.Writer, name string) error {
	switch name {
	case blockPacedTargets:
		return block(w, name, func(w io.Writer) error { return render(w, "pacedtargets", r.regimes.pacedTargetsView()) })
	case blockSimTargets:
		return block(w, name, func(w io.Writer) error { return render(w, "simtargets", r.regimes.simTargetsView()) })
	}
	return fmt.Errorf("no Targets block %q", name)
}

// aloneView is the provenance of sections measured on their own.
type aloneView struct {
	Command, Date, LoadAvg string
}

func (rg *regimeRuns) aloneView() *aloneView {
	a := rg.alone
	if a == nil {
		return nil
	}
	return &aloneView{strings.Join(a.args, " "), a.started.Format("2006-01-02 15:04 MST"), a.loadAvg}
}

// pacedView is section 10: the paced regimes and the hot keys at their limit.
type pacedView struct {
	Alone                             *aloneView
	Regimes                           []pacedRegimeView
	SyncWarmup, PlainWarmup, Measured time.Duration
	IdleMsPerSec                      float64
	Rows                              []pacedRow
	HotKeys                           int
	HotWarmup, HotMeasured            time.Duration
	HotTg, HotRR                      runRow
	HotHeldPct                        float64
	HotRatio, HotCPU, HotRRCPU        float64
	HotAcquires, HotDeltas            float64
	HotLoadPct                        float64
}

// pacedRegimeView is one regime's keys and load.
type pacedRegimeView struct {
	Keys            int
	PerKey, Offered float64
	CPURatio        float64 // Tollgate's Redis CPU per check over redis_rate's
}

// pacedRow is one limiter's run in one regime.
type pacedRow struct {
	PerKey                   float64
	Keys                     int
	Offered                  float64
	Limiter                  string
	ChecksPerSec             float64
	P50, P99                 time.Duration
	Limited                  bool // not the pass-through: added p99, held and Redis CPU per check
	Added                    time.Duration
	HeldPct, CPUPerCheck     float64
	RoundTrip                bool // redis_rate: every request held for its round trip
	Tollgate                 bool // acquires/s and deltas per check
	Acquires, DeltasPerCheck float64
	CPUMsPerSec, AdmittedPct float64
	SendLagP99               time.Duration
	Errors, Dropped          int64
}

func (r *report) pacedView() pacedView {
	rg := &r.regimes
	v := pacedView{Alone: rg.aloneView(), SyncWarmup: r.scaled(syncWarmup), PlainWarmup: r.scaled(plainWarmup),
		Measured: r.scaled(pacedMeasured), IdleMsPerSec: r.redisIdleMsPerSec,
		HotKeys: hotKeys, HotWarmup: r.scaled(hotWarmup), HotMeasured: r.scaled(hotMeasured),
		HotTg:      newRunRow("**Tollgate, 100 keys, closed loop**", rg.hot, true),
		HotRR:      newRunRow("per-request redis_rate, 100 keys, closed loop", rg.hotRR, true),
		HotHeldPct: rg.hot.HeldShare(), HotRatio: rg.hotRatio(),
		HotCPU: rg.hot.RedisWholeCPUPerCheck(), HotRRCPU: rg.hotRR.RedisWholeCPUPerCheck(),
		HotAcquires: float64(rg.hot.Metrics["tollgate.acquires"]), HotDeltas: deltasSent(rg.hot),
		HotLoadPct: keyLoadPct(rg.hot, hotKeys)}
	for _, p := range rg.paced {
		v.Regimes = append(v.Regimes, pacedRegimeView{p.regime.keys, p.regime.perKey, p.regime.perKey * float64(p.regime.keys), p.cpuRatio()})
		for _, x := range []struct {
			name string
			res  perf.PacedResult
		}{{"pass-through", p.pass}, {"**Tollgate**", p.tollgate}, {"redis_rate", p.redisRate}} {
			row := pacedRow{PerKey: p.regime.perKey, Keys: p.regime.keys, Offered: p.tollgate.Rate, Limiter: x.name,
				ChecksPerSec: x.res.ChecksPerSec, P50: x.res.P50, P99: x.res.P99,
				CPUMsPerSec: x.res.Redis.WholeCPU() * 1e3 / max(x.res.Elapsed.Seconds(), 1e-9),
				AdmittedPct: 100 * ratio(float64(x.res.Admitted), float64(x.res.Checks)), SendLagP99: x.res.SendLagP99,
				Errors: x.res.Errors, Dropped: x.res.Dropped}
			if x.res.Name != p.pass.Name {
				row.Limited, row.Added = true, p.addedP99(x.res)
				row.CPUPerCheck, row.HeldPct = x.res.RedisWholeCPUPerCheck(), x.res.HeldShare()
			}
			row.RoundTrip = x.res.Name == p.redisRate.Name
			if x.res.Name == p.tollgate.Name {
				row.Tollgate = true
				row.Acquires = ratio(float64(x.res.Metrics["tollgate.acquires"]), x.res.Elapsed.Seconds())
				row.DeltasPerCheck = deltasPerCheck(x.res.LoadResult)
			}
			v.Rows = append(v.Rows, row)
		}
	}
	return v
}

// writePacedRegimes is section 10: the paced regimes and the hot keys at their limit.
func (r *report) writePacedRegimes(w io.Writer) error {
	return block(w, blockPaced, func(w io.Writer) error { return render(w, "paced", r.pacedView()) })
}

// simRegimesView is section 11: the fleet simulation's regimes.
type simRegimesView struct {
	Alone                   *aloneView
	Gateways                int
	TopLoad, ZipfS          float64
	Keys                    int
	Burst                   int
	NewKeysPct, DurationSec float64
	Rows                    []simRegimeRow
}

// simRegimeRow is one simulated regime.
type simRegimeRow struct {
	Name, What       string
	Requests         float64
	HeldPct          float64
	WaitP99          time.Duration
	HasCalm          bool // keys within their limit were offered and the regime is not over its limit
	CalmFalsePct     float64
	OverAdmissionPct float64
	ChecksPerSec     float64
	DeltasPerSec     float64
}

func (r *report) simRegimesView() simRegimesView {
	rg := &r.regimes
	v := simRegimesView{Alone: rg.aloneView(), Gateways: sim.RegimeGateways, TopLoad: float64(sim.RealisticTopLoad), ZipfS: sim.RealisticZipfS,
		Keys: sim.RealisticKeys, Burst: sim.RealisticBurst, NewKeysPct: 100 * sim.RealisticNewKeys, DurationSec: sim.RealisticDuration.Seconds()}
	for _, p := range rg.sim {
		x := p.Result
		v.Rows = append(v.Rows, simRegimeRow{Name: p.Regime.Name, What: p.Regime.What, Requests: float64(x.Requests), HeldPct: sim.HeldPct(x),
			WaitP99: x.WaitP99, HasCalm: x.CalmRefAdmitted != 0 && !p.Regime.OverLimit, CalmFalsePct: x.CalmFalsePct,
			OverAdmissionPct: x.OverAdmissionPct, ChecksPerSec: x.ChecksPerSec, DeltasPerSec: x.DeltasPerSec})
	}
	return v
}

// writeSimRegimes is section 11: the fleet simulation's regimes.
func (r *report) writeSimRegimes(w io.Writer) error {
	return block(w, blockSim, func(w io.Writer) error { return render(w, "simregimes", r.simRegimesView()) })
}
