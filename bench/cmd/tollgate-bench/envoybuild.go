package main

import (
	"bytes"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
)

// envoyBuildHeading opens the section on the build steps measured in Envoy; -envoy-build-only
// rewrites the report from it to the next section.
const envoyBuildHeading = "## 12. Build steps in Envoy"

// measureEnvoyBuild builds perf.EnvoyBuildVariants and measures them in Envoy.
func (r *report) measureEnvoyBuild(o options, logger *log.Logger) error {
	var wasms [][]byte
	for _, v := range perf.EnvoyBuildVariants {
		logger.Printf("build steps in Envoy: building %s", v.Name)
		w, err := v.Build()
		if err != nil {
			return err
		}
		wasms = append(wasms, w)
	}
	logger.Printf("build steps in Envoy %s: %d variants and Envoy alone, interleaved rounds", envoyproc.Newest, len(wasms))
	eo := perf.EnvoyBuildOptions{Release: envoyproc.Newest, Warmup: o.dur(3 * time.Second), Chunk: o.dur(2 * time.Second)}
	var err error
	r.envoyBuild, err = perf.MeasureEnvoyBuild(perf.EnvoyBuildVariants, wasms, eo)
	return err
}

// measureEnvoyBuildOnly measures section 12 alone and rewrites it in the report at path
// (appending it when the report has none), leaving every other section as it is.
func measureEnvoyBuildOnly(r *report, o options, logger *log.Logger) error {
	r.machine = readMachine()
	if err := r.measureEnvoyBuild(o, logger); err != nil {
		return err
	}
	old, err := os.ReadFile(o.out)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	var sec bytes.Buffer
	if err := r.writeEnvoyBuild(&sec); err != nil {
		return err
	}
	out := spliceSection(old, envoyBuildHeading, sec.Bytes())
	logger.Printf("rewrote %q in %s", envoyBuildHeading, o.out)
	return os.WriteFile(o.out, out, 0o644)
}

// spliceSection replaces the section of doc that starts with the line heading (up to
// the next "## " heading) with sec, or appends sec.
func spliceSection(doc []byte, heading string, sec []byte) []byte {
	start := bytes.Index(doc, []byte("\n"+heading+"\n"))
	if start < 0 {
		return append(append(bytes.TrimRight(doc, "\n"), "\n\n"...), sec...)
	}
	start++
	end := len(doc)
	if i := bytes.Index(doc[start+len(heading):], []byte("\n## ")); i >= 0 {
		end = start + len(heading) + i + 1
	}
	out := append([]byte(nil), doc[:start]...)
	if end == len(doc) {
		return append(out, sec...)
	}
	out = append(append(out, bytes.TrimRight(sec, "\n")...), "\n\n"...)
	return append(out, doc[end:]...)
}

func minMax(xs []time.Duration) (lo, hi time.Duration) {
	for i, x := range xs {
		if i == 0 || x < lo {
			lo = x
		}
		if x > hi {
			hi = x
		}
	}
	return lo, hi
}

// envoyBuildView is section 12, the build steps measured in Envoy.
type envoyBuildView struct {
	Release, Started, LoadAvg string
	Options                   perf.EnvoyBuildOptions
	Rows                      []envoyVariantRow
	Baseline                  envoyVariantRow
	NoiseCPU, NoiseStartup    float64
	NoiseStartCPU             float64
	StepPaysPct               float64
	Steps                     []envoyStepRow
}

// envoyVariantRow is one variant of the filter in Envoy (or Envoy without it): medians
// and their spread over the rounds, and its ratios to the shipped build.
type envoyVariantRow struct {
	Name                         string
	MB, GzipMB                   float64
	CPUUs, CPULoUs, CPUHiUs      float64
	FilterUs                     float64 // CPU/request above Envoy without the filter
	StartupMs, StartupLo         float64
	StartupHi                    float64
	StartCPUMs, StartCPULo       float64
	StartCPUHi                   float64
	MemMiB                       float64
	VMs                          int
	VsCPU, VsStartup, VsStartCPU float64
	VsGzip                       float64
}

// envoyStepRow is one build step judged in Envoy.
type envoyStepRow struct {
	Step, With, Without          string
	CPU, Startup, StartCPU, Gzip float64 // saved, as fractions
	MemAddedMiB                  float64
	Pays                         bool
}

func msOf(d time.Duration) float64 { return float64(d) / 1e6 }
func usOf(d time.Duration) float64 { return float64(d) / 1e3 }

func newEnvoyVariantRow(c perf.EnvoyBuildCost, row, shipped perf.EnvoyBuildRow) envoyVariantRow {
	cpu, st, stc := row.Median()
	bc, _, _ := c.Baseline.Median()
	_, ss, ssc := shipped.Median()
	v := envoyVariantRow{Name: row.Name, MB: float64(row.Bytes) / 1e6, GzipMB: float64(row.GzipBytes) / 1e6,
		CPUUs: usOf(cpu), FilterUs: usOf(cpu - bc), StartupMs: msOf(st), StartCPUMs: msOf(stc),
		MemMiB: c.MemoryPerVM(row) / (1 << 20), VMs: row.VMs,
		VsCPU: perf.PairedCPU(row, shipped), VsStartup: float64(st) / float64(ss), VsStartCPU: float64(stc) / float64(ssc),
		VsGzip: float64(row.GzipBytes) / float64(shipped.GzipBytes)}
	lo, hi := minMax(row.CPU)
	v.CPULoUs, v.CPUHiUs = usOf(lo), usOf(hi)
	lo, hi = minMax(row.Startup)
	v.StartupLo, v.StartupHi = msOf(lo), msOf(hi)
	lo, hi = minMax(row.StartCPU)
	v.StartCPULo, v.StartCPUHi = msOf(lo), msOf(hi)
	return v
}

func (r *report) envoyBuildView() envoyBuildView {
	c := r.envoyBuild
	shipped := c.Rows[0]
	v := envoyBuildView{Release: c.Options.Release, Started: r.started.Format("2006-01-02 15:04 MST"), LoadAvg: r.machine.loadAvg,
		Options: c.Options, Baseline: newEnvoyVariantRow(c, c.Baseline, shipped), StepPaysPct: 100 * perf.StepPays}
	for _, row := range c.Rows {
		v.Rows = append(v.Rows, newEnvoyVariantRow(c, row, shipped))
	}
	v.NoiseCPU, v.NoiseStartup, v.NoiseStartCPU = c.Noise()
	for _, s := range perf.EnvoyBuildSteps {
		with, without := c.Rows[s.With], c.Rows[s.Without]
		row := envoyStepRow{Step: s.Step, With: with.Name, Without: without.Name, Pays: c.Pays(s),
			MemAddedMiB: c.MemoryPerVM(with)/(1<<20) - c.MemoryPerVM(without)/(1<<20),
			Gzip:        1 - float64(with.GzipBytes)/float64(without.GzipBytes)}
		row.CPU, row.Startup, row.StartCPU = c.Gain(s)
		v.Steps = append(v.Steps, row)
	}
	return v
}

// writeEnvoyBuild is section 12 (nothing when it was not measured).
func (r *report) writeEnvoyBuild(w io.Writer) error {
	if len(r.envoyBuild.Rows) == 0 {
		return nil
	}
	return render(w, "envoybuild", r.envoyBuildView())
}

// envoyBuildTarget is the Targets table's row: the build keeps exactly the steps that
// pay in Envoy.
type envoyBuildTarget struct {
	Measured    bool
	StepPaysPct float64
	Steps       []envoyStepTarget
	Met         bool
}

type envoyStepTarget struct {
	Step                   string // its name, without the explanation in brackets
	Kept                   bool
	CPU, Startup, StartCPU float64
}

func (r *report) envoyBuildTarget() envoyBuildTarget {
	c := r.envoyBuild
	t := envoyBuildTarget{Measured: len(c.Rows) > 0, StepPaysPct: 100 * perf.StepPays, Met: len(c.Rows) > 0}
	if !t.Measured {
		return t
	}
	for _, s := range perf.EnvoyBuildSteps {
		st := envoyStepTarget{Step: strings.SplitN(s.Step, " (", 2)[0], Kept: s.Shipped}
		st.CPU, st.Startup, st.StartCPU = c.Gain(s)
		t.Steps = append(t.Steps, st)
		t.Met = t.Met && c.Pays(s) == s.Shipped
	}
	return t
}
