package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

type moduleSize struct {
	pkg   string
	bytes int
}

// report collects every measurement of one run.
type report struct {
	started time.Time
	elapsed time.Duration
	args    []string
	scale   float64
	machine machine

	moduleSizes []moduleSize
	costs       []perf.Cost // empty, floor, filter, filter (default key)[, first version's floor, filter]
	native      perf.Cost   // the filter's plugin code run natively, in the same rounds
	firstErr    error       // why the first version's modules were not measured
	telemetry   perf.TelemetryCost
	recipe      perf.RecipeCost
	firstPairs  []float64 // today's filter / the first version's, paired chunks, sorted
	// resp is response-based cost; respBeforeErr why the module before it was not built.
	resp          perf.RespCost
	respBeforeErr error
	shape         perf.ShapeResult
	match         perf.MatchCost
	inflight      perf.InFlightCost
	loads         map[string]perf.LoadResult
	dists         []perf.RedisCost
	shared        []perf.SharedMem
	redisMem      []perf.RedisMem
	redisRateMem  int64
	keyHashMem    []perf.KeyHashMem
	// redisIdleMsPerSec is Redis CPU per second with the service running and no load.
	redisIdleMsPerSec float64
	ingest            []perf.IngestResult
	topCost           []perf.TopCost
	diff              *perf.DiffReport
	simGateways       []perf.SimPoint
	simInterval       []perf.SimPoint
	simMesh           []perf.SimPoint
	callouts          []calloutRun
	vmMem             []perf.VMMemPoint
	admin             []perf.AdminPoint
	rls               []perf.RLSComparison
	envoyBuild        perf.EnvoyBuildCost
	httpRounds        []httpRound // the gateway-host comparison's rounds, in the order they ran
	regimes           regimeRuns  // sections 10 and 11 (regimes.go)
	// envoyCompare is section 13 (envoycompare.go), measured from envoyCompareStarted
	// with envoyCompareLoad the load average then; chartsRel is the charts' directory
	// as the report links it.
	envoyCompare        *perf.EnvoyCompare
	envoyCompareStarted time.Time
	envoyCompareLoad    string
	chartsRel           string
}

// calloutRun is one Envoy's sync callouts under load with a number of workers.
type calloutRun struct {
	workers int
	res     perf.LoadResult
}

// Chart file names.
const (
	chartGateways = "sim_gateways.png"
	chartInterval = "sim_interval.png"
	chartChecks   = "checks_per_sec.png"
	chartRedisOps = "redis_ops_per_1m.png"
	chartMesh     = "sim_mesh.png"
)

func (r *report) charts(dir string) error {
	if err := r.envoyCharts(dir); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := perf.ChartSimGateways(r.simGateways, perf.ChartPath(dir, chartGateways)); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := perf.ChartSimInterval(r.simInterval, perf.ChartPath(dir, chartInterval)); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := perf.ChartMesh(r.simMesh, perf.ChartPath(dir, chartMesh)); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	l := r.loads
	if err := perf.ChartGroupedBars("Checks/s on 2 shared cores: 10,000 keys, 8 concurrent clients, closed loop", "checks/s",
		[]string{"in-process harness (Exchange)", "through HTTP (client → gateway → upstream)"},
		[]perf.Bars{
			{Label: "pass-through (no limiter)", Values: []float64{l["pass-through"].ChecksPerSec, l["http pass-through"].ChecksPerSec}},
			{Label: "Tollgate (filter, 100 ms sync)", Values: []float64{l["tollgate"].ChecksPerSec, l["http tollgate"].ChecksPerSec}},
			{Label: "per-request redis_rate", Values: []float64{l["redis_rate"].ChecksPerSec, l["http redis_rate"].ChecksPerSec}},
		}, false, perf.ChartPath(dir, chartChecks)); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	groups := make([]string, 0, len(r.dists)+1)
	trips := perf.Bars{Label: "Redis round trips per 1M requests"}
	cmds := perf.Bars{Label: "Redis commands per 1M requests (incl. inside scripts)"}
	for _, d := range r.dists {
		groups = append(groups, "Tollgate: "+d.Dist.Name)
		trips.Values = append(trips.Values, d.RoundTripsPer1M)
		cmds.Values = append(cmds.Values, d.CommandsPer1M)
	}
	rr := l["redis_rate"]
	groups = append(groups, "per-request limiter")
	trips.Values = append(trips.Values, perf.Per1M(float64(rr.RoundTrips), rr.Checks))
	cmds.Values = append(cmds.Values, perf.Per1M(float64(rr.Redis.Commands), rr.Checks))
	if err := perf.ChartGroupedBars("Redis operations per 1M requests by key distribution (log scale)", "per 1M requests",
		groups, []perf.Bars{trips, cmds}, true, perf.ChartPath(dir, chartRedisOps)); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}

// Formatting helpers.

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	}
}

func fmtInt(v float64) string {
	neg := v < 0
	s := strconv.FormatInt(int64(math.Abs(math.Round(v))), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtF(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

func yesNo(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

func table(w io.Writer, header []string, rows [][]string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(header, " | "))
	seps := make([]string, len(header))
	for i := range seps {
		seps[i] = "---"
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

// cost returns the decision cost row of a module by position: 0 empty, 1 floor,
// 2 filter (header key), 3 filter (default key), 4 and 5 the first version's floor and
// filter (header key) when they were built.
func (r *report) cost(i int) perf.Cost {
	if i < len(r.costs) {
		return r.costs[i]
	}
	return perf.Cost{}
}

func (r *report) ingestOf(mode, path string, conc int) (perf.IngestResult, bool) {
	for _, in := range r.ingest {
		if in.Mode == mode && in.Path == path && in.Concurrency == conc {
			return in, true
		}
	}
	return perf.IngestResult{}, false
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func (r *report) write(w io.Writer, charts string) error {
	m := r.machine
	fmt.Fprintln(w, "# Tollgate benchmarks")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Generated by `make bench` (`go run ./bench/cmd/tollgate-bench -out BENCHMARKS.md`,")
	fmt.Fprintln(w, "source in `bench/cmd/tollgate-bench` and `bench/perf`). Do not edit by hand: run it again.")
	if r.scale != 1 {
		fmt.Fprintf(w, "**This run used `-scale %v`: every measured duration was scaled; the numbers are noisier than a full run.**\n", r.scale)
	}
	fmt.Fprintln(w)
	table(w, []string{"", ""}, [][]string{
		{"command", "`go run ./bench/cmd/tollgate-bench " + strings.Join(r.args, " ") + "`"},
		{"date", r.started.Format("2006-01-02 15:04 MST") + fmt.Sprintf(" (run took %s)", r.elapsed.Round(time.Second))},
		{"machine", fmt.Sprintf("%d CPUs (`nproc`), %s, %s RAM, Linux %s", m.cpus, m.model, m.memory, m.kernel)},
		{"load average at start", m.loadAvg + " (the machine is shared with other work)"},
		{"Go", fmt.Sprintf("%s, GOMAXPROCS %d", m.goVersion, m.maxprocs)},
		{"Redis", "redis-server " + m.redis + " (standalone, started by the command; a 6-node cluster for the service ingest)"},
		{"libraries", fmt.Sprintf("wazero %s (compiler engine), go-redis %s, redis_rate %s", m.depVersion["github.com/tetratelabs/wazero"],
			m.depVersion["github.com/redis/go-redis/v9"], m.depVersion["github.com/go-redis/redis_rate/v10"])},
		{"modules", r.moduleList()},
	})
	fmt.Fprintln(w, "Everything — load generator, wasm host, sync service, upstream and Redis — runs on the")
	fmt.Fprintln(w, "same 2 cores, so each component takes CPU from the others; see [Notes](#9-notes-two-shared-cores).")
	fmt.Fprintln(w)

	r.writeTargets(w)
	r.writeRegimeTargets(w)
	r.writeEnvoyTargets(w)
	r.writeScale(w, charts)
	r.writeCost(w)
	r.writeLoad(w, charts)
	r.writeDists(w, charts)
	r.writeMemory(w)
	r.writeIngest(w)
	r.writeAdmin(w)
	r.writeTopCost(w)
	r.writeRLS(w)
	r.writeDiff(w)
	r.writeSim(w, charts)
	r.writeNotes(w)
	r.writePacedRegimes(w)
	r.writeSimRegimes(w)
	r.writeEnvoyBuild(w)
	r.chartsRel = charts
	r.writeEnvoyCompare(w)
	return nil
}

func (r *report) moduleList() string {
	var parts []string
	for _, ms := range r.moduleSizes {
		parts = append(parts, fmt.Sprintf("`%s` %.1f MB", ms.pkg, float64(ms.bytes)/1e6))
	}
	return strings.Join(parts, ", ")
}

func (r *report) writeTargets(w io.Writer) {
	l := r.loads
	fmt.Fprintln(w, "## Targets")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The rows of this first table are measured on the project's own host (wazero and its Go host). They")
	fmt.Fprintln(w, "stand for what a real Envoy cannot measure — the fleet simulation, the Redis cost sweeps, allocation")
	fmt.Fprintln(w, "counts, the decision in isolation. The decision's cost against the floor module, requests/s against")
	fmt.Fprintf(w, "pass-through and added latency are also measured in real Envoys ([section 13](%s)); there the Envoy\n", envoyCompareAnchor)
	fmt.Fprintln(w, "rows below are the ones the targets are judged on.")
	fmt.Fprintln(w)
	floor, real := r.cost(1), r.cost(2)
	costRatio := ratio(real.NsPerRequest, floor.NsPerRequest)
	tg, rr := l["tollgate"], l["redis_rate"]
	checksRatio := ratio(tg.ChecksPerSec, rr.ChecksPerSec)
	ptg, prr := l["paced tollgate"], l["paced redis_rate"]
	p99Ratio := ratio(float64(ptg.P99), float64(prr.P99))
	var hot perf.RedisCost
	if len(r.dists) > 0 {
		hot = r.dists[0]
	}
	worstShared, worstAlgo, worstID := 0, "", 0.0
	for _, s := range r.shared {
		if s.Synced && s.Algo != "sliding_window_log" && s.MaxRecord > worstShared {
			worstShared, worstAlgo, worstID = s.MaxRecord, s.Algo, s.IDBytes
		}
	}
	raw4, _ := r.ingestOf("standalone", "raw store.Apply", 4)
	http4, _ := r.ingestOf("standalone", "POST /v1/sync", 4)
	svcRatio := ratio(http4.DeltasPerSec, raw4.DeltasPerSec)
	d := r.diff
	diffOK := d != nil && len(d.Failures) == 0 && d.GoLuaMismatches == 0 && d.MaxRetryDiffUs <= 1000
	rows := [][]string{
		{"filter decision ≤ 1.5× the floor module", fmt.Sprintf("%.2f× (%s vs %s ns)", costRatio, fmtInt(real.NsPerRequest), fmtInt(floor.NsPerRequest)), yesNo(costRatio <= 1.5)},
		{"failing that, ≥ 2× faster than the first version, same run (the rounds and the paired chunks)", r.firstLine(), yesNo(r.firstMet())},
		{"through the gateway host, 10,000 keys: ≥ 80 % of the pass-through module's requests/s", fmt.Sprintf("%.0f %% (%s vs %s req/s)", 100*ratio(l["http tollgate"].ChecksPerSec, l["http pass-through"].ChecksPerSec),
			fmtInt(l["http tollgate"].ChecksPerSec), fmtInt(l["http pass-through"].ChecksPerSec)) + httpFloorNote(l) + r.httpRoundsNote(), yesNo(ratio(l["http tollgate"].ChecksPerSec, l["http pass-through"].ChecksPerSec) >= 0.8)},
		{"per-rule stats and decision metadata add ≤ 10 % to the decision", r.telemetryLine(), yesNo(r.telemetry.Off.NsPerRequest > 0 && r.telemetry.Overhead() <= 0.10)},
		{"three match conditions (host + path prefix + header exact) ≤ 1.15× a prefix match", fmt.Sprintf("%.3f× (%s vs %s ns)", r.match.Ratio(),
			fmtInt(r.match.Three.NsPerRequest), fmtInt(r.match.Prefix.NsPerRequest)), yesNo(r.match.Ratio() > 0 && r.match.Ratio() <= 1.15)},
		{"a cost_from rule adds ≤ 10 % to a request its rule does not match", fmt.Sprintf("%+.1f %% (%s vs %s ns)", 100*(r.resp.OtherRatio()-1),
			fmtInt(r.resp.Other.NsPerRequest), fmtInt(r.resp.None.NsPerRequest)), yesNo(r.resp.OtherRatio() > 0 && r.resp.OtherRatio() <= 1.10)},
		{"no cost_from rule: 0 added (vs the module before response cost)", r.respNoneLine(), yesNo(r.resp.NoneRatio() > 0 && r.resp.NoneRatio() <= 1.05)},
		{"shaping: a held burst reaches the upstream at the rule's spacing (10 ms), none refused within max_delay", r.shapeLine(),
			yesNo(r.shape.Through >= 101 && r.shape.Refused > 0 && r.shape.GapMean >= 9*time.Millisecond && r.shape.GapMean <= 11*time.Millisecond)},
		{"held requests hold no worker: another caller's latency while they are held ≤ 1.2× idle", fmt.Sprintf("%.2f× (%s vs %s)",
			ratio(float64(r.shape.OtherHeld), float64(r.shape.OtherIdle)), fmtDur(r.shape.OtherHeld), fmtDur(r.shape.OtherIdle)),
			yesNo(r.shape.OtherIdle > 0 && ratio(float64(r.shape.OtherHeld), float64(r.shape.OtherIdle)) <= 1.2)},
		r.envoyBuildTarget(),
		{"≤ 2 host→guest allocations per single-rule request", fmt.Sprintf("%s (key from a header); %s with the default key (IP fallback)", fmtF(real.AllocsPerRequest, 2), fmtF(r.cost(3).AllocsPerRequest, 2)), yesNo(real.AllocsPerRequest <= 2)},
		{"≥ 20× the checks/s of a per-request Redis limiter", fmt.Sprintf("%.2f× (%s vs %s checks/s, 10k keys, 8 clients)", checksRatio, fmtInt(tg.ChecksPerSec), fmtInt(rr.ChecksPerSec)), yesNo(checksRatio >= 20)},
		{"≤ 1/100 of its p99 added latency", fmt.Sprintf("%s of it (%s vs %s at %s req/s)", fmtRatio(p99Ratio), fmtDur(ptg.P99), fmtDur(prr.P99), fmtInt(pacedRate)), yesNo(p99Ratio > 0 && p99Ratio <= 0.01)},
		{"≤ 1,000 Redis round trips per 1M requests on a hot key", fmtInt(hot.RoundTripsPer1M), yesNo(hot.RoundTripsPer1M <= 1000)},
		{"≤ 64 B per bucket in shared data", fmt.Sprintf("%d B record at most (%s, synced); the slot value adds the %s B bucket id", worstShared, worstAlgo, fmtF(worstID, 0)), yesNo(worstShared > 0 && worstShared <= 64)},
		{"service ≥ 80 % of raw batched Lua", fmt.Sprintf("%.0f %% (%s vs %s deltas/s, 4 concurrent batches)", 100*svcRatio, fmtInt(http4.DeltasPerSec), fmtInt(raw4.DeltasPerSec)), yesNo(svcRatio >= 0.8)},
		{"same decisions as redis_rate, retry-after within 1 ms", r.diffLine(), yesNo(diffOK)},
		r.rlsTarget(),
	}
	table(w, []string{"target", "measured", ""}, rows)
}

func fmtRatio(x float64) string {
	if x <= 0 {
		return "n/a"
	}
	if x >= 1 {
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("1/%.0f", 1/x)
}

func (r *report) diffLine() string {
	d := r.diff
	if d == nil {
		return "not run"
	}
	return fmt.Sprintf("%d requests: %d decisions differ off a boundary, Go = Lua bit for bit (%d mismatches), retry-after within %.1f µs",
		d.Steps, d.Flips-d.BoundaryFlips, d.GoLuaMismatches, d.MaxRetryDiffUs)
}

// shapeLine is the shaping target's cell.
func (r *report) shapeLine() string {
	c := r.shape
	return fmt.Sprintf("burst of %d at 100/s, max_delay 1 s: %d through (1 at once, 100 held, and what refilled while the burst arrived), %d refused; gaps mean %s, median %s, %s–%s (5 ms tick)",
		c.Burst, c.Through, c.Refused, fmtDur(c.GapMean), fmtDur(c.GapP50), fmtDur(c.GapMin), fmtDur(c.GapMax))
}

// respNoneLine is the cell of the "no cost_from rule" target.
func (r *report) respNoneLine() string {
	if r.resp.Before.NsPerRequest == 0 {
		if r.respBeforeErr != nil {
			return "not measured: " + oneLine(r.respBeforeErr)
		}
		return "not measured"
	}
	return fmt.Sprintf("%+.1f %% (%s ns now, %s ns at %s; within ±5 %% counts as the rounds' noise)", 100*(r.resp.NoneRatio()-1),
		fmtInt(r.resp.None.NsPerRequest), fmtInt(r.resp.Before.NsPerRequest), perf.BeforeResponseCost)
}

// spread is the min–max of the rounds' ns per request.
func spread(roundsNs []float64) string {
	if len(roundsNs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%s–%s", fmtInt(slices.Min(roundsNs)), fmtInt(slices.Max(roundsNs)))
}

// firstSpeedup is how many times faster today's filter decides than the first
// version's, in the same rounds (0: not measured).
func (r *report) firstSpeedup() float64 {
	return ratio(r.cost(5).NsPerRequest, r.cost(2).NsPerRequest)
}

// firstMet: at least 2× faster in the rounds and, when they ran, in the paired chunks.
// The rounds' medians of the two modules move apart with load from elsewhere (from
// 1.6× to 2.1× between runs of the same code on one machine); the pairs move less,
// and a target met in one and not the other is not met.
func (r *report) firstMet() bool {
	if n := len(r.firstPairs); n > 0 && 1/r.firstPairs[n/2] < 2 {
		return false
	}
	return r.firstSpeedup() >= 2
}

func (r *report) firstLine() string {
	if r.cost(5).NsPerRequest == 0 {
		if r.firstErr != nil {
			return "not measured: " + oneLine(r.firstErr)
		}
		return "not measured"
	}
	line := fmt.Sprintf("%.2f× (%s ns at %s, %s ns now)", r.firstSpeedup(), fmtInt(r.cost(5).NsPerRequest), perf.FirstVersion, fmtInt(r.cost(2).NsPerRequest))
	if n := len(r.firstPairs); n > 0 {
		line += fmt.Sprintf("; paired chunks %.2f×", 1/r.firstPairs[n/2])
	}
	return line
}

// httpFloorNote puts the floor module's share through HTTP beside the filter's: what
// the host's own calls cost any filter there.
func httpFloorNote(l map[string]perf.LoadResult) string {
	hf, hp := l["http floor"], l["http pass-through"]
	if hf.ChecksPerSec == 0 || hp.ChecksPerSec == 0 {
		return ""
	}
	return fmt.Sprintf("; the floor module %.0f %%", 100*ratio(hf.ChecksPerSec, hp.ChecksPerSec))
}

// telemetryLine is the telemetry target's cell: the paired-chunk overhead, with the
// rounds' medians beside it (they are the coarser comparison and can disagree).
func (r *report) telemetryLine() string {
	t := r.telemetry
	if n := len(t.PairRatios); n > 0 {
		return fmt.Sprintf("%+.1f %% (median of %s paired chunks, telemetry on vs off; the rounds' medians %s vs %s ns)",
			100*t.Overhead(), fmtInt(float64(n)), fmtInt(t.On.NsPerRequest), fmtInt(t.Off.NsPerRequest))
	}
	return fmt.Sprintf("%+.1f %% (%s vs %s ns, telemetry on vs off)", 100*t.Overhead(), fmtInt(t.On.NsPerRequest), fmtInt(t.Off.NsPerRequest))
}

// oneLine is the first line of err, for a table cell.
func oneLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

func hostCalls(m map[string]float64) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %s", strings.TrimPrefix(k, "proxy_"), fmtF(m[k], 2)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// rlsAt returns the gRPC section's comparison at keys caller keys.
func (r *report) rlsAt(keys int) (perf.RLSComparison, bool) {
	for _, c := range r.rls {
		if c.Keys == keys {
			return c, true
		}
	}
	return perf.RLSComparison{}, false
}

// rlsTarget is the targets-table row of the gRPC section.
func (r *report) rlsTarget() []string {
	const what = "gRPC ShouldRateLimit from leases: Redis CPU per check ≤ 1/20 of every check in Redis, service CPU per check no higher (10 and 10,000 keys)"
	if len(r.rls) == 0 {
		return []string{what, "not run", yesNo(false)}
	}
	var parts []string
	ok := true
	for _, c := range r.rls {
		red := ratio(c.Leases.RedisCPUPerCheck(), c.Strict.RedisCPUPerCheck())
		svc := ratio(c.Leases.ServiceCPUPerCheck(), c.Strict.ServiceCPUPerCheck())
		parts = append(parts, fmt.Sprintf("%s keys: Redis %s, service %s", fmtInt(float64(c.Keys)), fmtRatio(red), fmtF(svc, 2)))
		ok = ok && c.Leases.Load.Checks > 0 && c.Strict.Load.Checks > 0 && red <= 1.0/20 && svc <= 1
	}
	return []string{what, strings.Join(parts, "; "), yesNo(ok)}
}

// loadRow and loadHeader are a load run's row in the tables of sections 0 and 10.
func loadRow(name string, x perf.LoadResult, redisRT bool) []string {
	rt := fmtF(ratio(float64(x.RoundTrips), float64(x.Checks)), 4)
	if !redisRT {
		rt = "–"
	}
	return []string{name, fmtInt(x.ChecksPerSec), fmtDur(x.P50), fmtDur(x.P99), fmtDur(x.P999),
		fmtF(x.RedisCPUPerCheck(), 2), fmtF(perf.Per1M(float64(x.Redis.Commands), x.Checks)/1e6, 3), rt,
		fmtF(100*ratio(float64(x.Admitted), float64(x.Checks)), 1)}
}

var loadHeader = []string{"limiter", "checks/s", "p50", "p99", "p99.9", "Redis CPU µs/check", "Redis commands/check", "Redis round trips/check", "admitted %"}
