package main

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

// The README's measured table lives between these markers; `make bench` rewrites it from
// the run that wrote BENCHMARKS.md, so the two never disagree.
const (
	readmeBegin = "<!-- measured:begin (written by make bench from BENCHMARKS.md) -->"
	readmeEnd   = "<!-- measured:end -->"
)

// readmeView is the README's measured table: the run's headline numbers, each with its
// bound.
type readmeView struct {
	Date                         string
	CPURatio, DeltasPerCheck     float64
	HotSharePct                  float64
	HotRatio, FullRatio          float64
	Worst1, Worst16              int64
	MeshOver, MeshFalse          float64
	CostRatio, FilterNs, FloorNs float64
	HTTPShare                    float64
	HTTPRounds                   int
	Diff                         *perf.DiffReport
	DiffOff                      int // decisions differing off a boundary
	Module                       *envoyModule
	Envoy                        []envoyTarget
}

// envoyModule is the shipped module's row: its size and what it costs in Envoy.
type envoyModule struct {
	GzipMB, MB          float64
	StartupMs, StartCPU float64
	MiBPerVM            float64
	Release             string
}

func (r *report) readmeView() (readmeView, error) {
	l := r.loads
	tg, rr := l["steady tollgate"], l["steady redis_rate"]
	hot, hotRR := l["steady tollgate 100 keys"], l["steady redis_rate 100 keys"]
	full := l["steady tollgate 100 keys closed loop"]
	floor, real := r.cost(1), r.cost(2)
	hp, ht := l["http pass-through"], l["http tollgate"]
	v := readmeView{Date: r.started.Format("2006-01-02"),
		CPURatio: ratio(tg.RedisCPUPerCheck(), rr.RedisCPUPerCheck()), DeltasPerCheck: deltasPerCheck(tg), HotSharePct: 100 * hotShare,
		HotRatio: ratio(hot.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck()), FullRatio: ratio(full.RedisCPUPerCheck(), hotRR.RedisCPUPerCheck()),
		Worst1: r.worstRedisMem(1, true), Worst16: r.worstRedisMem(16, true),
		CostRatio: ratio(real.NsPerRequest, floor.NsPerRequest), FilterNs: real.NsPerRequest, FloorNs: floor.NsPerRequest,
		HTTPShare: ratio(ht.ChecksPerSec, hp.ChecksPerSec), HTTPRounds: len(r.httpRounds), Diff: r.diff}
	v.MeshOver, v.MeshFalse, _, _ = r.meshWorst()
	if d := r.diff; d != nil {
		v.DiffOff = d.Flips - d.BoundaryFlips
	}
	if c := r.envoyBuild; len(c.Rows) > 0 {
		s := c.Rows[0]
		_, st, stc := s.Median()
		v.Module = &envoyModule{GzipMB: float64(s.GzipBytes) / 1e6, MB: float64(s.Bytes) / 1e6, StartupMs: msOf(st), StartCPU: msOf(stc),
			MiBPerVM: c.MemoryPerVM(s) / (1 << 20), Release: c.Options.Release}
	}
	var err error
	v.Envoy, err = r.envoyTargets()
	return v, err
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
	var b bytes.Buffer
	if err := r.writeReadmeTable(&b); err != nil {
		return err
	}
	out := append(append(append([]byte{}, old[:i]...), b.Bytes()...), old[j:]...)
	return os.WriteFile(path, out, 0o644)
}

// writeReadmeTable is what goes between the README's markers, the begin marker included.
func (r *report) writeReadmeTable(w io.Writer) error {
	v, err := r.readmeView()
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, readmeBegin+"\n\n"); err != nil {
		return err
	}
	return render(w, "readme", v)
}
