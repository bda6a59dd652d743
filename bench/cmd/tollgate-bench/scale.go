package main

import (
	"fmt"
	"io"
	"math"
	"strconv"

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

// writeScale is the sync's cost at mesh scale: Redis work per check in steady state,
// Redis memory per key by fleet shape, callouts per Envoy by worker count and the mesh
// simulation, each against its bound (RATIONALE.md §3).
func (r *report) writeScale(w io.Writer, charts string) {
	l := r.loads
	tg, rr := l["steady tollgate"], l["steady redis_rate"]
	hot, hotRR := l["steady tollgate 100 keys"], l["steady redis_rate 100 keys"]
	full := l["steady tollgate 100 keys closed loop"]
	cpu := ratio(tg.RedisCPUPerCheck(), rr.RedisCPUPerCheck())
	cpuHot := ratio(hot.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck())
	cpuFull := ratio(full.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck())
	dpc := deltasPerCheck(tg)
	perKey, perHotKey, perFullKey := keyLoadPct(tg, 10_000), keyLoadPct(hot, hotKeys), keyLoadPct(full, hotKeys)

	fmt.Fprintln(w, "## 0. Sync at mesh scale")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Steady state: the same harness as section 2 (8 clients, 2 workers, GCRA 1,000/s per key, one")
	fmt.Fprintln(w, "Redis), after a 12 s warm-up in which every key was seen and leased, then 20 s measured —")
	fmt.Fprintln(w, "twice the filter's staleness period (`sync.stale_ms`, 10 s), so the reports of consumption")
	fmt.Fprintln(w, "that stays inside its lease are in the measured time. Deltas per check count batch deltas and")
	fmt.Fprintln(w, "acquires (`/v1/check`, one delta each). Redis CPU is the whole redis-server process, idle")
	fmt.Fprintf(w, "work included (%s ms per second with the service running and no load).\n", fmtF(r.redisIdleMsPerSec, 1))
	fmt.Fprintln(w)

	worst1, worst16, worst16NoLog := r.worstRedisMem(1, true), r.worstRedisMem(16, true), r.worstRedisMem(16, false)
	callouts := "not run"
	calloutsOK := len(r.callouts) > 0
	for i, c := range r.callouts {
		secs := c.res.Elapsed.Seconds()
		syncs := ratio(float64(c.res.Metrics["tollgate.sync_sent"]), secs)
		if i == 0 {
			callouts = ""
		} else {
			callouts += ", "
		}
		callouts += fmt.Sprintf("%d workers %s", c.workers, fmtF(syncs, 1))
		calloutsOK = calloutsOK && syncs <= 10.5
	}
	meshOver, meshFalse, stateLo, stateHi := r.meshWorst()
	meshOK := len(r.simMesh) > 0 && meshOver <= 2 && meshFalse < 0.1 && stateHi-stateLo <= 2
	table(w, []string{"target", "measured", ""}, [][]string{
		{"Redis CPU per check, 10,000 uniform keys each below 10 % of its limit: ≤ 1/10 of redis_rate's",
			fmt.Sprintf("%s (%s vs %s µs/check; each key at %s %% of its limit)", fmtRatio(cpu), fmtF(tg.RedisCPUPerCheck(), 2), fmtF(rr.RedisCPUPerCheck(), 2), fmtF(perKey, 2)), yesNo(cpu > 0 && cpu <= 0.1)},
		{"deltas sent per check at 10,000 keys ≤ 0.05", fmtF(dpc, 4), yesNo(tg.Checks > 0 && dpc <= 0.05)},
		{fmt.Sprintf("Redis CPU per check, 100 hot keys offered %.0f %% of their limit: ≤ 1/50 of redis_rate's", 100*hotShare),
			fmt.Sprintf("%s (%s vs %s µs/check; %s deltas/check; each key at %s %% of its limit)", fmtRatio(cpuHot), fmtF(hot.RedisCPUPerCheck(), 2), fmtF(hotRR.RedisCPUPerCheck(), 2), fmtF(deltasPerCheck(hot), 4), fmtF(perHotKey, 1)), yesNo(cpuHot > 0 && cpuHot <= 0.02)},
		{"`MEMORY USAGE` per key ≤ 128 B with 1 gateway, every algorithm", fmt.Sprintf("%d B at most", worst1), yesNo(worst1 > 0 && worst1 <= 128)},
		{"`MEMORY USAGE` per key ≤ 160 B with 16 gateways × 2 workers, every algorithm",
			fmt.Sprintf("%d B at most (%d B without the sliding-window log, whose state is one entry per report time)", worst16, worst16NoLog), yesNo(worst16 > 0 && worst16 <= 160)},
		{"sync callouts per Envoy per second ≤ 10 plus early flushes, the same with 1, 2 and 8 workers", callouts + " batches/s (acquires below)", yesNo(calloutsOK)},
		{"mesh simulation, 1–1,000 gateways × 100,000 keys: state per key flat, worst 1-minute over-admission ≤ 2 %, false rejections < 0.1 %",
			fmt.Sprintf("state %s–%s B/key, over-admission ≤ %s %%, false rejections ≤ %s %%", fmtF(stateLo, 1), fmtF(stateHi, 1), fmtF(meshOver, 2), fmtF(meshFalse, 4)), yesNo(meshOK)},
	})

	fmt.Fprintln(w, "### Steady state against a per-request limiter")
	fmt.Fprintln(w)
	table(w, loadHeader, [][]string{
		loadRow("**Tollgate, 10,000 keys**", tg, true),
		loadRow("**per-request redis_rate, 10,000 keys**", rr, true),
		loadRow(fmt.Sprintf("Tollgate, 100 keys, offered %s/s", fmtInt(hot.Rate)), hot, true),
		loadRow(fmt.Sprintf("per-request redis_rate, 100 keys, offered %s/s", fmtInt(hotRR.Rate)), hotRR, true),
		loadRow("Tollgate, 100 keys, closed loop", full, true),
	})
	fmt.Fprintf(w, "Tollgate sent %s deltas per check at 10,000 keys (%s batch deltas, %s acquires) and %s at\n",
		fmtF(dpc, 4), fmtInt(float64(tg.Metrics["tollgate.sync_deltas_sent"])), fmtInt(float64(tg.Metrics["tollgate.acquires"])), fmtF(deltasPerCheck(hot), 4))
	fmt.Fprintln(w, "100 keys. A bucket is reported when its lease runs low, expires or is returned, when a")
	fmt.Fprintln(w, "request was refused, or after `stale_ms` (RATIONALE.md §3): a slow key costs one delta per")
	fmt.Fprintln(w, "staleness period, a hot key one per lease, sized to its demand over the lease horizon")
	fmt.Fprintln(w, "within its share of the bucket.")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "The hot keys are offered %.0f %% of their limit in all (a rate, not a closed loop), so that\n", 100*hotShare)
	fmt.Fprintln(w, "the row measures the same regime on a fast machine as on a slow one; redis_rate is offered")
	fmt.Fprintln(w, "the same and takes what it can. Closed loop, as fast as the clients go, the same 100 keys")
	fmt.Fprintf(w, "are driven to their limit: %s checks/s, %s %% of it. There Tollgate's Redis CPU per check is\n",
		fmtInt(full.ChecksPerSec), fmtF(perFullKey, 1))
	fullDeltas := deltasSent(full)
	fmt.Fprintf(w, "%s of redis_rate's (%s vs %s µs; %s deltas per check, %s of %s deltas acquires). A key at its\n",
		fmtRatio(cpuFull), fmtF(full.RedisCPUPerCheck(), 2), fmtF(hotRR.RedisCPUPerCheck(), 2), fmtF(deltasPerCheck(full), 4),
		fmtInt(float64(full.Metrics["tollgate.acquires"])), fmtInt(fullDeltas))
	fmt.Fprintln(w, "limit has nothing unreserved beyond what refills: a gateway whose lease ran dry asks the")
	fmt.Fprintln(w, "service (an acquire, which holds the request one round trip) and is granted what refilled")
	fmt.Fprintf(w, "meanwhile (here %s admitted requests per delta); each client, waiting on its held request, is\n",
		fmtF(ratio(float64(full.Admitted), fullDeltas), 1))
	fmt.Fprintln(w, "slowed to the limit instead of refused (RATIONALE.md §2).")
	fmt.Fprintln(w)

	fmt.Fprintln(w, "### Sync callouts per Envoy")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "One Envoy (one `e2e/host`) with 1, 2 and 8 worker VMs, 10,000 keys, 8 s warm-up then 6 s")
	fmt.Fprintln(w, "measured. One worker at a time holds the sync leadership in shared data and sends one batch")
	fmt.Fprintln(w, "per interval for the whole Envoy (a heartbeat when nothing is due); acquires are the early")
	fmt.Fprintln(w, "callouts of buckets without a usable lease.")
	fmt.Fprintln(w)
	var rows [][]string
	for _, c := range r.callouts {
		secs := c.res.Elapsed.Seconds()
		m := c.res.Metrics
		rows = append(rows, []string{strconv.Itoa(c.workers), fmtInt(c.res.ChecksPerSec), fmtF(ratio(float64(m["tollgate.sync_sent"]), secs), 2),
			fmtF(ratio(float64(m["tollgate.acquires"]), secs), 2), fmtF(ratio(float64(m["tollgate.sync_deltas_sent"]), secs), 1), fmtF(deltasPerCheck(c.res), 4)})
	}
	table(w, []string{"workers", "checks/s", "sync batches/s", "acquires/s", "batch deltas/s", "deltas per check"}, rows)

	fmt.Fprintln(w, "### Mesh simulation")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "`bench/sim` runs the filter's own plugin code natively (`filter/nativehost`) against the\n")
	fmt.Fprintf(w, "service's lease code in memory (`internal/memservice`) on a virtual clock: %s callers, each\n", fmtInt(perf.MeshKeys))
	fmt.Fprintf(w, "through %d gateways of the fleet (as a client keeps a few connections behind a load balancer),\n", perf.MeshSpread)
	fmt.Fprintf(w, "token bucket %d per minute, %.1f %% of the callers at 10× their limit and the rest at %.0f %% of\n", perf.MeshLimit, 100*perf.MeshAdversarial, 100*perf.MeshLoad)
	fmt.Fprintf(w, "it, %s simulated, without progressive penalties (the leases alone bound the abusers).\n", perf.MeshDuration)
	fmt.Fprintln(w, "Over-admission is the worst caller's largest excess over one perfect bucket in any window,")
	fmt.Fprintln(w, "as % of the limit; false rejections count requests of callers within their limit that a")
	fmt.Fprintln(w, "perfect limiter admitted and the fleet refused. State is the bucket value the service keeps")
	fmt.Fprintln(w, "per key (the Redis string without Redis's own overhead).")
	fmt.Fprintln(w)
	rows = nil
	for _, p := range r.simMesh {
		x := p.Result
		rows = append(rows, []string{strconv.Itoa(p.Gateways), fmtInt(float64(x.Requests)), fmtF(x.OverAdmissionPct, 2), fmtF(x.MeanOverAdmissionPct, 3),
			fmtF(x.CalmFalsePct, 4), fmtF(x.SyncsPerGateway, 2), fmtInt(x.ChecksPerSec), fmtInt(x.DeltasPerSec), fmtF(x.StateBytes, 1), fmtF(x.StateBytesMax, 0)})
	}
	table(w, []string{"gateways", "requests", "over-admission worst %", "mean %", "false rejections % (within limit)", "syncs/gateway/s", "acquires/s", "deltas/s", "state B/key", "largest"}, rows)
	fmt.Fprintf(w, "![mesh simulation: over-admission, false rejections and state per key vs gateways](%s/%s)\n\n", charts, chartMesh)
}
