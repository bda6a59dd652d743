package main

import (
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

// The real-Envoy comparison (section 13): its Targets rows and the section, each between
// markers so `-sections envoy` can replace them alone.
const (
	sectionEnvoy       = "envoy"
	blockEnvoyTargets  = "targets-envoy"
	blockEnvoy         = "envoy-compare"
	chartEnvoyLatency  = "envoy_latency.png"
	chartEnvoyCPU      = "envoy_cpu.png"
	envoyCompareTitle  = "## 13. Tollgate in Envoy against Envoy's own rate limiting"
	envoyCompareAnchor = "#13-tollgate-in-envoy-against-envoys-own-rate-limiting"
)

// envoyCompareOptions are the comparison's durations, scaled by -scale.
func envoyCompareOptions(o options, logger *log.Logger) perf.CompareOptions {
	return perf.CompareOptions{
		Warmup: o.dur(2 * time.Second), Chunk: o.dur(2500 * time.Millisecond),
		OpenChunk: o.dur(3 * time.Second), OpenWarmup: o.dur(500 * time.Millisecond),
		Profile: []perf.Limiter{perf.PassThrough, perf.FloorModule, perf.TollgateLocal, perf.TollgateSynced},
		Log:     logger,
	}
}

// measureEnvoyCompare builds the filter, the floor module and the service and runs the
// comparison.
func (r *report) measureEnvoyCompare(o options, logger *log.Logger) error {
	logger.Print("real Envoy comparison: building the filter, the floor module and tollgate-ratelimit")
	filter, err := perf.BuildModule(perf.FilterPkg)
	if err != nil {
		return err
	}
	floor, err := perf.BuildModule(perf.FloorPkg)
	if err != nil {
		return err
	}
	bin := o.rlsBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "tollgate-bench-svc-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if bin, err = perf.BuildService(dir); err != nil {
			return err
		}
	}
	r.envoyCompareLoad = readMachine().loadAvg
	r.envoyCompareStarted = time.Now().UTC()
	c, err := perf.MeasureEnvoyCompare(filter, floor, bin, envoyCompareOptions(o, logger))
	if err != nil {
		return fmt.Errorf("real Envoy comparison: %w", err)
	}
	r.envoyCompare = c
	return nil
}

// envoyChart writes the section's charts into dir.
func (r *report) envoyCharts(dir string) error {
	c := r.envoyCompare
	if c == nil {
		return nil
	}
	w := slices.Max(c.Options.Workers)
	var lines []perf.LatencyLine
	for _, l := range perf.Limiters {
		row := c.Row(l, w)
		line := perf.LatencyLine{Label: l.Short()}
		for _, f := range c.Options.Fractions {
			runs := openAt(row, f)
			if len(runs) == 0 {
				continue
			}
			line.Rate = append(line.Rate, runs[0].Rate)
			line.P50 = append(line.P50, medianDur(runs, func(o perf.OpenRun) time.Duration { return o.P50 })/1e6)
			line.P99 = append(line.P99, medianDur(runs, func(o perf.OpenRun) time.Duration { return o.P99 })/1e6)
			line.P99p9 = append(line.P99p9, medianDur(runs, func(o perf.OpenRun) time.Duration { return o.P999 })/1e6)
		}
		lines = append(lines, line)
	}
	if err := perf.ChartLatencyVsRate(fmt.Sprintf("Envoy %s (V8), %d workers, 10,000 keys: latency vs offered rate", c.Options.Release, w),
		lines, perf.ChartPath(dir, chartEnvoyLatency)); err != nil {
		return err
	}
	var groups []string
	bars := []perf.Bars{{Label: "Envoy"}, {Label: "sync service / RLS"}, {Label: "Redis"}}
	for _, l := range perf.Limiters {
		groups = append(groups, l.Short())
		cpu := cpuOf(c.Row(l, w))
		bars[0].Values = append(bars[0].Values, cpu.Envoy)
		bars[1].Values = append(bars[1].Values, cpu.Service)
		bars[2].Values = append(bars[2].Values, cpu.Redis)
	}
	return perf.ChartGroupedBars(fmt.Sprintf("CPU µs per request by process, Envoy %s, %d workers, closed loop (median of %d rounds)", c.Options.Release, w, c.Options.Rounds),
		"µs per request", groups, bars, false, perf.ChartPath(dir, chartEnvoyCPU))
}

// openAt are row's open-loop runs at fraction f.
func openAt(row *perf.CompareRow, f float64) []perf.OpenRun {
	var out []perf.OpenRun
	for _, o := range row.Open {
		if o.Fraction == f {
			out = append(out, o)
		}
	}
	return out
}

func medianDur(runs []perf.OpenRun, f func(perf.OpenRun) time.Duration) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = float64(f(r))
	}
	return perf.Median(v)
}

// cpuOf is row's CPU per request by process over its closed-loop chunks (Envoy
// saturated), the median over the rounds process by process: interleaved with the other
// limiters' chunks, and free of the queueing of an open loop the machine does not carry.
func cpuOf(row *perf.CompareRow) perf.CPUPerReq {
	pick := func(g func(perf.CPUPerReq) float64) float64 {
		v := make([]float64, len(row.Closed))
		for i, r := range row.Closed {
			v[i] = g(r.CPU)
		}
		return perf.Median(v)
	}
	return perf.CPUPerReq{
		Envoy:   pick(func(c perf.CPUPerReq) float64 { return c.Envoy }),
		Service: pick(func(c perf.CPUPerReq) float64 { return c.Service }),
		Redis:   pick(func(c perf.CPUPerReq) float64 { return c.Redis }),
		Bench:   pick(func(c perf.CPUPerReq) float64 { return c.Bench }),
	}
}

// statOf is the counter of row whose name ends in suffix (0 when absent).
func statOf(row *perf.CompareRow, suffix string) int64 {
	for _, s := range row.Stats {
		name, v, ok := strings.Cut(s, "=")
		if ok && strings.HasSuffix(name, suffix) {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// added is l's percentile over pass-through's at fraction f with w workers: per round
// (the two measured at the same rate, seconds apart), then the median over rounds.
func (r *report) added(l perf.Limiter, w int, f float64, pct func(perf.OpenRun) time.Duration) time.Duration {
	c := r.envoyCompare
	base, row := openAt(c.Row(perf.PassThrough, w), f), openAt(c.Row(l, w), f)
	var d []float64
	for _, x := range row {
		for _, b := range base {
			if b.Round == x.Round {
				d = append(d, float64(pct(x)-pct(b)))
			}
		}
	}
	return time.Duration(perf.Median(d))
}

// satRatio is the median over rounds of a's saturation over b's in the same round.
func (r *report) satRatio(a, b perf.Limiter, w int) float64 {
	c := r.envoyCompare
	ra, rb := c.Row(a, w).Closed, c.Row(b, w).Closed
	var v []float64
	for i := range min(len(ra), len(rb)) {
		v = append(v, ratio(ra[i].PerSec, rb[i].PerSec))
	}
	return perf.Median(v)
}

func satMedian(row *perf.CompareRow) float64 {
	v := make([]float64, len(row.Closed))
	for i, c := range row.Closed {
		v[i] = c.PerSec
	}
	return perf.Median(v)
}

func p99(o perf.OpenRun) time.Duration  { return o.P99 }
func p50(o perf.OpenRun) time.Duration  { return o.P50 }
func p999(o perf.OpenRun) time.Duration { return o.P999 }

// addedEnvoyCPU is l's Envoy CPU per request above pass-through's (closed loop).
func (r *report) addedEnvoyCPU(l perf.Limiter, w int) float64 {
	c := r.envoyCompare
	return cpuOf(c.Row(l, w)).Envoy - cpuOf(c.Row(perf.PassThrough, w)).Envoy
}

// envoyTargets are the comparison's rows of the Targets table, each judged on every
// worker count (met only where met with each).
func (r *report) envoyTargets() [][]string {
	c := r.envoyCompare
	if c == nil {
		return [][]string{{"real Envoy comparison", "not measured", "**missed**"}}
	}
	f := c.Options.Target
	var rows [][]string
	type part struct {
		text string
		ok   bool
	}
	judge := func(target string, each func(w int) part) {
		var texts []string
		ok := true
		for _, w := range c.Options.Workers {
			p := each(w)
			texts = append(texts, fmt.Sprintf("%d worker%s: %s", w, plural(w), p.text))
			ok = ok && p.ok
		}
		rows = append(rows, []string{target, strings.Join(texts, "; "), yesNo(ok)})
	}
	judge("in Envoy: Tollgate synced serves ≥ 85 % of `local_ratelimit`'s requests/s at saturation", func(w int) part {
		v := r.satRatio(perf.TollgateSynced, perf.LocalRateLimit, w)
		return part{fmt.Sprintf("%.0f %% (%s vs %s req/s; local only %.0f %%)", 100*v, fmtInt(satMedian(c.Row(perf.TollgateSynced, w))),
			fmtInt(satMedian(c.Row(perf.LocalRateLimit, w))), 100*r.satRatio(perf.TollgateLocal, perf.LocalRateLimit, w)), v >= 0.85}
	})
	wl := slices.Max(c.Options.Workers)
	cf, carried := r.carriedFraction(wl)
	note := func(l perf.Limiter, w int) string {
		if n := r.lostAt(perf.PassThrough, w, f) + r.lostAt(l, w, f); n > 0 {
			return fmt.Sprintf(" (load not carried: %d requests dropped or lost)", n)
		}
		return ""
	}
	// At the highest rate every limiter carried, for the largest worker count: what the
	// limiters add where the machine is not the bottleneck.
	carriedNote := func(a, b perf.Limiter) string {
		if !carried || cf == f {
			return ""
		}
		rate := openAt(c.Row(perf.PassThrough, wl), cf)[0].Rate
		return fmt.Sprintf("; at %s req/s (%s of saturation, the highest rate every limiter carried with %d workers): %s %s vs %s",
			fmtInt(rate), fmtF(cf, 2), wl, a.Short(), fmtSignedDur(r.added(a, wl, cf, p99)), fmtSignedDur(r.added(b, wl, cf, p99)))
	}
	judge("in Envoy: Tollgate's added p99 ≤ `local_ratelimit`'s + 100 µs", func(w int) part {
		tg, lr, loc := r.added(perf.TollgateSynced, w, f, p99), r.added(perf.LocalRateLimit, w, f, p99), r.added(perf.TollgateLocal, w, f, p99)
		return part{fmt.Sprintf("synced %s vs %s (local only %s)%s", fmtSignedDur(tg), fmtSignedDur(lr), fmtSignedDur(loc), note(perf.TollgateSynced, w)),
			tg <= lr+100*time.Microsecond && note(perf.TollgateSynced, w) == ""}
	})
	rows[len(rows)-1][1] += carriedNote(perf.TollgateSynced, perf.LocalRateLimit)
	judge("in Envoy: Tollgate's added p99 ≤ 1/10 of the RLS path's", func(w int) part {
		tg, rls := r.added(perf.TollgateSynced, w, f, p99), r.added(perf.RLSPath, w, f, p99)
		return part{fmt.Sprintf("synced %s vs %s%s", fmtSignedDur(tg), fmtSignedDur(rls), note(perf.TollgateSynced, w)),
			rls > 0 && tg*10 <= rls && note(perf.TollgateSynced, w) == ""}
	})
	rows[len(rows)-1][1] += carriedNote(perf.TollgateSynced, perf.RLSPath)
	judge("in Envoy: total CPU per request (Envoy + service + Redis) ≤ 1/3 of the RLS path's", func(w int) part {
		tg, rls := cpuOf(c.Row(perf.TollgateSynced, w)).Total(), cpuOf(c.Row(perf.RLSPath, w)).Total()
		return part{fmt.Sprintf("%s (%s vs %s µs)", fmtRatio(ratio(tg, rls)), fmtF(tg, 1), fmtF(rls, 1)), tg*3 <= rls}
	})
	judge("in Envoy (V8): the filter's Envoy CPU per request above pass-through ≤ 1.5× the floor module's", func(w int) part {
		tg, loc, fl := r.addedEnvoyCPU(perf.TollgateSynced, w), r.addedEnvoyCPU(perf.TollgateLocal, w), r.addedEnvoyCPU(perf.FloorModule, w)
		return part{fmt.Sprintf("synced %s× (%s vs %s µs), local only %s×", fmtF(ratio(tg, fl), 2), fmtF(tg, 1), fmtF(fl, 1), fmtF(ratio(loc, fl), 2)), fl > 0 && tg <= 1.5*fl}
	})
	return rows
}

// lostAt is the requests l's runs at fraction f with w workers dropped (too many
// unanswered) or lost (transport errors).
func (r *report) lostAt(l perf.Limiter, w int, f float64) int64 {
	var n int64
	for _, o := range openAt(r.envoyCompare.Row(l, w), f) {
		n += o.Dropped + o.Errors
	}
	return n
}

// carriedFraction is the highest open-loop fraction at which every limiter with w
// workers dropped and lost nothing.
func (r *report) carriedFraction(w int) (float64, bool) {
	best, ok := 0.0, false
	for _, f := range r.envoyCompare.Options.Fractions {
		all := true
		for _, l := range perf.Limiters {
			all = all && len(openAt(r.envoyCompare.Row(l, w), f)) > 0 && r.lostAt(l, w, f) == 0
		}
		if all && f > best {
			best, ok = f, true
		}
	}
	return best, ok
}

// makeTarget names the make target that runs the command with args.
func makeTarget(args []string) string {
	if slices.Contains(args, "-sections") {
		return "`make bench-envoy`"
	}
	return "`make bench`"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// writeEnvoyTargets is the comparison's block of the Targets section.
func (r *report) writeEnvoyTargets(w io.Writer) {
	block(w, blockEnvoyTargets, func(w io.Writer) error {
		fmt.Fprintf(w, "In a real Envoy against Envoy's own rate limiting ([section 13](%s)); where a wazero row above and\n", envoyCompareAnchor)
		fmt.Fprintln(w, "one of these measure the same thing, this one is the judge:")
		fmt.Fprintln(w)
		table(w, []string{"target", "measured", ""}, r.envoyTargets())
		return nil
	})
}

// writeEnvoyCompare is section 13.
func (r *report) writeEnvoyCompare(w io.Writer) {
	block(w, blockEnvoy, func(w io.Writer) error { r.writeEnvoyCompareBody(w); return nil })
}

func (r *report) writeEnvoyCompareBody(w io.Writer) {
	c := r.envoyCompare
	fmt.Fprintln(w, envoyCompareTitle)
	fmt.Fprintln(w)
	if c == nil {
		fmt.Fprintln(w, "Not measured in this run.")
		fmt.Fprintln(w)
		return
	}
	o := c.Options
	charts := r.chartsRel
	table(w, []string{"", ""}, [][]string{
		{"command", "`go run ./bench/cmd/tollgate-bench " + strings.Join(r.args, " ") + "` (" + makeTarget(r.args) + ")"},
		{"date", fmt.Sprintf("%s (the section took %s)", r.envoyCompareStarted.Format("2006-01-02 15:04 MST"), c.Took.Round(time.Second))},
		{"Envoy", fmt.Sprintf("%s, official release binary, `envoy.wasm.runtime.v8`", strings.TrimSpace(c.Version))},
		{"machine", fmt.Sprintf("%d CPUs, %s, Linux %s", r.machine.cpus, r.machine.model, r.machine.kernel)},
		{"load average at start", r.envoyCompareLoad + " (the machine is shared with other work: compare rows by their ratios, measured in the same rounds)"},
	})
	fmt.Fprintf(w, "Every limiter runs in its own Envoy built from the shipped `envoy.yaml` (listener, access log,\n")
	fmt.Fprintf(w, "router and clusters as users run them; `perf.LimiterConfig`), one Envoy per limiter and worker count\n")
	fmt.Fprintf(w, "(`--concurrency` %s), all up at once, the same upstream (a Go server in the benchmark process), the\n", joinInts(o.Workers))
	fmt.Fprintf(w, "same %s callers (`x-api-key`, uniform), one rule: a token bucket of %s requests per second per caller,\n", fmtInt(float64(o.Keys)), fmtInt(perf.CompareLimit))
	fmt.Fprintln(w, "which the load never reaches (every limiter admits every request: the rows compare the decision's")
	fmt.Fprintln(w, "path, not refusals). The limiters:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "- *pass-through*: the shipped file without the Wasm filter.")
	fmt.Fprintln(w, "- *local_ratelimit*: `envoy.filters.http.local_ratelimit` with a descriptor `api_key` of empty value")
	fmt.Fprintln(w, "  (one token bucket per `x-api-key` value, `max_dynamic_descriptors` 100,000), X-RateLimit headers on:")
	fmt.Fprintln(w, "  the C++ floor of a local decision, no global quota.")
	fmt.Fprintln(w, "- *Tollgate local*: the filter with the rule and no `sync` block. *Tollgate synced*: the shipped `sync`")
	fmt.Fprintln(w, "  block (100 ms, leases of at most 1 s) to `tollgate-ratelimit`, a process of its own, on a real Redis.")
	fmt.Fprintln(w, "- *ratelimit→RLS*: `envoy.filters.http.ratelimit` and the `tollgate_rls` cluster of `deploy/envoy-rls.yaml`,")
	fmt.Fprintln(w, "  calling the same service's gRPC RLS (`--rls-listen`), which decides the same rule on the same Redis:")
	fmt.Fprintln(w, "  one remote call per request.")
	fmt.Fprintln(w, "- *floor module*: `filter/bench/floor`, only the host calls a decision cannot avoid (headers, one shared-data")
	fmt.Fprintln(w, "  get and CAS set, four response headers), in the same Envoy.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The load generator writes prebuilt HTTP/1.1 requests on keep-alive connections and reads only the status")
	fmt.Fprintln(w, "and length of the answers, so that Envoy, not the client, saturates; it and the upstream share the two")
	fmt.Fprintln(w, "cores with Envoy, the service and Redis (their CPU is the *bench* column). Two phases:")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "- *closed loop*: after %s of warm-up each, %d rounds; in each, every Envoy in turn (the order rotated\n", o.Warmup, o.Rounds)
	fmt.Fprintf(w, "  by round) gets %s of %d connections sending as fast as answers come. Requests/s: median of the rounds;\n", o.Chunk, o.Conns)
	fmt.Fprintln(w, "  ratios: median of the rounds' ratios. CPU per request by process over each chunk (`/proc/PID/task/*/sched`),")
	fmt.Fprintln(w, "  the median over the rounds; the service's and Redis's idle CPU (measured over pass-through's chunk of")
	fmt.Fprintln(w, "  the same round, when no request reaches them: the synced Envoys' heartbeats) is taken off. The CPU")
	fmt.Fprintln(w, "  targets are judged on these: Envoy busy, the limiters' chunks interleaved.")
	fmt.Fprintf(w, "- *open loop*: Poisson arrivals at a fixed rate, latency from each request's scheduled time (a stall is\n")
	fmt.Fprintf(w, "  not hidden), %s of warm-up then %s measured, every Envoy of one worker count in turn at the same rate\n", o.OpenWarmup, o.OpenChunk)
	fmt.Fprintf(w, "  and the same schedule. The rate is %s of pass-through's saturation with as many workers (%d rounds);\n", fmtF(o.Target, 2), o.TargetRounds)
	fmt.Fprintf(w, "  for the chart also %s with %d workers. *Added* is a limiter's percentile minus pass-through's in the\n", fracList(o.Fractions, o.Target), slices.Max(o.Workers))
	fmt.Fprintln(w, "  same round, the median over rounds.")
	fmt.Fprintln(w)
	for _, wk := range o.Workers {
		fmt.Fprintf(w, "### %d worker%s\n\n", wk, plural(wk))
		var rows [][]string
		passSat, lrSat := satMedian(c.Row(perf.PassThrough, wk)), satMedian(c.Row(perf.LocalRateLimit, wk))
		_ = lrSat
		for _, l := range perf.Limiters {
			row := c.Row(l, wk)
			lo, hi := satSpread(row)
			var okShare float64
			var n, okN int64
			for _, cr := range row.Closed {
				n += cr.Requests
				okN += cr.OK
			}
			if n > 0 {
				okShare = 100 * float64(okN) / float64(n)
			}
			cpu := cpuOf(row)
			rows = append(rows, []string{bold(l), fmtInt(satMedian(row)) + " (" + fmtInt(lo) + "–" + fmtInt(hi) + ")",
				fmtF(100*r.satRatio(l, perf.PassThrough, wk), 0) + " %", fmtF(100*r.satRatio(l, perf.LocalRateLimit, wk), 0) + " %",
				fmtF(okShare, 1),
				fmtF(cpu.Envoy, 1), fmtF(cpu.Service, 1), fmtF(cpu.Redis, 2), "**" + fmtF(cpu.Total(), 1) + "**", fmtF(cpu.Bench, 1)})
		}
		fmt.Fprintf(w, "Saturation and CPU per request by process (closed loop, medians of %d rounds):\n\n", o.Rounds)
		table(w, []string{"limiter", "requests/s (min–max)", "vs pass-through", "vs local_ratelimit", "200 %", "Envoy µs/req", "service µs/req", "Redis µs/req", "total µs/req", "bench µs/req"}, rows)
		rows = nil
		for _, l := range perf.Limiters {
			row := c.Row(l, wk)
			runs := openAt(row, o.Target)
			var drop, errs, sent, ok int64
			for _, x := range runs {
				drop += x.Dropped
				errs += x.Errors
				sent += x.Checks
				ok += x.Admitted
			}
			md := func(f func(perf.OpenRun) time.Duration) string { return fmtDur(time.Duration(medianDur(runs, f))) }
			added := func(f func(perf.OpenRun) time.Duration) string {
				if l == perf.PassThrough {
					return "–"
				}
				return fmtSignedDur(r.added(l, wk, o.Target, f))
			}
			rows = append(rows, []string{bold(l), md(p50), md(p99), md(p999), added(p50), added(p99), added(p999),
				fmt.Sprintf("%d / %d", drop, errs), fmtF(100*ratio(float64(ok), float64(sent)), 1)})
		}
		fmt.Fprintf(w, "Latency at %s requests/s (open loop; medians of %d rounds):\n\n", fmtInt(o.Target*passSat), o.TargetRounds)
		table(w, []string{"limiter", "p50", "p99", "p99.9", "added p50", "added p99", "added p99.9", "dropped / errors", "200 %"}, rows)
	}
	wk := slices.Max(o.Workers)
	fmt.Fprintf(w, "![latency percentiles vs offered rate, %d workers](%s/%s)\n\n", wk, charts, chartEnvoyLatency)
	fmt.Fprintf(w, "![CPU per request by process, %d workers](%s/%s)\n\n", wk, charts, chartEnvoyCPU)
	r.writeEnvoyLatencyTable(w, wk)
	r.writeEnvoyProfile(w, wk)
	r.writeEnvoyWhy(w, wk)
	r.writeEnvoyStats(w)
}

// writeEnvoyWhy says, from this run's numbers, where the cost of each limiter goes and
// what would change the targets missed.
func (r *report) writeEnvoyWhy(w io.Writer, wk int) {
	c := r.envoyCompare
	cpu := map[perf.Limiter]perf.CPUPerReq{}
	for _, l := range perf.Limiters {
		cpu[l] = cpuOf(c.Row(l, wk))
	}
	add := func(l perf.Limiter) float64 { return cpu[l].Envoy - cpu[perf.PassThrough].Envoy }
	us := func(v float64) string { return fmtF(v, 1) + " µs" }
	fmt.Fprintln(w, "### Where the cost is, and what would change it")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Envoy's CPU per request above pass-through (closed loop, %d workers): local_ratelimit %s, the floor\n", wk, us(add(perf.LocalRateLimit)))
	fmt.Fprintf(w, "module %s, Tollgate local %s, Tollgate synced %s, the ratelimit filter → RLS %s; outside Envoy, the\n",
		us(add(perf.FloorModule)), us(add(perf.TollgateLocal)), us(add(perf.TollgateSynced)), us(add(perf.RLSPath)))
	fmt.Fprintf(w, "service and Redis spend %s and %s per request on the RLS path, %s and %s on Tollgate synced's.\n",
		us(cpu[perf.RLSPath].Service), us(cpu[perf.RLSPath].Redis), us(cpu[perf.TollgateSynced].Service), us(cpu[perf.TollgateSynced].Redis))
	fmt.Fprintln(w)
	fmt.Fprintf(w, "- *Requests/s and Envoy CPU against local_ratelimit.* The floor module does no rate limiting at all, only the\n")
	fmt.Fprintf(w, "  host calls a decision needs (all request headers read across the boundary, one shared-data get and CAS\n")
	var floorParts, below []string
	for _, wn := range c.Options.Workers {
		v := r.satRatio(perf.FloorModule, perf.LocalRateLimit, wn)
		floorParts = append(floorParts, fmt.Sprintf("%.0f %% with %d worker%s", 100*v, wn, plural(wn)))
		if v < 0.85 {
			below = append(below, fmt.Sprintf("%d worker%s", wn, plural(wn)))
		}
	}
	fmt.Fprintf(w, "  set, four response headers added), and reaches %s of local_ratelimit's requests/s", strings.Join(floorParts, ", "))
	if len(below) > 0 {
		fmt.Fprintf(w, ":\n  with %s the proxy-wasm boundary alone is below the 85 %% target before any logic runs.", strings.Join(below, " and "))
	} else {
		fmt.Fprint(w, ".")
	}
	fmt.Fprintf(w, " Above pass-through the floor\n  adds %s of Envoy CPU per request, the filter (local only) %s, local_ratelimit's whole decision %s: the\n",
		us(add(perf.FloorModule)), us(add(perf.TollgateLocal)), us(add(perf.LocalRateLimit)))
	fmt.Fprintf(w, "  filter's own work costs %s above the unavoidable calls.", us(add(perf.TollgateLocal)-add(perf.FloorModule)))
	pt, fl, tl, ts := profileClasses(c.Row(perf.PassThrough, wk)), profileClasses(c.Row(perf.FloorModule, wk)),
		profileClasses(c.Row(perf.TollgateLocal, wk)), profileClasses(c.Row(perf.TollgateSynced, wk))
	if pt != nil && fl != nil && tl != nil {
		fmt.Fprintf(w, " In the profile (one chunk each, noisier than the rounds)\n  the module's compiled code is %s per request in the filter against %s in the floor", us(tl[1]), us(fl[1]))
		if d := tl[0] - fl[0]; d > 0 {
			fmt.Fprintf(w, ", and Envoy's own code\n  %s more than the floor's (the host side of the filter's further calls — the clock, the decision's filter\n  state for the access log, a fifth response header — and V8's own code running the module's).\n", us(d))
		} else {
			fmt.Fprintf(w, "; Envoy's own code\n  is no more than the floor's there (%s).\n", us(d))
		}
	} else {
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "  The counters are kept in the VM and handed to Envoy on the tick (RATIONALE.md §9), so an admitted")
	fmt.Fprintln(w, "  request makes 9 host calls against the floor's 7: the filter state for the access log (the shipped")
	fmt.Fprintln(w, "  log prints it; `telemetry.decision_metadata` turns it off) and the `ratelimit-policy` header.")
	fmt.Fprintln(w, "  Reading the request's headers by name would not be fewer: the rule reads five of them, each a call")
	fmt.Fprintln(w, "  and an allocation in the module, against one call for the whole map.")
	fmt.Fprintln(w, "  What would change it: less module code per decision (section 1's decision cost, 2× the floor's on")
	fmt.Fprintln(w, "  wazero). That brings the filter toward the floor, not below it; the floor's own distance to")
	fmt.Fprintln(w, "  local_ratelimit is the price of deciding in a Wasm VM, which only native code (Envoy's dynamic")
	fmt.Fprintln(w, "  modules, a C ABI) removes.")
	acq, cold, allowed := statOf(c.Row(perf.TollgateSynced, wk), ".acquires"), statOf(c.Row(perf.TollgateSynced, wk), ".requests_cold_admitted"),
		statOf(c.Row(perf.TollgateSynced, wk), ".requests_allowed")
	rejected, timeouts := statOf(c.Row(perf.TollgateSynced, wk), ".requests_rejected"), statOf(c.Row(perf.TollgateSynced, wk), "upstream_rq_504")
	fmt.Fprintf(w, "- *Synced against local.* Syncing adds %s of Envoy CPU per request over Tollgate local", us(cpu[perf.TollgateSynced].Envoy-cpu[perf.TollgateLocal].Envoy))
	if ts != nil && tl != nil {
		fmt.Fprintf(w, " (in the profile:\n  %s in Envoy's code, %s of module code, %s in the kernel)", us(ts[0]-tl[0]), us(ts[1]-tl[1]), us(ts[2]-tl[2]))
	}
	fmt.Fprintln(w, ": the 100 ms batches")
	fmt.Fprintln(w, "  and the acquires, each an HTTP callout through Envoy's cluster. With 10,000 keys each key comes back")
	fmt.Fprintf(w, "  about every %s s at saturation, beyond the shipped lease (`lease_ttl_ms` 1,000): over the run %s acquires\n",
		fmtF(float64(c.Options.Keys)/max(1, satMedian(c.Row(perf.TollgateSynced, wk))), 1), fmtInt(float64(acq)))
	fmt.Fprintf(w, "  held a request for the service's answer (%s of the %s requests admitted) and %s were admitted on the\n",
		fmtF(100*ratio(float64(acq), float64(allowed)), 1)+" %", fmtInt(float64(allowed)), fmtF(100*ratio(float64(cold), float64(allowed)), 1)+" %")
	fmt.Fprintln(w, "  cold-start allowance: the held ones are the synced row's added latency at the chart's low rates.")
	if rejected > 0 {
		fmt.Fprintf(w, "  %s requests were refused although no caller came near its limit, with %s sync callouts timing out\n", fmtInt(float64(rejected)), fmtInt(float64(timeouts)))
		fmt.Fprintln(w, "  (HTTP 504 at the shipped 250 ms) on this loaded machine (`checks_failed` and `answers_degraded` count")
		fmt.Fprintln(w, "  the failed acquires): a request refused because the service was slow is the limiter becoming the")
		fmt.Fprintln(w, "  outage, a defect this run shows.")
	}
	fmt.Fprintln(w, "  Each such request's consumption is reported on its own (a delta in the next batch): the leader reads")
	fmt.Fprintln(w, "  and writes the bucket's slot to cut it and again to apply the answer, four shared-data calls a")
	fmt.Fprintln(w, "  request, besides the staleness scan's reads. The request path's savings (the counters kept in the VM)")
	fmt.Fprintln(w, "  do not show in this row beside them (`TestEnvoyAB` in bench/perf compares two builds round by round).")
	fmt.Fprintln(w, "  What would change it: leases that outlive a slow key's gap (the lease horizon per key's rate), so a")
	fmt.Fprintln(w, "  key seen every few seconds does not ask again each time; the leases' bound on over-admission")
	fmt.Fprintln(w, "  (RATIONALE.md §2) is what a longer lease costs.")
	rlsRemote, tgRemote := cpu[perf.RLSPath].Service+cpu[perf.RLSPath].Redis, cpu[perf.TollgateSynced].Service+cpu[perf.TollgateSynced].Redis
	fmt.Fprintf(w, "- *Against the RLS path.* Per request the RLS path costs %s in all, Tollgate synced %s. Outside Envoy\n", us(cpu[perf.RLSPath].Total()), us(cpu[perf.TollgateSynced].Total()))
	fmt.Fprintf(w, "  Tollgate costs %s× less (%s vs %s: one batch per 100 ms instead of one gRPC call per request), but\n", fmtF(ratio(rlsRemote, tgRemote), 1), us(tgRemote), us(rlsRemote))
	fmt.Fprintf(w, "  in Envoy the Wasm filter costs %s against the ratelimit filter's %s, and Envoy's share is most of\n", us(add(perf.TollgateSynced)), us(add(perf.RLSPath)))
	fmt.Fprintln(w, "  both totals (its pass-through cost, the same for every row, included). 1/3 of the RLS path's total is")
	fmt.Fprintln(w, "  out of reach while the proxy's own work per request is in both: the levers are those of the first point")
	fmt.Fprintln(w, "  and the acquires of the second.")
	fmt.Fprintln(w, "- *Latency.* At half of pass-through's closed-loop saturation the two shared cores (load generator,")
	fmt.Fprintln(w, "  upstream, Envoy, service and Redis, and other work on the machine) queue requests for every limiter;")
	fmt.Fprintln(w, "  the rows say where the load was not carried, and the Targets rows give the added p99 at the highest")
	fmt.Fprintln(w, "  rate every limiter carried as well.")
	fmt.Fprintln(w)
}

// profileClasses is row's profile in µs per request by class: Envoy's code, the module's
// compiled code, the kernel, the rest (nil when not profiled).
func profileClasses(row *perf.CompareRow) []float64 {
	if len(row.Profile) == 0 {
		return nil
	}
	out := make([]float64, 4)
	for _, d := range row.Profile {
		out[dsoClass(d.DSO)] += d.Share * row.ProfileRun.CPU.Envoy
	}
	return out
}

// dsoClass sorts perf's shared objects: 0 Envoy's binary, 1 code V8 compiled (no object
// of its own), 2 the kernel, 3 the rest.
func dsoClass(dso string) int {
	switch {
	case dso == "envoy":
		return 0
	case strings.Contains(dso, "kernel"):
		return 2
	case strings.Contains(dso, "unknown") || strings.Contains(dso, "anon") || strings.Contains(dso, "JIT") || strings.HasPrefix(dso, "perf-"):
		return 1
	}
	return 3
}

// writeEnvoyLatencyTable lists the chart's points.
func (r *report) writeEnvoyLatencyTable(w io.Writer, wk int) {
	c := r.envoyCompare
	o := c.Options
	header := []string{"limiter"}
	for _, f := range o.Fractions {
		runs := openAt(c.Row(perf.PassThrough, wk), f)
		if len(runs) > 0 {
			header = append(header, fmt.Sprintf("%s req/s: p50 / p99 / p99.9", fmtInt(runs[0].Rate)))
		}
	}
	var rows [][]string
	for _, l := range perf.Limiters {
		row := []string{l.Short()}
		for _, f := range o.Fractions {
			runs := openAt(c.Row(l, wk), f)
			if len(runs) == 0 {
				continue
			}
			var dropped int64
			for _, x := range runs {
				dropped += x.Dropped
			}
			cell := fmtDur(time.Duration(medianDur(runs, p50))) + " / " + fmtDur(time.Duration(medianDur(runs, p99))) + " / " + fmtDur(time.Duration(medianDur(runs, p999)))
			if dropped > 0 {
				cell += fmt.Sprintf(" (%d dropped)", dropped)
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	fmt.Fprintf(w, "The chart's points (%d workers; a request not sent because 2,048 were unanswered counts as dropped):\n\n", wk)
	table(w, header, rows)
}

// writeEnvoyProfile says where Envoy's CPU goes, from perf record by shared object.
func (r *report) writeEnvoyProfile(w io.Writer, wk int) {
	c := r.envoyCompare
	fmt.Fprintln(w, "### Where the time goes in Envoy")
	fmt.Fprintln(w)
	var profiled []perf.Limiter
	for _, l := range perf.Limiters {
		if len(c.Row(l, wk).Profile) > 0 {
			profiled = append(profiled, l)
		}
	}
	if len(profiled) == 0 {
		fmt.Fprintf(w, "Not profiled in this run (%v).\n\n", c.ProfileErr)
		return
	}
	if c.ProfileErr != nil {
		fmt.Fprintf(w, "A profile is missing: %v.\n\n", c.ProfileErr)
	}
	fmt.Fprintf(w, "`perf record -F 999 -p <envoy>` over one more closed-loop chunk of %s (Envoy saturated,\n", c.Options.ProfileFor)
	fmt.Fprintf(w, "%d workers), its samples by shared object (`perf report --sort dso`; Envoy's release binary is\n", wk)
	fmt.Fprintln(w, "stripped, so the split stops at the object). The code V8 compiled from the module has no object of its")
	fmt.Fprintln(w, "own: it is what perf cannot place (`[unknown]`, anonymous memory, `[JIT]`). µs per request is the")
	fmt.Fprintln(w, "share times Envoy's CPU per request over the same chunk (at saturation: it differs from the fixed")
	fmt.Fprintln(w, "rate's above, where Envoy's event loops are not always busy).")
	fmt.Fprintln(w)
	classes := []string{"envoy (C++: HTTP, filters, the Wasm host side)", "V8-compiled module code", "kernel", "libc / ld / other"}
	classOf := dsoClass
	header := append(append([]string{"limiter", "Envoy µs/req"}, classes...), "objects (perf's names)")
	var rows [][]string
	byClass := map[perf.Limiter][]float64{}
	for _, l := range profiled {
		row := c.Row(l, wk)
		us := row.ProfileRun.CPU.Envoy
		cls := make([]float64, len(classes))
		for _, d := range row.Profile {
			cls[classOf(d.DSO)] += d.Share
		}
		byClass[l] = make([]float64, len(classes))
		cells := []string{l.Short(), fmtF(us, 1)}
		for i, s := range cls {
			byClass[l][i] = s * us
			cells = append(cells, fmt.Sprintf("%s µs (%.0f %%)", fmtF(s*us, 1), 100*s))
		}
		var objs []string
		for _, d := range row.Profile {
			objs = append(objs, fmt.Sprintf("`%s` %.0f %%", d.DSO, 100*d.Share))
		}
		rows = append(rows, append(cells, strings.Join(objs, ", ")))
	}
	table(w, header, rows)
	pt, fl, tl, ts := byClass[perf.PassThrough], byClass[perf.FloorModule], byClass[perf.TollgateLocal], byClass[perf.TollgateSynced]
	if pt == nil || fl == nil || tl == nil {
		return
	}
	diff := func(a, b []float64, i int) string { return fmtF(a[i]-b[i], 1) }
	fmt.Fprintf(w, "Above pass-through, the floor module adds %s µs in Envoy's own code, %s µs of module code and %s µs in the kernel;\n",
		diff(fl, pt, 0), diff(fl, pt, 1), diff(fl, pt, 2))
	fmt.Fprintf(w, "the filter (local only) adds %s, %s and %s µs", diff(tl, pt, 0), diff(tl, pt, 1), diff(tl, pt, 2))
	if ts != nil {
		fmt.Fprintf(w, ", synced %s, %s and %s µs", diff(ts, pt, 0), diff(ts, pt, 1), diff(ts, pt, 2))
	}
	fmt.Fprintln(w, ".")
	fmt.Fprintln(w)
}

// writeEnvoyStats lists the limiters' own counters: each decided every request.
func (r *report) writeEnvoyStats(w io.Writer) {
	c := r.envoyCompare
	fmt.Fprintln(w, "Each limiter's counters at the end of the run (that it decided the requests, and how):")
	fmt.Fprintln(w)
	var rows [][]string
	for _, row := range c.Rows {
		var keep []string
		for _, s := range row.Stats {
			if strings.HasSuffix(s, "=0") || strings.Contains(s, "bucket_table_slots=") || strings.Contains(s, "rules_version") {
				continue
			}
			keep = append(keep, "`"+s+"`")
		}
		if len(keep) == 0 {
			continue
		}
		sort.Strings(keep)
		rows = append(rows, []string{fmt.Sprintf("%s, %d worker%s", row.Limiter.Short(), row.Workers, plural(row.Workers)), strings.Join(keep, " ")})
	}
	table(w, []string{"Envoy", "counters (non-zero)"}, rows)
}

func bold(l perf.Limiter) string {
	if l == perf.TollgateSynced || l == perf.TollgateLocal {
		return "**" + l.String() + "**"
	}
	return l.String()
}

func satSpread(row *perf.CompareRow) (lo, hi float64) {
	for i, c := range row.Closed {
		if i == 0 || c.PerSec < lo {
			lo = c.PerSec
		}
		hi = max(hi, c.PerSec)
	}
	return lo, hi
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, " and ")
}

func fracList(fs []float64, except float64) string {
	var s []string
	for _, f := range fs {
		if f != except {
			s = append(s, fmtF(f, 2))
		}
	}
	return strings.Join(s, " and ")
}

// envoyReadmeRows are the README's rows of the comparison: every target, met or missed.
func (r *report) envoyReadmeRows() [][]string {
	var out [][]string
	for _, t := range r.envoyTargets() {
		out = append(out, []string{t[0], t[1] + " — " + strings.Trim(t[2], "*")})
	}
	return out
}

// readmeEnvoyPrefix opens every README row of the comparison.
const readmeEnvoyPrefix = "| in Envoy"

// spliceReadmeRows replaces the README table's rows that start with readmeEnvoyPrefix
// by rows (at the end of the measured table), leaving the other rows as they are.
func spliceReadmeRows(doc string, rows [][]string) (string, error) {
	i, j := strings.Index(doc, readmeBegin), strings.Index(doc, readmeEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("readme: no %q … %q markers", readmeBegin, readmeEnd)
	}
	var kept []string
	lastRow := -1
	for _, l := range strings.Split(doc[i:j], "\n") {
		if strings.HasPrefix(l, readmeEnvoyPrefix) {
			continue
		}
		kept = append(kept, l)
		if strings.HasPrefix(l, "|") {
			lastRow = len(kept) - 1
		}
	}
	if lastRow < 0 {
		return "", fmt.Errorf("readme: no table between the markers")
	}
	var add []string
	for _, r := range rows {
		add = append(add, "| "+strings.Join(r, " | ")+" |")
	}
	kept = slices.Insert(kept, lastRow+1, add...)
	return doc[:i] + strings.Join(kept, "\n") + doc[j:], nil
}
