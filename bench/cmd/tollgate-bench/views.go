package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/bench/sim"
)

// Each section's view: every number its template prints, computed here once.

// costRow is one module of section 1's table: its measurement and its time over the
// floor module's (the first version's over its own floor).
type costRow struct {
	perf.Cost
	VsFloor float64
}

// costView is section 1, the decision cost in the filter.
type costView struct {
	Rows   []costRow
	Native *costRow // the plugin code run natively, when measured
	// The filter (header key) against the floor and the empty module.
	FilterGuestNs, FloorGuestNs, EmptyGuestNs float64
	AboveFloorNs, GuestAboveFloorNs           float64
	FilterHostCalls, FloorHostCalls           float64
	DefaultKeyMoreCalls                       bool // the default key makes more host calls
	DefaultKeyHostCalls                       float64
	Rest                                      *nativeView
	FirstVersion                              string
	First                                     *firstView
	FirstErr                                  string // why the first version was not measured
	Recipe                                    *recipeView
	Telemetry                                 telemetryView
	Resp                                      respView
	InFlight                                  *inFlightView
}

// nativeView accounts for the decision with the native row.
type nativeView struct {
	NativeNs, NativeVsFloor          float64
	GuestNs, GuestVsNative           float64
	GuestAboveFloorNs, AboveVsNative float64
	Budget, BudgetShare              float64 // the module's own code at 1.5× the floor
	Budgeted                         bool    // Budget > 0
}

// firstView is the first version against today's filter.
type firstView struct {
	Ns, VsOwnFloor, NowNs, Speedup float64
	GuestNs, NowGuestNs            float64
	Pairs                          int // paired chunks (0: none)
	PairMedian, PairQ1, PairQ3     float64
	PairSpeedup                    float64
}

// recipeView is what the build steps after the Go toolchain's give.
type recipeView struct {
	Rows                      []recipeRow
	Pairs                     int
	ThreadRatio, ProfileRatio float64
}

type recipeRow struct {
	perf.Cost
	MB float64
}

// telemetryView is the filter with telemetry off and on.
type telemetryView struct {
	Rows                 []perf.Cost
	Pairs                int
	RoundsDiff, Overhead float64
}

// respView is what response-based cost costs.
type respView struct {
	Rows              []perf.Cost
	Header, JSON, SSE float64 // ns following the response adds, by format
}

// inFlightView is what max_in_flight costs.
type inFlightView struct {
	Rows  []perf.Cost
	Ratio float64
}

func (r *report) costView() costView {
	real, fl, empty := r.cost(2), r.cost(1), r.cost(0)
	v := costView{
		FilterGuestNs: real.GuestNsPerRequest, FloorGuestNs: fl.GuestNsPerRequest, EmptyGuestNs: empty.GuestNsPerRequest,
		AboveFloorNs: real.NsPerRequest - fl.NsPerRequest, GuestAboveFloorNs: real.GuestNsPerRequest - fl.GuestNsPerRequest,
		FilterHostCalls: real.HostCallsPerRequest, FloorHostCalls: fl.HostCallsPerRequest,
		FirstVersion: perf.FirstVersion,
	}
	for i, c := range r.costs {
		floor := fl.NsPerRequest
		if i >= 4 {
			floor = r.cost(4).NsPerRequest // the first version against its own floor
		}
		v.Rows = append(v.Rows, costRow{c, ratio(c.NsPerRequest, floor)})
	}
	if n := r.native; n.NsPerRequest > 0 {
		v.Native = &costRow{n, ratio(n.NsPerRequest, fl.NsPerRequest)}
	}
	if def := r.cost(3); def.HostCallsPerRequest > real.HostCallsPerRequest {
		v.DefaultKeyMoreCalls, v.DefaultKeyHostCalls = true, def.HostCallsPerRequest
	}
	if n := r.native; n.NsPerRequest != 0 && real.GuestNsPerRequest != 0 {
		hostPart := real.NsPerRequest - real.GuestNsPerRequest // wazero and the host, per request
		budget := 1.5*fl.NsPerRequest - hostPart
		v.Rest = &nativeView{
			NativeNs: n.NsPerRequest, NativeVsFloor: ratio(n.NsPerRequest, fl.NsPerRequest),
			GuestNs: real.GuestNsPerRequest, GuestVsNative: ratio(real.GuestNsPerRequest, n.NsPerRequest),
			GuestAboveFloorNs: v.GuestAboveFloorNs, AboveVsNative: ratio(v.GuestAboveFloorNs, n.NsPerRequest),
			Budget: budget, BudgetShare: ratio(budget, real.GuestNsPerRequest), Budgeted: budget > 0,
		}
	}
	if first := r.cost(5); first.NsPerRequest > 0 {
		f := &firstView{Ns: first.NsPerRequest, VsOwnFloor: ratio(first.NsPerRequest, r.cost(4).NsPerRequest), NowNs: real.NsPerRequest,
			Speedup: r.firstSpeedup(), GuestNs: first.GuestNsPerRequest, NowGuestNs: real.GuestNsPerRequest}
		if n := len(r.firstPairs); n > 0 {
			f.Pairs, f.PairMedian, f.PairQ1, f.PairQ3 = n, r.firstPairs[n/2], r.firstPairs[n/4], r.firstPairs[3*n/4]
			f.PairSpeedup = 1 / r.firstPairs[n/2]
		}
		v.First = f
	} else if r.firstErr != nil {
		v.FirstErr = oneLine(r.firstErr)
	}
	if c := r.recipe; c.Shipped.NsPerRequest != 0 {
		v.Recipe = &recipeView{
			Rows: []recipeRow{{c.Shipped, float64(c.ShippedBytes) / 1e6}, {c.Unthreaded, float64(c.UnthreadedBytes) / 1e6},
				{c.Unprofiled, float64(c.UnprofiledBytes) / 1e6}},
			Pairs: len(c.ThreadPairs), ThreadRatio: c.ThreadRatio(), ProfileRatio: c.ProfileRatio(),
		}
	}
	t := r.telemetry
	v.Telemetry = telemetryView{Rows: []perf.Cost{t.Off, t.On}, Pairs: len(t.PairRatios),
		RoundsDiff: ratio(t.On.NsPerRequest-t.Off.NsPerRequest, t.Off.NsPerRequest), Overhead: t.Overhead()}
	c := r.resp
	for _, x := range []perf.Cost{c.Before, c.None, c.Other, c.Plain["header"], c.Charged["header"],
		c.Plain["json"], c.Charged["json"], c.Plain["sse"], c.Charged["sse"]} {
		if x.NsPerRequest > 0 {
			v.Resp.Rows = append(v.Resp.Rows, x)
		}
	}
	v.Resp.Header, v.Resp.JSON, v.Resp.SSE = c.ParseNs("header"), c.ParseNs("json"), c.ParseNs("sse")
	if in := r.inflight; in.Off.NsPerRequest > 0 {
		v.InFlight = &inFlightView{Rows: []perf.Cost{in.Off, in.On}, Ratio: in.Ratio()}
	}
	return v
}

func (r *report) writeCost(w io.Writer) error { return render(w, "cost", r.costView()) }

// runRow is one limiter's run in section 2's tables.
type runRow struct {
	Name               string
	ChecksPerSec       float64
	P50, P99, P999     time.Duration
	RedisCPUPerCheck   float64 // µs
	CommandsPerCheck   float64
	Synced             bool // round trips are the limiter's own (else "–")
	RoundTripsPerCheck float64
	AdmittedPct        float64
}

func newRunRow(name string, x perf.LoadResult, synced bool) runRow {
	return runRow{Name: name, ChecksPerSec: x.ChecksPerSec, P50: x.P50, P99: x.P99, P999: x.P999,
		RedisCPUPerCheck: x.RedisCPUPerCheck(), CommandsPerCheck: perf.Per1M(float64(x.Redis.Commands), x.Checks) / 1e6,
		Synced: synced, RoundTripsPerCheck: ratio(float64(x.RoundTrips), float64(x.Checks)),
		AdmittedPct: 100 * ratio(float64(x.Admitted), float64(x.Checks))}
}

// capacityRow is what one Redis core could carry at a workload's Redis CPU per check.
type capacityRow struct {
	Workload      string
	CPUPerCheck   float64 // µs
	ChecksPerCore float64
}

func newCapacityRow(name string, cpuUs float64) capacityRow {
	return capacityRow{name, cpuUs, 1e6 / max(cpuUs, 1e-3)}
}

// loadView is section 2, Tollgate against a per-request Redis limiter.
type loadView struct {
	Saturated                        []runRow
	Speedup                          float64 // Tollgate's checks/s over redis_rate's
	AcquiresPerCheck, DeltasPerCheck float64
	PacedRate                        float64
	Paced                            []runRow
	P50Ratio, P99Ratio               float64
	TgP50, RrP50, TgP99, RrP99       time.Duration
	LocalP99                         time.Duration
	Capacity                         []capacityRow
	HTTPRounds                       int // interleaved rounds through HTTP, when more than one
	HTTP                             []runRow
	PassRPS, TgRPS, RrRPS            float64
	TgShare, RrShare                 float64 // of pass-through's requests/s
	Floor                            *httpFloorView
	Charts, Chart                    string
}

// httpFloorView is the floor module through HTTP.
type httpFloorView struct {
	RPS, Share, TgOfFloor float64
}

func (r *report) loadView(charts string) loadView {
	l := r.loads
	tg, rr := l["tollgate"], l["redis_rate"]
	ptg, prr := l["paced tollgate"], l["paced redis_rate"]
	hp, ht, hr := l["http pass-through"], l["http tollgate"], l["http redis_rate"]
	v := loadView{
		Saturated: []runRow{
			newRunRow("pass-through (no limiter)", l["pass-through"], false),
			newRunRow("Tollgate, local only (no sync)", l["tollgate local"], false),
			newRunRow("**Tollgate, 100 ms sync**", tg, true),
			newRunRow("**per-request redis_rate**", rr, true),
			newRunRow("Tollgate, 100 ms sync, 100 keys", l["tollgate 100 keys"], true),
			newRunRow("per-request redis_rate, 100 keys", l["redis_rate 100 keys"], true),
		},
		Speedup:          ratio(tg.ChecksPerSec, rr.ChecksPerSec),
		AcquiresPerCheck: ratio(float64(tg.Metrics["tollgate.acquires"]), float64(tg.Checks)),
		DeltasPerCheck:   ratio(float64(tg.Metrics["tollgate.sync_deltas_sent"]), float64(tg.Checks)),
		PacedRate:        pacedRate,
		Paced: []runRow{
			newRunRow("pass-through (no limiter)", l["paced pass-through"], false),
			newRunRow("Tollgate, local only (no sync)", l["paced tollgate local"], false),
			newRunRow("**Tollgate, 100 ms sync**", ptg, true),
			newRunRow("**per-request redis_rate**", prr, true),
		},
		P50Ratio: ratio(float64(ptg.P50), float64(prr.P50)), P99Ratio: ratio(float64(ptg.P99), float64(prr.P99)),
		TgP50: ptg.P50, RrP50: prr.P50, TgP99: ptg.P99, RrP99: prr.P99, LocalP99: l["paced tollgate local"].P99,
		Capacity: []capacityRow{
			newCapacityRow("per-request redis_rate, 10,000 keys", rr.RedisCPUPerCheck()),
			newCapacityRow("Tollgate, 10,000 uniform keys", tg.RedisCPUPerCheck()),
			newCapacityRow("Tollgate, 100 keys", l["tollgate 100 keys"].RedisCPUPerCheck()),
		},
		HTTP: []runRow{
			newRunRow("pass-through (no limiter)", hp, false),
			newRunRow("floor module (its host calls, no logic)", l["http floor"], false),
			newRunRow("**Tollgate, 100 ms sync**", ht, true),
			newRunRow("**per-request redis_rate**", hr, true),
		},
		PassRPS: hp.ChecksPerSec, TgRPS: ht.ChecksPerSec, RrRPS: hr.ChecksPerSec,
		TgShare: ratio(ht.ChecksPerSec, hp.ChecksPerSec), RrShare: ratio(hr.ChecksPerSec, hp.ChecksPerSec),
		Charts: charts, Chart: chartChecks,
	}
	for _, d := range r.dists {
		v.Capacity = append(v.Capacity, newCapacityRow("Tollgate, "+d.Dist.Name+" (section 3)", d.CPUSecPer1M))
	}
	if n := len(r.httpRounds); n > 1 {
		v.HTTPRounds = n
	}
	if hf := l["http floor"]; hf.ChecksPerSec > 0 {
		v.Floor = &httpFloorView{RPS: hf.ChecksPerSec, Share: ratio(hf.ChecksPerSec, hp.ChecksPerSec), TgOfFloor: ratio(ht.ChecksPerSec, hf.ChecksPerSec)}
	}
	return v
}

func (r *report) writeLoad(w io.Writer, charts string) error {
	return render(w, "load", r.loadView(charts))
}

// distRow is one key distribution of section 3.
type distRow struct {
	perf.RedisCost
	Requests          int64
	RPS, PenalizedPct float64
	CPUPerDelta       float64 // Redis CPU µs per delta, idle baseline subtracted
	HasCPUPerDelta    bool    // enough deltas for the baseline's noise
}

// distsView is section 3, Redis round trips and CPU per 1M requests.
type distsView struct {
	IdleMsPerSec float64
	Rows         []distRow
	// RedisRate is the per-request limiter's row, from section 2.
	RedisRate                                     perf.LoadResult
	RRAdmittedPct                                 float64
	RRRoundTrips, RRScripts, RRCommands, RRCPUSec float64 // per 1M requests
	Charts, Chart                                 string
}

func (r *report) distsView(charts string) distsView {
	rr := r.loads["redis_rate"]
	v := distsView{IdleMsPerSec: r.redisIdleMsPerSec, RedisRate: rr,
		RRAdmittedPct: 100 * ratio(float64(rr.Admitted), float64(rr.Checks)),
		RRRoundTrips:  perf.Per1M(float64(rr.RoundTrips), rr.Checks), RRScripts: perf.Per1M(float64(rr.Redis.Scripts()), rr.Checks),
		RRCommands: perf.Per1M(float64(rr.Redis.Commands), rr.Checks), RRCPUSec: perf.Per1M(rr.Redis.CPU, rr.Checks),
		Charts: charts, Chart: chartRedisOps}
	for _, d := range r.dists {
		x := d.Load
		row := distRow{RedisCost: d, Requests: x.Checks, RPS: x.ChecksPerSec,
			PenalizedPct: 100 * ratio(float64(x.Metrics["tollgate.requests_penalized"]), float64(x.Checks))}
		row.CPUPerDelta, row.HasCPUPerDelta = r.cpuPerDelta(d)
		v.Rows = append(v.Rows, row)
	}
	return v
}

// cpuPerDelta is Redis CPU per delta (µs) of a distribution run, idle baseline
// subtracted; false when the run sent too few deltas for the baseline's noise.
func (r *report) cpuPerDelta(d perf.RedisCost) (float64, bool) {
	deltas := d.Load.Metrics["tollgate.sync_deltas_sent"]
	if deltas < 1000 {
		return 0, false
	}
	cpu := d.Load.Redis.CPU - r.redisIdleMsPerSec/1e3*d.Load.Elapsed.Seconds()
	return max(cpu, 0) * 1e6 / float64(deltas), true
}

func (r *report) writeDists(w io.Writer, charts string) error {
	return render(w, "dists", r.distsView(charts))
}

// memoryView is section 4, memory per bucket.
type memoryView struct {
	MemKeys, VMMemKeys int
	Shared             []perf.SharedMem
	Shapes             []string // fleet shapes, the Redis table's columns
	Redis              []redisMemRow
	RedisRateBytes     int64
	RedisRatePad       []struct{} // empty cells after redis_rate's
	KeyHash            []perf.KeyHashMem
	VM                 []vmMemRow
}

type redisMemRow struct {
	Algo  string
	Cells []perf.RedisMem
}

type vmMemRow struct {
	Requests int64
	Elapsed  string
	MiB      float64
}

func (r *report) memoryView() memoryView {
	v := memoryView{MemKeys: memKeys, VMMemKeys: vmMemKeys, Shared: r.shared, RedisRateBytes: r.redisRateMem, KeyHash: r.keyHashMem}
	shapes := map[[2]int]bool{}
	var order [][2]int
	byAlgo := map[string]map[[2]int]perf.RedisMem{}
	for _, rm := range r.redisMem {
		sh := [2]int{rm.Nodes, rm.Workers}
		if !shapes[sh] {
			shapes[sh] = true
			order = append(order, sh)
			v.Shapes = append(v.Shapes, fmt.Sprintf("%d gateway × %d worker", sh[0], sh[1]))
		}
		if byAlgo[rm.Algo] == nil {
			byAlgo[rm.Algo] = map[[2]int]perf.RedisMem{}
		}
		byAlgo[rm.Algo][sh] = rm
	}
	for _, a := range perf.Algorithms {
		row := redisMemRow{Algo: a}
		for _, sh := range order {
			row.Cells = append(row.Cells, byAlgo[a][sh])
		}
		v.Redis = append(v.Redis, row)
	}
	v.RedisRatePad = make([]struct{}, max(len(order)-1, 0))
	for _, p := range r.vmMem {
		v.VM = append(v.VM, vmMemRow{p.Requests, p.Elapsed.Round(time.Second).String(), float64(p.Bytes) / (1 << 20)})
	}
	return v
}

func (r *report) writeMemory(w io.Writer) error { return render(w, "memory", r.memoryView()) }

// ingestRow is one Redis and sender count of section 5: raw batched Lua against the
// service.
type ingestRow struct {
	Mode               string
	Concurrency        int
	Raw, Service       perf.IngestResult
	Share              float64 // service / raw deltas/s
	HasCPU             bool
	RawCPU, ServiceCPU float64 // Redis CPU µs per delta
}

func (r *report) ingestView() []ingestRow {
	var rows []ingestRow
	for _, mode := range []string{"standalone", "cluster"} {
		for _, conc := range []int{1, 4} {
			raw, ok1 := r.ingestOf(mode, "raw store.Apply", conc)
			svc, ok2 := r.ingestOf(mode, "POST /v1/sync", conc)
			if !ok1 || !ok2 {
				continue
			}
			row := ingestRow{Mode: mode, Concurrency: conc, Raw: raw, Service: svc, Share: ratio(svc.DeltasPerSec, raw.DeltasPerSec)}
			if raw.Redis.CPU > 0 {
				row.HasCPU = true
				row.RawCPU = raw.Redis.CPU * 1e6 / float64(raw.Batches*perf.IngestBatch)
				row.ServiceCPU = svc.Redis.CPU * 1e6 / float64(max(svc.Batches, 1)*perf.IngestBatch)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

func (r *report) writeIngest(w io.Writer) error { return render(w, "ingest", r.ingestView()) }

// adminView is the admin API at scale.
type adminView struct {
	Samples                  int
	Points                   []perf.AdminPoint
	Growth                   bool // more than one size: the first against the last
	FirstKeys, LastKeys      int
	UsageGrowth, ResetGrowth float64
}

func (r *report) adminView() adminView {
	v := adminView{Samples: adminSamples, Points: r.admin}
	if n := len(r.admin); n > 1 {
		first, last := r.admin[0], r.admin[n-1]
		v.Growth, v.FirstKeys, v.LastKeys = true, first.Keys, last.Keys
		v.UsageGrowth = ratio(float64(last.UsageP50), float64(first.UsageP50))
		v.ResetGrowth = ratio(float64(last.ResetP50), float64(first.ResetP50))
	}
	return v
}

func (r *report) writeAdmin(w io.Writer) error { return render(w, "admin", r.adminView()) }

// topCostRow is the hot-key lists' Redis cost at one flush interval.
type topCostRow struct {
	perf.TopCost
	Share float64 // flushes' Redis time over the lease scripts'
}

func (r *report) topCostView() []topCostRow {
	var rows []topCostRow
	for _, c := range r.topCost {
		rows = append(rows, topCostRow{c, c.Ratio()})
	}
	return rows
}

func (r *report) writeTopCost(w io.Writer) error { return render(w, "topcost", r.topCostView()) }

// diffView is section 7, the differential check against redis_rate.
type diffView struct {
	Rules    []diffRule
	D        *perf.DiffReport // nil: not run
	Failures int
}

// diffRule is one GCRA rule the differential replays.
type diffRule struct {
	Limit  int64
	Window time.Duration
	Burst  int64
}

func (r *report) diffView() diffView {
	v := diffView{D: r.diff}
	if r.diff != nil {
		v.Failures = len(r.diff.Failures)
	}
	for _, p := range perf.DiffParams {
		v.Rules = append(v.Rules, diffRule{p.Limit, time.Duration(p.WindowUs) * time.Microsecond, int64(p.Capacity())})
	}
	return v
}

func (r *report) writeDiff(w io.Writer) error { return render(w, "diff", r.diffView()) }

// simView is section 8, the fleet simulation.
type simView struct {
	Keys                int
	Duration            time.Duration
	Gateways, Intervals simSweep
	PenaltyPct          float64 // of the bursty clients' false rejections over the gateway sweep
	HasPenaltyShare     bool
	Charts              string
	ChartGateways       string
	ChartInterval       string
}

// simSweep is one sweep's table: what varies (its first column) and a row per value.
type simSweep struct {
	Name string
	Rows []simRow
}

// simRow is one point of a sweep: its three scenarios side by side.
type simRow struct {
	X                   string
	Adv, Bursty, Ninety sim.Result
}

// simRows groups a sweep's points by x, in the order the sweep ran them.
func simRows(points []perf.SimPoint, x func(perf.SimPoint) string) []simRow {
	byX := map[string]map[string]perf.SimPoint{}
	var xs []string
	for _, p := range points {
		k := x(p)
		if byX[k] == nil {
			byX[k] = map[string]perf.SimPoint{}
			xs = append(xs, k)
		}
		byX[k][p.Scenario] = p
	}
	var rows []simRow
	for _, k := range xs {
		rows = append(rows, simRow{k, byX[k]["adversarial 10x"].Result, byX[k]["bursty"].Result, byX[k]["ninety"].Result})
	}
	return rows
}

func (r *report) simView(charts string) simView {
	v := simView{Keys: perf.SimKeys, Duration: perf.SimDuration,
		Gateways:  simSweep{"gateways", simRows(r.simGateways, func(p perf.SimPoint) string { return strconv.Itoa(p.Gateways) })},
		Intervals: simSweep{"sync interval (4 gateways)", simRows(r.simInterval, func(p perf.SimPoint) string { return p.Interval.String() })},
		Charts:    charts, ChartGateways: chartGateways, ChartInterval: chartInterval}
	var fr, pen int64
	for _, p := range r.simGateways {
		if p.Scenario == "bursty" {
			b := p.Result.FalseBy
			fr += b.Local + b.Service + b.Penalty + b.Degraded
			pen += b.Penalty
		}
	}
	if fr > 0 {
		v.PenaltyPct, v.HasPenaltyShare = 100*float64(pen)/float64(fr), true
	}
	return v
}

func (r *report) writeSim(w io.Writer, charts string) error {
	return render(w, "sim", r.simView(charts))
}

// notesView is section 9, the notes on two shared cores.
type notesView struct {
	LoadAvg                        string
	TgRedisPct, RrRedisPct         float64 // % of a core Redis used in the saturated runs
	RrCPUPerCheck, RrChecksPerCore float64
}

func (r *report) notesView() notesView {
	tg, rr := r.loads["tollgate"], r.loads["redis_rate"]
	return notesView{LoadAvg: r.machine.loadAvg,
		TgRedisPct: 100 * tg.Redis.CPU / tg.Elapsed.Seconds(), RrRedisPct: 100 * rr.Redis.CPU / rr.Elapsed.Seconds(),
		RrCPUPerCheck: rr.RedisCPUPerCheck(), RrChecksPerCore: 1e6 / max(rr.RedisCPUPerCheck(), 0.01)}
}

func (r *report) writeNotes(w io.Writer) error { return render(w, "notes", r.notesView()) }

// rlsView is section 6, the gRPC rate limit service against redis_rate.
type rlsView struct {
	Callers       int
	DescriptorKey string
	Limit         float64
	Rows          []rlsRow
	Summaries     []rlsSummary
}

// rlsRow is one path at one key count.
type rlsRow struct {
	Path                            string
	Keys                            int
	ChecksPerSec, ChecksPerCore     float64
	HasService                      bool    // a service process (not the in-process library)
	ServiceCPU, ClientCPU, RedisCPU float64 // µs per check
	P50, P99                        time.Duration
	RoundTripsPerCheck              float64
	HasPerTrip                      bool
	ChecksPerTrip                   float64
	Errors                          int64
}

// rlsSummary compares the paths at one key count.
type rlsSummary struct {
	Keys                           int
	RedisVsStrict, ServiceVsStrict float64 // leases over every check in Redis
	ChecksVsStrict, RedisVsRate    float64
}

func (r *report) rlsView() rlsView {
	v := rlsView{Callers: rlsCallers, DescriptorKey: perf.RLSDescriptorKey, Limit: float64(perf.RLSLimit)}
	for _, c := range r.rls {
		for _, x := range []struct {
			name string
			res  perf.RLSResult
			svc  bool
		}{{"**gRPC ShouldRateLimit, leases**", c.Leases, true}, {"gRPC ShouldRateLimit, `--rls-leases=false`", c.Strict, true},
			{"per-request redis_rate", c.Rate, false}} {
			row := rlsRow{Path: x.name, Keys: c.Keys, ChecksPerSec: x.res.Load.ChecksPerSec, ChecksPerCore: x.res.ChecksPerCore(),
				HasService: x.svc, ServiceCPU: x.res.ServiceCPUPerCheck(), ClientCPU: x.res.ClientCPUPerCheck(), RedisCPU: x.res.RedisCPUPerCheck(),
				P50: x.res.Load.P50, P99: x.res.Load.P99, RoundTripsPerCheck: x.res.RoundTripsPerCheck(), Errors: x.res.Load.Errors}
			if x.res.RoundTrips > 0 {
				row.HasPerTrip, row.ChecksPerTrip = true, float64(x.res.Load.Checks)/float64(x.res.RoundTrips)
			}
			v.Rows = append(v.Rows, row)
		}
	}
	for _, c := range r.rls {
		v.Summaries = append(v.Summaries, rlsSummary{Keys: c.Keys,
			RedisVsStrict:   ratio(c.Leases.RedisCPUPerCheck(), c.Strict.RedisCPUPerCheck()),
			ServiceVsStrict: ratio(c.Leases.ServiceCPUPerCheck(), c.Strict.ServiceCPUPerCheck()),
			ChecksVsStrict:  ratio(c.Leases.Load.ChecksPerSec, c.Strict.Load.ChecksPerSec),
			RedisVsRate:     ratio(c.Leases.RedisCPUPerCheck(), c.Rate.RedisCPUPerCheck())})
	}
	return v
}

func (r *report) writeRLS(w io.Writer) error { return render(w, "rls", r.rlsView()) }

// targetsView is the Targets table of the project's own host: each target's numbers and
// whether it was met.
type targetsView struct {
	EnvoyAnchor string

	CostRatio, FilterNs, FloorNs float64
	CostMet                      bool

	FirstVersion string
	First        *firstTarget // nil: not measured
	FirstErr     string       // why not, when known
	FirstMet     bool

	HTTPShare, HTTPTgRPS, HTTPPassRPS float64
	HTTPFloorShare                    float64
	HasHTTPFloor                      bool
	HTTPRoundsNote                    string // httprounds.go
	HTTPMet                           bool

	TelemetryOverhead         float64
	TelemetryPairs            int
	TelemetryOn, TelemetryOff float64
	TelemetryMet              bool

	MatchRatio, MatchThreeNs, MatchPrefixNs float64
	MatchMet                                bool

	RespOtherAdded, RespOtherNs, RespNoneNs float64
	RespOtherMet                            bool
	RespBefore                              *respBeforeTarget // nil: not measured
	RespBeforeErr                           string
	RespNoneMet                             bool

	Shape     perf.ShapeResult
	ShapeMet  bool
	HeldRatio float64
	HeldMet   bool

	EnvoyBuild envoyBuildTarget

	Allocs, DefaultKeyAllocs float64
	AllocsMet                bool

	ChecksRatio, TgChecks, RrChecks float64
	ChecksMet                       bool

	P99Ratio     float64
	TgP99, RrP99 time.Duration
	PacedRate    float64
	P99Met       bool

	HotRoundTrips float64
	HotMet        bool

	WorstRecord int
	WorstAlgo   string
	WorstID     float64
	RecordMet   bool

	ServiceShare, ServiceDeltas, RawDeltas float64
	ServiceMet                             bool

	Diff    *perf.DiffReport
	DiffOff int // decisions differing off a boundary
	DiffMet bool

	RLS    []rlsTarget
	RLSMet bool
}

// firstTarget is today's filter against the first version's.
type firstTarget struct {
	Speedup, FirstNs, NowNs float64
	Pairs                   int
	PairSpeedup             float64
}

// respBeforeTarget is the module without cost_from against the one before it.
type respBeforeTarget struct {
	Added, NoneNs, BeforeNs float64
	Revision                string
}

// rlsTarget is the gRPC target at one key count.
type rlsTarget struct {
	Keys           int
	Redis, Service float64 // leases over every check in Redis, per check
}

func (r *report) targetsView() targetsView {
	l := r.loads
	floor, real := r.cost(1), r.cost(2)
	tg, rr := l["tollgate"], l["redis_rate"]
	ptg, prr := l["paced tollgate"], l["paced redis_rate"]
	ht, hp, hf := l["http tollgate"], l["http pass-through"], l["http floor"]
	v := targetsView{
		EnvoyAnchor: envoyCompareAnchor,
		CostRatio:   ratio(real.NsPerRequest, floor.NsPerRequest), FilterNs: real.NsPerRequest, FloorNs: floor.NsPerRequest,
		FirstVersion: perf.FirstVersion, FirstMet: r.firstMet(),
		HTTPShare: ratio(ht.ChecksPerSec, hp.ChecksPerSec), HTTPTgRPS: ht.ChecksPerSec, HTTPPassRPS: hp.ChecksPerSec,
		HTTPRoundsNote:    r.httpRoundsNote(),
		TelemetryOverhead: r.telemetry.Overhead(), TelemetryPairs: len(r.telemetry.PairRatios),
		TelemetryOn: r.telemetry.On.NsPerRequest, TelemetryOff: r.telemetry.Off.NsPerRequest,
		TelemetryMet: r.telemetry.Off.NsPerRequest > 0 && r.telemetry.Overhead() <= 0.10,
		MatchRatio:   r.match.Ratio(), MatchThreeNs: r.match.Three.NsPerRequest, MatchPrefixNs: r.match.Prefix.NsPerRequest,
		MatchMet:       r.match.Ratio() > 0 && r.match.Ratio() <= 1.15,
		RespOtherAdded: r.resp.OtherRatio() - 1, RespOtherNs: r.resp.Other.NsPerRequest, RespNoneNs: r.resp.None.NsPerRequest,
		RespOtherMet: r.resp.OtherRatio() > 0 && r.resp.OtherRatio() <= 1.10,
		RespNoneMet:  r.resp.NoneRatio() > 0 && r.resp.NoneRatio() <= 1.05,
		Shape:        r.shape,
		ShapeMet:     r.shape.Through >= 101 && r.shape.Refused > 0 && r.shape.GapMean >= 9*time.Millisecond && r.shape.GapMean <= 11*time.Millisecond,
		HeldRatio:    ratio(float64(r.shape.OtherHeld), float64(r.shape.OtherIdle)),
		HeldMet:      r.shape.OtherIdle > 0 && ratio(float64(r.shape.OtherHeld), float64(r.shape.OtherIdle)) <= 1.2,
		EnvoyBuild:   r.envoyBuildTarget(),
		Allocs:       real.AllocsPerRequest, DefaultKeyAllocs: r.cost(3).AllocsPerRequest, AllocsMet: real.AllocsPerRequest <= 2,
		ChecksRatio: ratio(tg.ChecksPerSec, rr.ChecksPerSec), TgChecks: tg.ChecksPerSec, RrChecks: rr.ChecksPerSec,
		P99Ratio: ratio(float64(ptg.P99), float64(prr.P99)), TgP99: ptg.P99, RrP99: prr.P99, PacedRate: pacedRate,
		Diff: r.diff,
	}
	v.CostMet = v.CostRatio <= 1.5
	v.HTTPMet = v.HTTPShare >= 0.8
	v.ChecksMet = v.ChecksRatio >= 20
	v.P99Met = v.P99Ratio > 0 && v.P99Ratio <= 0.01
	if hf.ChecksPerSec != 0 && hp.ChecksPerSec != 0 {
		v.HasHTTPFloor, v.HTTPFloorShare = true, ratio(hf.ChecksPerSec, hp.ChecksPerSec)
	}
	if first := r.cost(5); first.NsPerRequest != 0 {
		v.First = &firstTarget{Speedup: r.firstSpeedup(), FirstNs: first.NsPerRequest, NowNs: real.NsPerRequest}
		if n := len(r.firstPairs); n > 0 {
			v.First.Pairs, v.First.PairSpeedup = n, 1/r.firstPairs[n/2]
		}
	} else if r.firstErr != nil {
		v.FirstErr = oneLine(r.firstErr)
	}
	if r.resp.Before.NsPerRequest != 0 {
		v.RespBefore = &respBeforeTarget{Added: r.resp.NoneRatio() - 1, NoneNs: r.resp.None.NsPerRequest,
			BeforeNs: r.resp.Before.NsPerRequest, Revision: perf.BeforeResponseCost}
	} else if r.respBeforeErr != nil {
		v.RespBeforeErr = oneLine(r.respBeforeErr)
	}
	if len(r.dists) > 0 {
		v.HotRoundTrips = r.dists[0].RoundTripsPer1M
	}
	v.HotMet = v.HotRoundTrips <= 1000
	for _, s := range r.shared {
		if s.Synced && !perf.GrowingState(s.Algo) && s.MaxRecord > v.WorstRecord {
			v.WorstRecord, v.WorstAlgo, v.WorstID = s.MaxRecord, s.Algo, s.IDBytes
		}
	}
	v.RecordMet = v.WorstRecord > 0 && v.WorstRecord <= 64
	raw4, _ := r.ingestOf("standalone", "raw store.Apply", 4)
	http4, _ := r.ingestOf("standalone", "POST /v1/sync", 4)
	v.ServiceShare, v.ServiceDeltas, v.RawDeltas = ratio(http4.DeltasPerSec, raw4.DeltasPerSec), http4.DeltasPerSec, raw4.DeltasPerSec
	v.ServiceMet = v.ServiceShare >= 0.8
	if d := r.diff; d != nil {
		v.DiffOff = d.Flips - d.BoundaryFlips
		v.DiffMet = len(d.Failures) == 0 && d.GoLuaMismatches == 0 && d.MaxRetryDiffUs <= 1000
	}
	v.RLSMet = len(r.rls) > 0
	for _, c := range r.rls {
		t := rlsTarget{Keys: c.Keys, Redis: ratio(c.Leases.RedisCPUPerCheck(), c.Strict.RedisCPUPerCheck()),
			Service: ratio(c.Leases.ServiceCPUPerCheck(), c.Strict.ServiceCPUPerCheck())}
		v.RLS = append(v.RLS, t)
		v.RLSMet = v.RLSMet && c.Leases.Load.Checks > 0 && c.Strict.Load.Checks > 0 && t.Redis <= 1.0/20 && t.Service <= 1
	}
	return v
}

func (r *report) writeTargets(w io.Writer) error { return render(w, "targets", r.targetsView()) }

// headerView is the report's title and the run's provenance.
type headerView struct {
	Scale                      float64
	Scaled                     bool // a -scale other than 1
	Command, Date              string
	Elapsed                    time.Duration
	CPUs, MaxProcs             int
	Model, Memory, Kernel      string
	LoadAvg, GoVersion, Redis  string
	Wazero, GoRedis, RedisRate string
	Modules                    []moduleView
}

type moduleView struct {
	Pkg string
	MB  float64
}

func (r *report) headerView() headerView {
	m := r.machine
	v := headerView{Scale: r.scale, Scaled: r.scale != 1, Command: strings.Join(r.args, " "),
		Date: r.started.Format("2006-01-02 15:04 MST"), Elapsed: r.elapsed.Round(time.Second),
		CPUs: m.cpus, MaxProcs: m.maxprocs, Model: m.model, Memory: m.memory, Kernel: m.kernel,
		LoadAvg: m.loadAvg, GoVersion: m.goVersion, Redis: m.redis,
		Wazero: m.depVersion["github.com/tetratelabs/wazero"], GoRedis: m.depVersion["github.com/redis/go-redis/v9"],
		RedisRate: m.depVersion["github.com/go-redis/redis_rate/v10"]}
	for _, ms := range r.moduleSizes {
		v.Modules = append(v.Modules, moduleView{ms.pkg, float64(ms.bytes) / 1e6})
	}
	return v
}

func (r *report) writeHeader(w io.Writer) error { return render(w, "header", r.headerView()) }
