package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/bench/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata from this code")

// loadNames are every load run the report reads by name (main.go, httprounds.go).
var loadNames = []string{
	"pass-through", "tollgate local", "tollgate", "redis_rate", "tollgate 100 keys", "redis_rate 100 keys",
	"paced pass-through", "paced tollgate local", "paced tollgate", "paced redis_rate",
	"http pass-through", "http floor", "http tollgate", "http redis_rate",
	"steady tollgate", "steady redis_rate", "steady tollgate 100 keys", "steady redis_rate 100 keys",
	"steady tollgate 100 keys closed loop",
}

// filler sets every field of a value, exported or not, from a counter: the same value
// on every run, a different number in every field, so that a template reading the
// wrong field or formatting it differently changes the rendered text.
type filler struct{ n int }

func (f *filler) next() int { f.n++; return f.n }

func (f *filler) fill(v reflect.Value) {
	if !v.CanSet() {
		v = reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
	}
	switch v.Type() {
	case reflect.TypeOf(time.Time{}):
		v.Set(reflect.ValueOf(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC).Add(time.Duration(f.next()) * time.Minute)))
		return
	case reflect.TypeOf(time.Duration(0)):
		k := f.next()
		scale := []time.Duration{time.Microsecond / 10, time.Microsecond, time.Millisecond, 100 * time.Millisecond}[k%4]
		v.SetInt(int64(time.Duration(k%9+1)*scale + time.Duration(k)*scale/7))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(f.next()%2 == 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(f.next()*7919%4000 + 3))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(f.next()*7919%4000 + 3))
	case reflect.Float32, reflect.Float64:
		k := f.next()
		v.SetFloat(float64(k*7919%100000)/float64([]int{1000, 10, 1}[k%3]) + 0.125)
	case reflect.String:
		v.SetString("s" + strings.Repeat("x", f.next()%3) + itoa(f.n))
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem())
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			f.fill(v.Field(i))
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 3, 3)
		for i := range 3 {
			f.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Array:
		for i := range v.Len() {
			f.fill(v.Index(i))
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			f.fill(k)
			f.fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	}
	// Interfaces (errors), funcs and channels stay nil.
}

func itoa(n int) string { return fmtInt(float64(n)) }

// fullReport is a report with every measurement filled in.
func fullReport() *report {
	r := &report{}
	f := &filler{}
	f.fill(reflect.ValueOf(r).Elem())
	r.scale = 1
	r.args = []string{"-out", "BENCHMARKS.md"}
	r.firstErr, r.respBeforeErr = nil, nil
	r.loads = map[string]perf.LoadResult{}
	for _, name := range loadNames {
		var x perf.LoadResult
		f.fill(reflect.ValueOf(&x).Elem())
		x.Metrics = map[string]int64{}
		for _, m := range []string{"tollgate.acquires", "tollgate.sync_deltas_sent", "tollgate.requests_penalized", "tollgate.sync_sent"} {
			x.Metrics[m] = int64(f.next() * 104729 % 900000)
		}
		r.loads[name] = x
	}
	for i := range r.dists {
		r.dists[i].Load.Metrics = map[string]int64{"tollgate.sync_deltas_sent": int64(5000 + 1000*i), "tollgate.requests_penalized": int64(70 * i)}
	}
	for i := range r.simGateways {
		r.simGateways[i].Scenario = []string{"adversarial 10x", "bursty", "ninety"}[i]
	}
	for i := range r.simInterval {
		r.simInterval[i].Scenario = []string{"adversarial 10x", "bursty", "ninety"}[i]
	}
	// Section 1 reads its modules by position, the first version's last.
	r.costs = make([]perf.Cost, 6)
	for i := range r.costs {
		f.fill(reflect.ValueOf(&r.costs[i]).Elem())
	}
	// Section 12 reads its variants by position, the A/A control last.
	r.envoyBuild.Rows = make([]perf.EnvoyBuildRow, perf.ControlVariant+1)
	for i := range r.envoyBuild.Rows {
		f.fill(reflect.ValueOf(&r.envoyBuild.Rows[i]).Elem())
	}
	// Redis memory by algorithm and fleet shape; ingest by Redis, path and senders.
	for i := range r.redisMem {
		r.redisMem[i].Algo = perf.Algorithms[i%len(perf.Algorithms)]
	}
	r.ingest = nil
	for _, mode := range []string{"standalone", "cluster"} {
		for _, conc := range []int{1, 4} {
			for _, path := range []string{"raw store.Apply", "POST /v1/sync"} {
				x := perf.IngestResult{Path: path, Mode: mode, Concurrency: conc}
				f.fill(reflect.ValueOf(&x.Batches).Elem())
				f.fill(reflect.ValueOf(&x.DeltasPerSec).Elem())
				f.fill(reflect.ValueOf(&x.P99).Elem())
				f.fill(reflect.ValueOf(&x.Redis).Elem())
				r.ingest = append(r.ingest, x)
			}
		}
	}
	// The simulation's regimes are the real ones (their targets are functions), with
	// filled results.
	r.regimes.sim = nil
	for _, g := range sim.Regimes {
		p := sim.RegimePoint{Regime: g}
		f.fill(reflect.ValueOf(&p.Result).Elem())
		r.regimes.sim = append(r.regimes.sim, p)
	}
	r.regimes.alone = nil
	// The sections read these as sorted or as ordered runs.
	slicesSort(r.firstPairs)
	r.envoyCompare = envoyFixture(f)
	return r
}

// envoyFixture is section 13's comparison: every limiter with 1 and 2 workers, closed
// rounds, open runs at every fraction and round, a profile and counters.
func envoyFixture(f *filler) *perf.EnvoyCompare {
	c := &perf.EnvoyCompare{Version: "envoy  version: 1a2b/1.40.0/Clean/RELEASE/BoringSSL ", Took: 754 * time.Second}
	f.fill(reflect.ValueOf(&c.Options).Elem())
	c.Options.Workers, c.Options.Fractions, c.Options.Target = []int{1, 2}, []float64{0.1, 0.25, 0.5, 0.75}, 0.5
	c.Options.Rounds, c.Options.TargetRounds, c.Options.Keys = 3, 3, 10_000
	c.Options.Profile, c.Options.Log = nil, nil
	dsos := []string{"envoy", "[unknown]", "[kernel.kallsyms]", "libc.so.6"}
	for _, w := range c.Options.Workers {
		for _, l := range perf.Limiters {
			row := perf.CompareRow{Limiter: l, Workers: w}
			for range 3 {
				var x perf.ClosedRun
				f.fill(reflect.ValueOf(&x).Elem())
				row.Closed = append(row.Closed, x)
			}
			for _, fr := range c.Options.Fractions {
				for round := range 3 {
					var x perf.OpenRun
					f.fill(reflect.ValueOf(&x).Elem())
					x.Fraction, x.Round = fr, round
					row.Open = append(row.Open, x)
				}
			}
			for i, d := range dsos {
				row.Profile = append(row.Profile, perf.DSOShare{DSO: d, Share: float64(i+1) / 10})
			}
			f.fill(reflect.ValueOf(&row.ProfileRun).Elem())
			row.Stats = []string{"tollgate.acquires=" + itoa(f.next()), "tollgate.requests_allowed=" + itoa(f.next()*1000),
				"tollgate.requests_cold_admitted=" + itoa(f.next()), "tollgate.requests_rejected=" + itoa(f.next()),
				"cluster.tollgate.upstream_rq_504=" + itoa(f.next()), "tollgate.bucket_table_slots=65536", "tollgate.checks_failed=0"}
			c.Rows = append(c.Rows, row)
		}
	}
	return c
}

func slicesSort(xs []float64) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}

// partialReport is a run where the other side of each branch was taken: the first
// version measured without paired chunks, telemetry without them, no module before
// response cost and no error saying why, one HTTP round, a gRPC section not run, a
// differential without failures, a distribution with too few deltas for its CPU per
// delta, ingest without Redis CPU, the default key reading the client address, a budget left for the module's code.
func partialReport() *report {
	r := fullReport()
	r.firstPairs = nil
	r.telemetry.PairRatios = nil
	r.resp.Before = perf.Cost{}
	r.httpRounds = r.httpRounds[:1]
	r.rls = nil
	r.diff.Failures = nil
	r.dists[0].Load.Metrics["tollgate.sync_deltas_sent"] = 10
	for i := range r.ingest {
		r.ingest[i].Redis.CPU = 0
	}
	r.costs[3].HostCallsPerRequest = r.costs[2].HostCallsPerRequest + 1
	r.costs[2].GuestNsPerRequest = r.costs[2].NsPerRequest - 100 // a budget left at 1.5× the floor
	r.admin = r.admin[:1]
	r.topCost = nil
	r.vmMem = nil
	r.keyHashMem = nil
	// Every open run carried its load, no profile and no rejection.
	c := r.envoyCompare
	for i := range c.Rows {
		for j := range c.Rows[i].Open {
			c.Rows[i].Open[j].Dropped, c.Rows[i].Open[j].Errors = 0, 0
		}
		c.Rows[i].Profile = nil
		c.Rows[i].Stats = c.Rows[i].Stats[:3]
	}
	c.ProfileErr = errors.New("perf: not installed")
	return r
}

// emptyReport is a run that measured nothing: every "not run" branch.
func emptyReport() *report {
	return &report{scale: 0.2, loads: map[string]perf.LoadResult{},
		regimes:  regimeRuns{alone: &aloneRun{started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), args: []string{"-sections", "regimes"}, loadAvg: "1 2 3"}},
		firstErr: errors.New("git worktree: no such revision\nsecond line"), respBeforeErr: errors.New("build failed")}
}

// goldenSections are the report's sections rendered on their own.
var goldenSections = []struct {
	name  string
	write func(r *report, b *bytes.Buffer) error
}{
	{"targets", func(r *report, b *bytes.Buffer) error { return r.writeTargets(b) }},
	{"cost", func(r *report, b *bytes.Buffer) error { return r.writeCost(b) }},
	{"load", func(r *report, b *bytes.Buffer) error { return r.writeLoad(b, "charts") }},
	{"dists", func(r *report, b *bytes.Buffer) error { return r.writeDists(b, "charts") }},
	{"memory", func(r *report, b *bytes.Buffer) error { return r.writeMemory(b) }},
	{"ingest", func(r *report, b *bytes.Buffer) error { return r.writeIngest(b) }},
	{"admin", func(r *report, b *bytes.Buffer) error { return r.writeAdmin(b) }},
	{"topcost", func(r *report, b *bytes.Buffer) error { return r.writeTopCost(b) }},
	{"rls", func(r *report, b *bytes.Buffer) error { return r.writeRLS(b) }},
	{"diff", func(r *report, b *bytes.Buffer) error { return r.writeDiff(b) }},
	{"sim", func(r *report, b *bytes.Buffer) error { return r.writeSim(b, "charts") }},
	{"notes", func(r *report, b *bytes.Buffer) error { return r.writeNotes(b) }},
	{"regimetargets", func(r *report, b *bytes.Buffer) error { return r.writeRegimeTargets(b) }},
	{"paced", func(r *report, b *bytes.Buffer) error { return r.writePacedRegimes(b) }},
	{"simregimes", func(r *report, b *bytes.Buffer) error { return r.writeSimRegimes(b) }},
	{"scale", func(r *report, b *bytes.Buffer) error { return r.writeScale(b, "charts") }},
	{"envoybuild", func(r *report, b *bytes.Buffer) error { return r.writeEnvoyBuild(b) }},
	{"envoytargets", func(r *report, b *bytes.Buffer) error { return r.writeEnvoyTargets(b) }},
	{"envoy", func(r *report, b *bytes.Buffer) error { r.chartsRel = "charts"; return r.writeEnvoyCompare(b) }},
	{"readme", func(r *report, b *bytes.Buffer) error { return r.writeReadmeTable(b) }},
	{"report", func(r *report, b *bytes.Buffer) error { return r.write(b, "charts") }},
}

// TestGolden renders each section from fixed data (every measurement filled, the other
// side of each branch, nothing measured) and compares it with
// testdata/<fixture>/<section>.md byte for byte. The golden files were written by the
// report's code as it printed its prose, before the templates, so they hold the templates
// to that text. After a deliberate change of wording, run
// `go test ./bench/cmd/tollgate-bench -run Golden -update` and review the diff.
func TestGolden(t *testing.T) {
	for _, fx := range []struct {
		name string
		r    func() *report
	}{{"full", fullReport}, {"partial", partialReport}, {"empty", emptyReport}} {
		for _, s := range goldenSections {
			t.Run(fx.name+"/"+s.name, func(t *testing.T) {
				var b bytes.Buffer
				if err := s.write(fx.r(), &b); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join("testdata", fx.name, s.name+".md")
				if *update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if got := b.String(); got != string(want) {
					t.Errorf("%s differs from %s:\n%s", s.name, path, firstDiff(got, string(want)))
				}
			})
		}
	}
}

// firstDiff shows the first line where got and want part.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + itoa(i+1) + ":\n got: " + gl + "\nwant: " + wl
		}
	}
	return "(same lines)"
}
