package main

import (
	"fmt"
	"log"
	"os"
	"slices"
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

func satSpread(row *perf.CompareRow) (lo, hi float64) {
	for i, c := range row.Closed {
		if i == 0 || c.PerSec < lo {
			lo = c.PerSec
		}
		hi = max(hi, c.PerSec)
	}
	return lo, hi
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
