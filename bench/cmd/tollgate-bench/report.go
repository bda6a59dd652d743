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

// write is the whole report: the header, the Targets tables, the sections in order.
func (r *report) write(w io.Writer, charts string) error {
	r.chartsRel = charts
	withCharts := func(write func(io.Writer, string) error) func(io.Writer) error {
		return func(w io.Writer) error { return write(w, charts) }
	}
	for _, section := range []func(io.Writer) error{
		r.writeHeader,
		r.writeTargets,
		r.writeRegimeTargets,
		r.writeEnvoyTargets,
		withCharts(r.writeScale),
		r.writeCost,
		withCharts(r.writeLoad),
		withCharts(r.writeDists),
		r.writeMemory,
		r.writeIngest,
		r.writeAdmin,
		r.writeTopCost,
		r.writeRLS,
		r.writeDiff,
		withCharts(r.writeSim),
		r.writeNotes,
		r.writePacedRegimes,
		r.writeSimRegimes,
		r.writeEnvoyBuild,
		r.writeEnvoyCompare,
	} {
		if err := section(w); err != nil {
			return err
		}
	}
	return nil
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
