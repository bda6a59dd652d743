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

// keysLine names the key counts and total load of the paced regimes run.
func (rg *regimeRuns) keysLine() string {
	if len(rg.paced) == 0 {
		return "not run"
	}
	var parts []string
	for _, p := range rg.paced {
		parts = append(parts, fmt.Sprintf("%s at %g requests/s each (%s/s in all)", fmtInt(float64(p.regime.keys)), p.regime.perKey, fmtInt(p.regime.perKey*float64(p.regime.keys))))
	}
	return strings.Join(parts, ", ")
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

// pacedTargets are the paced regimes' rows of the Targets table.
func (rg *regimeRuns) pacedTargets() [][]string {
	if len(rg.paced) == 0 {
		return [][]string{{"paced per-key rates against redis_rate (section 10)", "not run", yesNo(false)}}
	}
	var rows [][]string
	heldOK, p99OK := true, true
	var held, p99 []string
	for _, p := range rg.paced {
		c := p.cpuRatio()
		note := ""
		if !p.carried() {
			note = fmt.Sprintf("; load not carried: %d+%d+%d errors, %d+%d+%d dropped (pass-through+redis_rate+Tollgate)",
				p.pass.Errors, p.redisRate.Errors, p.tollgate.Errors, p.pass.Dropped, p.redisRate.Dropped, p.tollgate.Dropped)
		}
		rows = append(rows, []string{
			fmt.Sprintf("Redis CPU per check, paced, %s keys at %g requests/s each: ≤ %s of redis_rate's", fmtInt(float64(p.regime.keys)), p.regime.perKey, fmtRatio(p.regime.bound)),
			fmt.Sprintf("%s (%s vs %s µs/check)%s", fmtRatio(c), fmtF(p.tollgate.RedisWholeCPUPerCheck(), 2), fmtF(p.redisRate.RedisWholeCPUPerCheck(), 2), note),
			yesNo(p.carried() && c > 0 && c <= p.regime.bound)})
		h := p.tollgate.HeldShare()
		held = append(held, fmt.Sprintf("%g/s %s %%", p.regime.perKey, fmtF(h, 2)))
		heldOK = heldOK && p.carried() && h <= heldBoundPct
		a := p.addedP99(p.tollgate)
		p99 = append(p99, fmt.Sprintf("%g/s %s (redis_rate %s)", p.regime.perKey, fmtSignedDur(a), fmtSignedDur(p.addedP99(p.redisRate))))
		p99OK = p99OK && p.carried() && a <= addedP99Bound
	}
	rows = append(rows,
		[]string{"requests held for an acquire ≤ 1 % at every rate above", strings.Join(held, ", "), yesNo(heldOK)},
		[]string{"added p99 through the gateway host ≤ 1 ms at every rate above (over the pass-through's, same load)", strings.Join(p99, ", "), yesNo(p99OK)})
	hr := rg.hotRatio()
	rows = append(rows, []string{fmt.Sprintf("Redis CPU per check, %d hot keys closed loop at their limit: ≤ %s of redis_rate's", hotKeys, fmtRatio(hotLimitBound)),
		fmt.Sprintf("%s (%s vs %s µs/check; each key at %s %% of its limit)", fmtRatio(hr), fmtF(rg.hot.RedisWholeCPUPerCheck(), 2), fmtF(rg.hotRR.RedisWholeCPUPerCheck(), 2), fmtF(keyLoadPct(rg.hot, hotKeys), 1)),
		yesNo(rg.hot.Checks > 0 && hr > 0 && hr <= hotLimitBound)})
	return rows
}

// simTargets are the simulation regimes' rows of the Targets table.
func (rg *regimeRuns) simTargets() [][]string {
	if len(rg.sim) == 0 {
		return [][]string{{"fleet simulation regimes, 16 gateways (section 11)", "not run", yesNo(false)}}
	}
	var rows [][]string
	for _, p := range rg.sim {
		for _, t := range p.Regime.Targets {
			rows = append(rows, []string{fmt.Sprintf("simulation, %d gateways × 2 workers, %s: %s", sim.RegimeGateways, p.Regime.Name, t.What),
				fmt.Sprintf("%s %%", fmtF(t.Value(p.Result), 3)), yesNo(t.Met(p.Result))})
		}
	}
	return rows
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
func block(w io.Writer, name string, body func(io.Writer)) {
	fmt.Fprintln(w, blockBegin(name))
	body(w)
	fmt.Fprintln(w, blockEnd(name))
	fmt.Fprintln(w)
}

// Block names: the Targets table's rows of each section, and the sections.
const (
	blockPacedTargets = "targets-paced-regimes"
	blockSimTargets   = "targets-sim-regimes"
	blockPaced        = "paced-regimes"
	blockSim          = "sim-regimes"
)

// writeRegimeTargets is the Targets section's part for the regimes: one table each.
func (r *report) writeRegimeTargets(w io.Writer) {
	r.writeRegimeTarget(w, blockPacedTargets)
	r.writeRegimeTarget(w, blockSimTargets)
}

// writeRegimeTarget writes one of the regimes' Targets blocks.
func (r *report) writeRegimeTarget(w io.Writer, name string) {
	switch name {
	case blockPacedTargets:
		block(w, name, func(w io.Writer) {
			fmt.Fprintln(w, "Paced per-key rates against redis_rate ([section 10](#10-regimes-per-key-rates-paced-against-redis_rate)):")
			fmt.Fprintln(w)
			table(w, []string{"target", "measured", ""}, r.regimes.pacedTargets())
		})
	case blockSimTargets:
		block(w, name, func(w io.Writer) {
			fmt.Fprintln(w, "Fleet simulation regimes ([section 11](#11-regimes-in-the-fleet-simulation)):")
			fmt.Fprintln(w)
			table(w, []string{"target", "measured", ""}, r.regimes.simTargets())
		})
	}
}

// aloneNote says when and how sections measured on their own were.
func (rg *regimeRuns) aloneNote(w io.Writer) {
	if a := rg.alone; a != nil {
		fmt.Fprintf(w, "*Measured on its own by `go run ./bench/cmd/tollgate-bench %s` at %s (load average %s at the start), not in the run the header names.*\n\n",
			strings.Join(a.args, " "), a.started.Format("2006-01-02 15:04 MST"), a.loadAvg)
	}
}

// writePacedRegimes is section 10: the paced regimes and the hot keys at their limit.
func (r *report) writePacedRegimes(w io.Writer) {
	rg := &r.regimes
	block(w, blockPaced, func(w io.Writer) {
		fmt.Fprintln(w, "## 10. Regimes: per-key rates, paced, against redis_rate")
		fmt.Fprintln(w)
		rg.aloneNote(w)
		fmt.Fprintln(w, "Both limiters are offered the same open-loop load in section 2's harness (the gateway host,")
		fmt.Fprintln(w, "`internal/wazerohost`, with 2 worker VMs in this process; the *n*-th request of the schedule to worker *n*")
		fmt.Fprintln(w, "mod 2; a request the filter holds waits for its answer without holding its worker): every key")
		fmt.Fprintln(w, "a Poisson process at the regime's rate (one Poisson stream, keys drawn uniformly, the same seed")
		fmt.Fprintln(w, "for every limiter), each request sent at its scheduled time whatever the earlier ones take, and")
		fmt.Fprintf(w, "its latency counted from that time. GCRA 1,000/s per key (never reached). The keys: %s.\n", rg.keysLine())
		fmt.Fprintf(w, "Tollgate runs %s unmeasured first (longer than `stale_ms`, so the reports of slow keys are in\n", fmtDur(r.scaled(syncWarmup)))
		fmt.Fprintf(w, "their steady state), redis_rate and the pass-through module %s; then %s measured. Redis CPU\n", fmtDur(r.scaled(plainWarmup)), fmtDur(r.scaled(pacedMeasured)))
		fmt.Fprintln(w, "is the whole redis-server process from /proc (`se.sum_exec_runtime` of its threads), idle work")
		fmt.Fprintf(w, "included (%s ms per second with the service running and no load). Held requests are those the\n", fmtF(r.redisIdleMsPerSec, 1))
		fmt.Fprintln(w, "gateway host paused (`wasmhost_paused_total`: the filter waits for an acquire's answer);")
		fmt.Fprintln(w, "redis_rate holds every request for its Redis round trip. Added p99 is the p99 over the")
		fmt.Fprintln(w, "pass-through module's at the same load; send lag is how late the scheduler sent (the harness's")
		fmt.Fprintln(w, "own share of every latency, which the pass-through's p99 includes too). A regime whose runs")
		fmt.Fprintln(w, "dropped requests (more than 4,096 unanswered) or timed out did not carry the load: its targets")
		fmt.Fprintln(w, "count as missed.")
		fmt.Fprintln(w)
		var rows [][]string
		for _, p := range rg.paced {
			for _, x := range []struct {
				name string
				res  perf.PacedResult
			}{{"pass-through", p.pass}, {"**Tollgate**", p.tollgate}, {"redis_rate", p.redisRate}} {
				added, held, cpu, acq, dpc := "–", "–", "–", "–", "–"
				if x.res.Name != p.pass.Name {
					added = fmtSignedDur(p.addedP99(x.res))
					cpu = fmtF(x.res.RedisWholeCPUPerCheck(), 2)
					held = fmtF(x.res.HeldShare(), 2)
				}
				if x.res.Name == p.redisRate.Name {
					held = "100 (a round trip each)"
				}
				if x.res.Name == p.tollgate.Name {
					acq = fmtF(ratio(float64(x.res.Metrics["tollgate.acquires"]), x.res.Elapsed.Seconds()), 1)
					dpc = fmtF(deltasPerCheck(x.res.LoadResult), 3)
				}
				rows = append(rows, []string{fmt.Sprintf("%g", p.regime.perKey), fmtInt(float64(p.regime.keys)), fmtInt(p.tollgate.Rate), x.name,
					fmtInt(x.res.ChecksPerSec), fmtDur(x.res.P50), fmtDur(x.res.P99), added, held, cpu,
					fmtF(x.res.Redis.WholeCPU()*1e3/max(x.res.Elapsed.Seconds(), 1e-9), 1), acq, dpc,
					fmtF(100*ratio(float64(x.res.Admitted), float64(x.res.Checks)), 1), fmtDur(x.res.SendLagP99),
					fmt.Sprintf("%d/%d", x.res.Errors, x.res.Dropped)})
			}
		}
		table(w, []string{"requests/s per key", "keys", "offered/s", "limiter", "checks/s", "p50", "p99", "added p99", "held %",
			"Redis CPU µs/check", "Redis CPU ms/s", "acquires/s", "deltas/check", "admitted %", "send lag p99", "errors/dropped"}, rows)
		if len(rg.paced) > 0 {
			fmt.Fprintln(w, "Ratio of Redis CPU per check, Tollgate over redis_rate, by per-key rate: ")
			var parts []string
			for _, p := range rg.paced {
				parts = append(parts, fmt.Sprintf("%g/s %s", p.regime.perKey, fmtRatio(p.cpuRatio())))
			}
			fmt.Fprintln(w, strings.Join(parts, ", ")+".")
			fmt.Fprintln(w, "Deltas per check count batch deltas and acquires (one delta each). A key seen less often")
			fmt.Fprintln(w, "than its lease lives asks the service again on its next request (an acquire that holds it);")
			fmt.Fprintln(w, "a key seen more often is decided from its lease and reported once per lease or staleness period.")
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "**%d hot keys at their limit.** Section 2's harness (8 goroutines, closed loop, 2 worker VMs,\n", hotKeys)
		fmt.Fprintf(w, "`ExchangeWait`, which waits for a held request), %s warm-up then %s measured, both limiters closed\n", fmtDur(r.scaled(hotWarmup)), fmtDur(r.scaled(hotMeasured)))
		fmt.Fprintln(w, "loop on the same 100 keys: Tollgate is driven to the keys' limit; redis_rate, slower per check,")
		fmt.Fprintln(w, "stays below it and pays one script call per check whatever the load.")
		fmt.Fprintln(w)
		table(w, append(loadHeader, "held %"), [][]string{
			append(loadRow("**Tollgate, 100 keys, closed loop**", rg.hot, true), fmtF(rg.hot.HeldShare(), 2)),
			append(loadRow("per-request redis_rate, 100 keys, closed loop", rg.hotRR, true), "100"),
		})
		fmt.Fprintf(w, "Redis CPU per check (whole process): %s of redis_rate's (%s vs %s µs); %s of %s deltas were\n",
			fmtRatio(rg.hotRatio()), fmtF(rg.hot.RedisWholeCPUPerCheck(), 2), fmtF(rg.hotRR.RedisWholeCPUPerCheck(), 2),
			fmtInt(float64(rg.hot.Metrics["tollgate.acquires"])), fmtInt(deltasSent(rg.hot)))
		fmt.Fprintf(w, "acquires, each holding a request; keys at %s %% of their limit.\n", fmtF(keyLoadPct(rg.hot, hotKeys), 1))
		fmt.Fprintln(w)
		fmt.Fprintln(w, "`go run ./bench/cmd/tollgate-bench -sections regimes` measures this section alone and prints it;")
		fmt.Fprintln(w, "with `-out BENCHMARKS.md` it replaces this section and its Targets rows in the report instead.")
		fmt.Fprintln(w)
	})
}

// writeSimRegimes is section 11: the fleet simulation's regimes.
func (r *report) writeSimRegimes(w io.Writer) {
	rg := &r.regimes
	block(w, blockSim, func(w io.Writer) {
		fmt.Fprintln(w, "## 11. Regimes in the fleet simulation")
		fmt.Fprintln(w)
		rg.aloneNote(w)
		fmt.Fprintf(w, "`bench/sim` (the filter's plugin code natively, the service's lease code in memory, a virtual\n")
		fmt.Fprintf(w, "clock; section 8) with %d gateways × 2 workers, 100 ms sync, callout latency 1 ms + exp(1 ms)\n", sim.RegimeGateways)
		fmt.Fprintln(w, "each way, seed 1, token bucket 100/s, penalties on as deployed unless the row says otherwise.")
		fmt.Fprintln(w, "False rejections count requests of keys within their limit (mean rate at most the limit) that")
		fmt.Fprintln(w, "one perfect limiter on the merged stream admitted and the fleet refused, as % of those it")
		fmt.Fprintln(w, "admitted; for keys above their limit the two admit as many but different requests, so only")
		fmt.Fprintln(w, "over-admission is held against them. Held requests are those a gateway paused for the")
		fmt.Fprintln(w, "service's answer (an acquire). The realistic regime is the traffic of a public API: key *k*'s")
		fmt.Fprintf(w, "mean rate %g × the limit × (*k*+1)^-%g over %s keys (the first above its limit, a few near it,\n", float64(sim.RealisticTopLoad), sim.RealisticZipfS, fmtInt(sim.RealisticKeys))
		fmt.Fprintf(w, "a long tail far below: most keys are seen a few times, each time cold), requests in sessions of\n")
		fmt.Fprintf(w, "%d within 200 ms, %.0f %% of the keys arriving during the %.0f s run.\n", sim.RealisticBurst, 100*sim.RealisticNewKeys, sim.RealisticDuration.Seconds())
		fmt.Fprintln(w)
		var rows [][]string
		for _, p := range rg.sim {
			x := p.Result
			calm := fmtF(x.CalmFalsePct, 3)
			if x.CalmRefAdmitted == 0 || p.Regime.OverLimit {
				calm = "–"
			}
			rows = append(rows, []string{p.Regime.Name, p.Regime.What, fmtInt(float64(x.Requests)), fmtF(sim.HeldPct(x), 2), fmtDur(x.WaitP99), calm,
				fmtF(x.OverAdmissionPct, 2), fmtF(x.ChecksPerSec, 0), fmtF(x.DeltasPerSec, 0)})
		}
		table(w, []string{"regime", "traffic", "requests", "held %", "held p99", "false rejections % (within limit)", "over-admission worst %", "acquires/s", "deltas/s"}, rows)
		fmt.Fprintln(w, "`go run ./bench/cmd/tollgate-sim -regimes` (`make sim`) runs the same regimes and prints each bound;")
		fmt.Fprintln(w, "with `-explain` it also counts each regime's held requests and false rejections by cause (RATIONALE.md")
		fmt.Fprintln(w, "§2 \"Grants\" and §3 \"Cold starts: requests that wait\" give the counts);")
		fmt.Fprintln(w, "`go run ./bench/cmd/tollgate-bench -sections sim-regimes` regenerates this section.")
		fmt.Fprintln(w)
	})
}
