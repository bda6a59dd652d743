package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// The README's measured table lives between these markers; `make bench` rewrites it from
// the run that wrote BENCHMARKS.md, so the two never disagree.
const (
	readmeBegin = "<!-- measured:begin (written by make bench from BENCHMARKS.md) -->"
	readmeEnd   = "<!-- measured:end -->"
)

// readmeRows are the headline numbers of the run, each with its bound.
func (r *report) readmeRows() ([][]string, error) {
	l := r.loads
	tg, rr := l["steady tollgate"], l["steady redis_rate"]
	hot, hotRR := l["steady tollgate 100 keys"], l["steady redis_rate 100 keys"]
	full := l["steady tollgate 100 keys closed loop"]
	floor, real := r.cost(1), r.cost(2)
	worst1, worst16 := r.worstRedisMem(1, true), r.worstRedisMem(16, true)
	meshOver, meshFalse, _, _ := r.meshWorst()
	hp, ht := l["http pass-through"], l["http tollgate"]
	rows := [][]string{
		{"Redis CPU per check vs a per-request Redis limiter (go-redis/redis_rate), 10,000 keys, steady state",
			fmt.Sprintf("%s (%s deltas per check; bound 1/10 and 0.05)", fmtRatio(ratio(tg.RedisCPUPerCheck(), rr.RedisCPUPerCheck())), fmtF(deltasPerCheck(tg), 3))},
		{fmt.Sprintf("the same with 100 hot keys at %.0f %% of their limit", 100*hotShare), fmt.Sprintf("%s (bound 1/50); driven to their limit, closed loop: %s", fmtRatio(ratio(hot.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck())), fmtRatio(ratio(full.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck())))},
		{"Redis `MEMORY USAGE` per key, every algorithm: 1 gateway / 16 gateways × 2 workers", fmt.Sprintf("≤ %d B / ≤ %d B", worst1, worst16)},
		{"mesh simulation, 100,000 keys over 1–1,000 gateways", fmt.Sprintf("over-admission ≤ %s %%, false rejections ≤ %s %%", fmtF(meshOver, 2), fmtF(meshFalse, 3))},
		{"filter decision vs the floor module (unavoidable host calls)", fmt.Sprintf("%s× (%s vs %s ns)", fmtF(ratio(real.NsPerRequest, floor.NsPerRequest), 2), fmtInt(real.NsPerRequest), fmtInt(floor.NsPerRequest))},
		{"through the gateway host: Tollgate vs pass-through requests/s", fmt.Sprintf("%.0f %% (median of %d rounds)", 100*ratio(ht.ChecksPerSec, hp.ChecksPerSec), len(r.httpRounds))},
	}
	if d := r.diff; d != nil {
		rows = append(rows, []string{"decisions vs redis_rate's GCRA (same Redis)", fmt.Sprintf("%d of %d differ off a boundary; retry-after within %.1f µs", d.Flips-d.BoundaryFlips, d.Steps, d.MaxRetryDiffUs)})
	}
	rows = append(rows, []string{"the module a user pulls, and in Envoy", r.envoyModuleLine()})
	envoy, err := r.envoyReadmeRows()
	return append(rows, envoy...), err
}

// writeReadme replaces the measured table of the README at path.
func (r *report) writeReadme(path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("readme: %w", err)
	}
	i, j := bytes.Index(old, []byte(readmeBegin)), bytes.Index(old, []byte(readmeEnd))
	if i < 0 || j < i {
		return fmt.Errorf("readme %s: no %q … %q markers", path, readmeBegin, readmeEnd)
	}
	var b strings.Builder
	b.WriteString(readmeBegin + "\n\n")
	fmt.Fprintf(&b, "From the `make bench` run of %s (2 shared cores; details and caveats in [BENCHMARKS.md](BENCHMARKS.md)).\n\n",
		r.started.Format("2006-01-02"))
	rows, err := r.readmeRows()
	if err != nil {
		return err
	}
	table(&b, []string{"", ""}, rows)
	out := append(append(append([]byte{}, old[:i]...), b.String()...), old[j:]...)
	return os.WriteFile(path, out, 0o644)
}
