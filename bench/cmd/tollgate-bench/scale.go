package main

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

// deltasSent is what a Tollgate run sent to the service: batch deltas and acquires (one
// delta each).
func deltasSent(x perf.LoadResult) float64 {
	return float64(x.Metrics["tollgate.sync_deltas_sent"] + x.Metrics["tollgate.acquires"])
}

// deltasPerCheck is deltasSent per check.
func deltasPerCheck(x perf.LoadResult) float64 { return ratio(deltasSent(x), float64(x.Checks)) }

// keyLoadPct is how much of its limit (loadLimit per second) each of keys uniform keys
// was checked at in run x, in per cent.
func keyLoadPct(x perf.LoadResult, keys int) float64 {
	return 100 * ratio(x.ChecksPerSec/float64(keys), loadLimit)
}

// worstRedisMem is the largest MEMORY USAGE per key measured with gateways gateways, the
// sliding-window log included or not (its state grows with report times by design).
func (r *report) worstRedisMem(gateways int, withLog bool) int64 {
	var worst int64
	for _, rm := range r.redisMem {
		if rm.Nodes == gateways && (withLog || !perf.GrowingState(rm.Algo)) {
			worst = max(worst, rm.Bytes)
		}
	}
	return worst
}

// meshWorst is the mesh sweep's worst over-admission and false rejections (%) and the
// range of its state per key (bytes) over the fleet sizes.
func (r *report) meshWorst() (over, falseRej, stateLo, stateHi float64) {
	stateLo = math.Inf(1)
	for _, p := range r.simMesh {
		over = max(over, p.Result.OverAdmissionPct)
		falseRej = max(falseRej, p.Result.CalmFalsePct)
		stateLo, stateHi = min(stateLo, p.Result.StateBytes), max(stateHi, p.Result.StateBytes)
	}
	return over, falseRej, stateLo, stateHi
}

// scaleView is section 0, the sync at mesh scale, with its targets.
type scaleView struct {
	IdleMsPerSec float64

	CPURatio, TgCPU, RrCPU, KeyLoadPct float64
	CPUMet                             bool
	DeltasPerCheck                     float64
	DeltasMet                          bool
	HotSharePct                        float64 // of their limit the hot keys are offered
	HotRatio, HotCPU, HotRRCPU         float64
	HotDeltasPerCheck, HotKeyLoadPct   float64
	HotMet                             bool
	Worst1, Worst16, Worst16NoLog      int64
	Worst1Met, Worst16Met              bool
	Callouts                           []calloutRow
	CalloutsMet                        bool
	MeshOver, MeshFalse                float64
	StateLo, StateHi                   float64
	MeshMet                            bool

	Steady                                 []runRow
	TgDeltas, TgAcquires                   float64
	FullChecks, FullKeyLoadPct             float64
	FullRatio, FullCPU, FullDeltasPerCheck float64
	FullAcquires, FullDeltas, FullPerDelta float64

	MeshKeys, MeshSpread, MeshLimit int
	MeshAdversarialPct, MeshLoadPct float64
	MeshDuration                    time.Duration
	Mesh                            []perf.SimPoint
	Charts, Chart                   string
}

// calloutRow is one Envoy's sync callouts with a number of workers.
type calloutRow struct {
	Workers                                 int
	ChecksPerSec                            float64
	Syncs, Acquires, Deltas, DeltasPerCheck float64 // per second, but the last
}

func (r *report) scaleView(charts string) scaleView {
	l := r.loads
	tg, rr := l["steady tollgate"], l["steady redis_rate"]
	hot, hotRR := l["steady tollgate 100 keys"], l["steady redis_rate 100 keys"]
	full := l["steady tollgate 100 keys closed loop"]
	v := scaleView{IdleMsPerSec: r.redisIdleMsPerSec,
		CPURatio: ratio(tg.RedisCPUPerCheck(), rr.RedisCPUPerCheck()), TgCPU: tg.RedisCPUPerCheck(), RrCPU: rr.RedisCPUPerCheck(),
		KeyLoadPct: keyLoadPct(tg, 10_000), DeltasPerCheck: deltasPerCheck(tg), HotSharePct: 100 * hotShare,
		HotRatio: ratio(hot.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck()), HotCPU: hot.RedisCPUPerCheck(), HotRRCPU: hotRR.RedisCPUPerCheck(),
		HotDeltasPerCheck: deltasPerCheck(hot), HotKeyLoadPct: keyLoadPct(hot, hotKeys),
		Worst1: r.worstRedisMem(1, true), Worst16: r.worstRedisMem(16, true), Worst16NoLog: r.worstRedisMem(16, false),
		Steady: []runRow{
			newRunRow("**Tollgate, 10,000 keys**", tg, true),
			newRunRow("**per-request redis_rate, 10,000 keys**", rr, true),
			newRunRow(fmt.Sprintf("Tollgate, 100 keys, offered %s/s", fmtInt(hot.Rate)), hot, true),
			newRunRow(fmt.Sprintf("per-request redis_rate, 100 keys, offered %s/s", fmtInt(hotRR.Rate)), hotRR, true),
			newRunRow("Tollgate, 100 keys, closed loop", full, true),
		},
		TgDeltas: float64(tg.Metrics["tollgate.sync_deltas_sent"]), TgAcquires: float64(tg.Metrics["tollgate.acquires"]),
		FullChecks: full.ChecksPerSec, FullKeyLoadPct: keyLoadPct(full, hotKeys),
		FullRatio: ratio(full.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck()), FullCPU: full.RedisCPUPerCheck(),
		FullDeltasPerCheck: deltasPerCheck(full), FullAcquires: float64(full.Metrics["tollgate.acquires"]), FullDeltas: deltasSent(full),
		FullPerDelta: ratio(float64(full.Admitted), deltasSent(full)),
		MeshKeys:     perf.MeshKeys, MeshSpread: perf.MeshSpread, MeshLimit: perf.MeshLimit,
		MeshAdversarialPct: 100 * perf.MeshAdversarial, MeshLoadPct: 100 * perf.MeshLoad, MeshDuration: perf.MeshDuration,
		Mesh: r.simMesh, Charts: charts, Chart: chartMesh}
	v.CPUMet = v.CPURatio > 0 && v.CPURatio <= 0.1
	v.DeltasMet = tg.Checks > 0 && v.DeltasPerCheck <= 0.05
	v.HotMet = v.HotRatio > 0 && v.HotRatio <= 0.02
	v.Worst1Met = v.Worst1 > 0 && v.Worst1 <= 128
	v.Worst16Met = v.Worst16 > 0 && v.Worst16 <= 160
	v.CalloutsMet = len(r.callouts) > 0
	for _, c := range r.callouts {
		secs := c.res.Elapsed.Seconds()
		m := c.res.Metrics
		row := calloutRow{Workers: c.workers, ChecksPerSec: c.res.ChecksPerSec, Syncs: ratio(float64(m["tollgate.sync_sent"]), secs),
			Acquires: ratio(float64(m["tollgate.acquires"]), secs), Deltas: ratio(float64(m["tollgate.sync_deltas_sent"]), secs),
			DeltasPerCheck: deltasPerCheck(c.res)}
		v.Callouts = append(v.Callouts, row)
		v.CalloutsMet = v.CalloutsMet && row.Syncs <= 10.5
	}
	v.MeshOver, v.MeshFalse, v.StateLo, v.StateHi = r.meshWorst()
	v.MeshMet = len(r.simMesh) > 0 && v.MeshOver <= 2 && v.MeshFalse < 0.1 && v.StateHi-v.StateLo <= 2
	return v
}

// writeScale is the sync's cost at mesh scale: Redis work per check in steady state,
// Redis memory per key by fleet shape, callouts per Envoy by worker count and the mesh
// simulation, each against its bound (RATIONALE.md §3).
func (r *report) writeScale(w io.Writer, charts string) error {
	return render(w, "scale", r.scaleView(charts))
}
