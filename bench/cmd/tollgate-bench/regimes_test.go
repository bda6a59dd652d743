package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

func TestParseSections(t *testing.T) {
	cases := []struct {
		in   string
		want []string
		err  string
	}{
		{"regimes", []string{"regimes"}, ""},
		{" sim-regimes , regimes,sim-regimes", []string{"sim-regimes", "regimes"}, ""},
		{"regimes,scale", nil, `unknown section "scale"`},
		{",", nil, "no section named"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := parseSections(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestSpliceBlock(t *testing.T) {
	doc := "# R\n\n## Targets\n\n| a |\n\n## 0. First\n\ntext\n\n## 9. Notes\n\nend\n"
	targets := blockBegin(blockPacedTargets) + "\nrows v1\n" + blockEnd(blockPacedTargets) + "\n\n"
	section := blockBegin(blockPaced) + "\n## 10. Regimes\n" + blockEnd(blockPaced) + "\n\n"
	// Added where each belongs when the document has no such block yet.
	got := spliceBlock(spliceBlock(doc, blockPacedTargets, targets), blockPaced, section)
	want := "# R\n\n## Targets\n\n| a |\n\n" + targets + "## 0. First\n\ntext\n\n## 9. Notes\n\nend\n\n" + section
	if got != want {
		t.Fatalf("added:\n%q\nwant\n%q", got, want)
	}
	// Replaced in place, the rest untouched, as often as it is run.
	targets2 := strings.Replace(targets, "rows v1", "rows v2\nmore", 1)
	again := spliceBlock(spliceBlock(got, blockPacedTargets, targets2), blockPacedTargets, targets2)
	if want2 := strings.Replace(want, targets, targets2, 1); again != want2 {
		t.Fatalf("replaced:\n%q\nwant\n%q", again, want2)
	}
}

func TestPacedTargets(t *testing.T) {
	run := func(tgCPU, rrCPU float64, held int64, tgP99, rrP99, passP99 time.Duration) pacedRun {
		res := func(cpu float64, p99 time.Duration, held, dropped int64) perf.PacedResult {
			var x perf.PacedResult
			x.Checks, x.Sent, x.Held, x.P99, x.Dropped = 1000, 1000, held, p99, dropped
			x.Redis.CPU = cpu * 1e-6 * 1000 // µs per check over 1,000 checks
			return x
		}
		return pacedRun{regime: pacedRegime{perKey: 0.5, keys: 10_000, bound: 0.1},
			pass: res(0, passP99, 0, 0), tollgate: res(tgCPU, tgP99, held, 0), redisRate: res(rrCPU, rrP99, 0, 0)}
	}
	ms := time.Millisecond
	cases := []struct {
		name                string
		run                 pacedRun
		cpu, held, p99, all string // met/missed of the rows
	}{
		{"all met", run(1, 20, 5, 2*ms, 3*ms, 1500*time.Microsecond), "**met**", "**met**", "**met**", ""},
		{"cpu above its bound", run(3, 20, 5, 2*ms, 3*ms, 1500*time.Microsecond), "**missed**", "**met**", "**met**", ""},
		{"held above 1 %", run(1, 20, 11, 2*ms, 3*ms, 1500*time.Microsecond), "**met**", "**missed**", "**met**", ""},
		{"p99 more than 1 ms over the pass-through's", run(1, 20, 5, 3*ms, 3*ms, 1500*time.Microsecond), "**met**", "**met**", "**missed**", ""},
		{"load not carried", run(1, 20, 5, 2*ms, 3*ms, 1500*time.Microsecond), "**missed**", "**missed**", "**missed**", "dropped"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.run
			if c.all == "dropped" {
				r.tollgate.Dropped = 3
			}
			rg := regimeRuns{paced: []pacedRun{r}}
			v := rg.pacedTargetsView()
			if len(v.Regimes) != 1 {
				t.Fatalf("%d regimes: %+v", len(v.Regimes), v.Regimes)
			}
			for _, got := range []struct {
				row  string
				met  bool
				want string
			}{{"Redis CPU per check", v.Regimes[0].Met, c.cpu}, {"held", v.HeldMet, c.held}, {"added p99", v.P99Met, c.p99}} {
				if yesNo(got.met) != got.want {
					t.Errorf("row %q: %s, want %s (%+v)", got.row, yesNo(got.met), got.want, v)
				}
			}
			if v.HotMet {
				t.Error("hot keys not run but met")
			}
		})
	}
}

// TestRegimeBlocksWritten: the report's regime blocks are written between their markers,
// the Targets rows say "not run" for what was not measured, and a section measured on its
// own says so.
func TestRegimeBlocksWritten(t *testing.T) {
	r := &report{scale: 1, regimes: regimeRuns{alone: &aloneRun{started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), args: []string{"-sections", "regimes"}, loadAvg: "1 2 3"}}}
	var b bytes.Buffer
	for _, write := range []func(io.Writer) error{r.writeRegimeTargets, r.writePacedRegimes, r.writeSimRegimes} {
		if err := write(&b); err != nil {
			t.Fatal(err)
		}
	}
	out := b.String()
	for _, name := range []string{blockPacedTargets, blockSimTargets, blockPaced, blockSim} {
		i, j := strings.Index(out, blockBegin(name)), strings.Index(out, blockEnd(name))
		if i < 0 || j < i {
			t.Errorf("block %s not written", name)
		}
	}
	if strings.Count(out, "| not run | **missed** |") != 2 {
		t.Errorf("want two \"not run\" rows:\n%s", out)
	}
	if !strings.Contains(out, "`go run ./bench/cmd/tollgate-bench -sections regimes` at 2026-01-02 03:04 UTC (load average 1 2 3") {
		t.Errorf("no note of the run on its own:\n%s", out)
	}
}

// TestReportPlacesRegimes: the full report writes the regimes' Targets rows inside the
// Targets section and sections 10 and 11 after section 9, where -sections finds them.
func TestReportPlacesRegimes(t *testing.T) {
	r := &report{scale: 1, loads: map[string]perf.LoadResult{}}
	var b bytes.Buffer
	if err := r.write(&b, "charts"); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	order := []string{"## Targets", blockBegin(blockPacedTargets), blockBegin(blockSimTargets), "## 0.", "## 9.", blockBegin(blockPaced), "## 10.", blockBegin(blockSim), "## 11."}
	at := -1
	for _, mark := range order {
		i := strings.Index(s, mark)
		if i <= at {
			t.Fatalf("%q at %d, not after the previous mark (%d)", mark, i, at)
		}
		at = i
	}
}
