package main

import (
	"bytes"
	"fmt"
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
	r.writeEnvoyBuild(&sec)
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

func ms(d time.Duration) string { return fmtF(float64(d)/1e6, 0) }

// writeEnvoyBuild is section 12.
func (r *report) writeEnvoyBuild(w io.Writer) {
	c := r.envoyBuild
	if len(c.Rows) == 0 {
		return
	}
	o := c.Options
	fmt.Fprintln(w, envoyBuildHeading)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "The steps `filter/wasmbuild` adds after the Go toolchain were tuned on wazero; this section judges\n")
	fmt.Fprintf(w, "them in Envoy %s (V8), measured %s on the benchmark machine (load average %s at the start; `go run\n",
		o.Release, r.started.Format("2006-01-02 15:04 MST"), r.machine.loadAvg)
	fmt.Fprintln(w, "./bench/cmd/tollgate-bench -envoy-build-only` rewrites this section alone). Each variant of the")
	fmt.Fprintln(w, "filter runs in Envoy from the shipped `envoy.yaml` (addresses, ports and paths substituted),")
	fmt.Fprintln(w, "`--concurrency 2`, with the sync service on a real Redis; the last row is the same Envoy with the")
	fmt.Fprintln(w, "Wasm filter cut out of the chain. Two phases:")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "- *start-up*: %d times, every variant's Envoy is started in turn (the order rotated each time).\n", o.Starts)
	fmt.Fprintln(w, "  *Start-up* is, from Envoy's log (microsecond stamps), the listener's load, where the filter's")
	fmt.Fprintln(w, "  configuration is read, to the last VM's `tollgate: started` line: V8 compiling the module and")
	fmt.Fprintln(w, "  every VM started (the main thread's and one per worker), as after a configuration load.")
	fmt.Fprintln(w, "  *Start-up CPU* is the Envoy process's CPU from exec to `/ready` answering LIVE (V8 compiles on")
	fmt.Fprintln(w, "  threads of its own, and on a shared machine the wall time moves with other work).")
	fmt.Fprintf(w, "- *CPU/request*: the last start of each stays up and gets %s of warm-up; then in each of %d cycles\n", o.Warmup, o.Cycles)
	fmt.Fprintf(w, "  every Envoy in turn (the order rotated by cycle) is driven for %s at %s requests/s over %d\n", o.Chunk, fmtInt(o.Rate), o.Conns)
	fmt.Fprintln(w, "  keep-alive connections (GET, 100 keys that stay under their limit), and its user + system")
	fmt.Fprintln(w, "  time over the chunk (`/proc/PID/stat`, all threads) is divided by the chunk's requests. The")
	fmt.Fprintln(w, "  chunks of one cycle are seconds apart, so other work on the machine weighs on them alike;")
	fmt.Fprintln(w, "  *vs shipped* is the median over the cycles of the variant's over the shipped build's.")
	fmt.Fprintln(w, "  *filter* is the median CPU/request above Envoy without the filter.")
	fmt.Fprintln(w, "- *memory/VM*: Envoy's RSS after the cycles above Envoy without the filter's, over the active V8")
	fmt.Fprintln(w, "  VMs (`wasm.envoy.wasm.runtime.v8.active`). *gzip*: the module compressed with gzip -9, what a")
	fmt.Fprintln(w, "  user pulls.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Medians, spread min–max in brackets:")
	fmt.Fprintln(w)
	shipped := c.Rows[0]
	_, ss, ssc := shipped.Median()
	bc, bs, bsc := c.Baseline.Median()
	var rows [][]string
	for _, row := range c.Rows {
		cpu, st, stc := row.Median()
		rows = append(rows, []string{row.Name, fmtF(float64(row.Bytes)/1e6, 2) + " MB", fmtF(float64(row.GzipBytes)/1e6, 2) + " MB",
			fmtF(float64(cpu)/1e3, 0) + " (" + spreadUs(row.CPU) + ")", fmtF(float64(cpu-bc)/1e3, 0),
			ms(st) + " (" + spreadMs(row.Startup) + ")", ms(stc) + " (" + spreadMs(row.StartCPU) + ")",
			fmtF(c.MemoryPerVM(row)/(1<<20), 1) + " MiB", fmt.Sprint(row.VMs),
			fmtF(perf.PairedCPU(row, shipped), 3) + " / " + fmtF(float64(st)/float64(ss), 3) + " / " +
				fmtF(float64(stc)/float64(ssc), 3) + " / " + fmtF(float64(row.GzipBytes)/float64(shipped.GzipBytes), 3)})
	}
	rows = append(rows, []string{c.Baseline.Name, "–", "–", fmtF(float64(bc)/1e3, 0) + " (" + spreadUs(c.Baseline.CPU) + ")", "0",
		ms(bs) + " (" + spreadMs(c.Baseline.Startup) + ")", ms(bsc) + " (" + spreadMs(c.Baseline.StartCPU) + ")", "–", "0",
		fmtF(perf.PairedCPU(c.Baseline, shipped), 3) + " / – / – / –"})
	table(w, []string{"variant", "module", "gzip", "CPU/request µs", "filter µs", "start-up ms", "start-up CPU ms", "memory/VM", "VMs",
		"vs shipped: CPU/request, start-up, start-up CPU, gzip"}, rows)
	ncpu, nst, nstc := c.Noise()
	fmt.Fprintf(w, "The A/A control, the shipped build in a second Envoy, lands %s from it in CPU per request,\n", pctAbs(ncpu))
	fmt.Fprintf(w, "%s in start-up and %s in start-up CPU: differences up to those are the benchmark machine's noise.\n", pctAbs(nst), pctAbs(nstc))
	fmt.Fprintf(w, "A step is kept only where it saves at least %.0f %%, and more than that noise, of Envoy's CPU per\n", 100*perf.StepPays)
	fmt.Fprintln(w, "request, or of the start-up in both its time and its CPU:")
	fmt.Fprintln(w)
	var steps [][]string
	for _, s := range perf.EnvoyBuildSteps {
		cpu, st, stCPU := c.Gain(s)
		verdict := "does not pay"
		if c.Pays(s) {
			verdict = "pays"
		}
		with, without := c.Rows[s.With], c.Rows[s.Without]
		steps = append(steps, []string{s.Step, with.Name + " vs " + without.Name, pctSigned(cpu), pctSigned(st), pctSigned(stCPU),
			fmtF(c.MemoryPerVM(with)/(1<<20)-c.MemoryPerVM(without)/(1<<20), 1) + " MiB",
			pctSigned(1 - float64(with.GzipBytes)/float64(without.GzipBytes)), verdict})
	}
	table(w, []string{"step", "compared", "CPU/request saved", "start-up saved", "start-up CPU saved", "memory/VM added", "gzip saved", "in Envoy"}, steps)
}

func pctSigned(f float64) string { return fmt.Sprintf("%+.1f %%", 100*f) }

func pctAbs(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

func spreadUs(xs []time.Duration) string {
	lo, hi := minMax(xs)
	return fmtF(float64(lo)/1e3, 0) + "–" + fmtF(float64(hi)/1e3, 0)
}

func spreadMs(xs []time.Duration) string {
	lo, hi := minMax(xs)
	return ms(lo) + "–" + ms(hi)
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

// envoyBuildTarget is the targets table's row: the build keeps exactly the steps that pay
// in Envoy.
func (r *report) envoyBuildTarget() []string {
	c := r.envoyBuild
	if len(c.Rows) == 0 {
		return []string{"build steps kept only where they pay in Envoy", "not measured", "**missed**"}
	}
	var parts []string
	met := true
	for _, s := range perf.EnvoyBuildSteps {
		cpu, st, stc := c.Gain(s)
		state := "removed"
		if s.Shipped {
			state = "kept"
		}
		met = met && c.Pays(s) == s.Shipped
		parts = append(parts, fmt.Sprintf("%s %s (CPU/request %s, start-up %s, start-up CPU %s)", strings.SplitN(s.Step, " (", 2)[0], state, pctSigned(cpu), pctSigned(st), pctSigned(stc)))
	}
	return []string{fmt.Sprintf("build steps kept only where they save ≥ %.0f %% of CPU/request or start-up in Envoy", 100*perf.StepPays), strings.Join(parts, "; "), yesNo(met)}
}

// envoyModuleLine is the README's row on the shipped module in Envoy.
func (r *report) envoyModuleLine() string {
	c := r.envoyBuild
	if len(c.Rows) == 0 {
		return "not measured"
	}
	s := c.Rows[0]
	_, st, stc := s.Median()
	return fmt.Sprintf("%s MB gzip (%s MB); start-up %s ms (%s ms CPU), %s MiB per VM in Envoy %s", fmtF(float64(s.GzipBytes)/1e6, 2),
		fmtF(float64(s.Bytes)/1e6, 2), ms(st), ms(stc), fmtF(c.MemoryPerVM(s)/(1<<20), 1), c.Options.Release)
}
