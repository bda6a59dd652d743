package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

// envoyView is section 13's body: the real-Envoy comparison, every number computed here.
type envoyView struct {
	Title    string
	Measured bool

	Command, MakeTarget, Date string
	Took                      time.Duration
	Version                   string
	CPUs                      int
	Model, Kernel, LoadAvg    string

	Options        perf.CompareOptions
	Limit          float64
	OtherFractions []float64 // the chart's rates besides the target's
	MaxWorkers     int
	PerWorkers     []envoyWorkersView
	Charts         string
	ChartLatency   string
	ChartCPU       string
	Latency        envoyLatencyTable
	Profile        envoyProfileView
	Why            envoyWhyView
	Stats          []envoyStatsRow
}

// envoyWorkersView is the tables of one worker count.
type envoyWorkersView struct {
	Workers     int
	Label       string // "1 worker", "2 workers"
	Sat         []envoySatRow
	LatencyRate float64
	Latency     []envoyLatencyRow
}

// envoySatRow is one limiter at saturation (closed loop).
type envoySatRow struct {
	Limiter               string
	Bold                  bool // Tollgate's rows
	PerSec, Lo, Hi        float64
	VsPassPct, VsLocalPct float64
	OKPct                 float64
	CPU                   perf.CPUPerReq
	Total                 float64
}

// envoyLatencyRow is one limiter at the target rate (open loop).
type envoyLatencyRow struct {
	Limiter                      string
	Bold                         bool
	P50, P99, P999               time.Duration
	Pass                         bool // pass-through: nothing added
	AddedP50, AddedP99, Added999 time.Duration
	Dropped, Errors              int64
	OKPct                        float64
}

// envoyLatencyTable is the chart's points.
type envoyLatencyTable struct {
	Workers int
	Rates   []float64 // the columns: pass-through's rate at each fraction run
	Rows    []envoyLatencyPoints
}

type envoyLatencyPoints struct {
	Limiter string
	Cells   []envoyLatencyCell
}

type envoyLatencyCell struct {
	P50, P99, P999 time.Duration
	Dropped        int64
}

// envoyProfileView is where Envoy's time goes, by shared object.
type envoyProfileView struct {
	Workers   int
	Profiled  bool
	Err       string // the profiling error, when there is one ("<nil>" when not profiled for none)
	HasErr    bool
	For       time.Duration
	Rows      []envoyProfileRow
	Compared  bool // pass-through, floor and filter profiled: the differences
	Floor     classDiff
	Local     classDiff
	HasSynced bool
	Synced    classDiff
}

// classDiff is what a limiter adds over pass-through in Envoy's code, the module's and
// the kernel, µs per request.
type classDiff struct {
	Envoy, Module, Kernel float64
}

func diffOf(a, b []float64) classDiff { return classDiff{a[0] - b[0], a[1] - b[1], a[2] - b[2]} }

type envoyProfileRow struct {
	Limiter string
	EnvoyUs float64
	Classes []envoyProfileClass
	Objects []perf.DSOShare
}

type envoyProfileClass struct {
	Us, Share float64
}

// envoyWhyView says where each limiter's cost goes, from this run's numbers.
type envoyWhyView struct {
	Workers                                   int
	AddLocal, AddFloor, AddTgLocal, AddTgSync float64 // Envoy CPU µs per request above pass-through
	AddRLS                                    float64
	RLSService, RLSRedis, TgService, TgRedis  float64
	FloorShares                               []envoyFloorShare
	Below                                     []string // worker counts where the floor is below 85 %
	FilterOwn                                 float64
	Profiled                                  bool
	ModuleTl, ModuleFl                        float64
	EnvoyMore                                 bool
	EnvoyDiff                                 float64
	SyncAdds                                  float64
	SyncProfiled                              bool
	SyncEnvoy, SyncModule, SyncKernel         float64
	KeyEvery                                  float64 // s between two requests of one key at saturation
	Acquires, Allowed                         float64
	AcquiredPct, ColdPct                      float64
	Rejected, Timeouts                        float64
	RLSTotal, TgTotal                         float64
	RemoteRatio, TgRemote, RLSRemote          float64
}

type envoyFloorShare struct {
	Pct   float64
	Label string
}

// envoyStatsRow is one Envoy's non-zero counters.
type envoyStatsRow struct {
	Envoy    string
	Counters string
}

func workersLabel(n int) string { return fmt.Sprintf("%d worker%s", n, plural(n)) }

func isBold(l perf.Limiter) bool { return l == perf.TollgateSynced || l == perf.TollgateLocal }

func (r *report) envoyView() envoyView {
	c := r.envoyCompare
	v := envoyView{Title: envoyCompareTitle, Measured: c != nil}
	if c == nil {
		return v
	}
	o := c.Options
	wk := slices.Max(o.Workers)
	v.Command, v.MakeTarget = strings.Join(r.args, " "), makeTarget(r.args)
	v.Date, v.Took = r.envoyCompareStarted.Format("2006-01-02 15:04 MST"), c.Took.Round(time.Second)
	v.Version, v.CPUs, v.Model, v.Kernel, v.LoadAvg = strings.TrimSpace(c.Version), r.machine.cpus, r.machine.model, r.machine.kernel, r.envoyCompareLoad
	v.Options, v.Limit, v.MaxWorkers = o, perf.CompareLimit, wk
	for _, f := range o.Fractions {
		if f != o.Target {
			v.OtherFractions = append(v.OtherFractions, f)
		}
	}
	v.Charts, v.ChartLatency, v.ChartCPU = r.chartsRel, chartEnvoyLatency, chartEnvoyCPU
	for _, w := range o.Workers {
		v.PerWorkers = append(v.PerWorkers, r.envoyWorkersView(w))
	}
	v.Latency = r.envoyLatencyTable(wk)
	v.Profile = r.envoyProfileView(wk)
	v.Why = r.envoyWhyView(wk)
	for _, row := range c.Rows {
		var keep []string
		for _, s := range row.Stats {
			if strings.HasSuffix(s, "=0") || strings.Contains(s, "bucket_table_slots=") || strings.Contains(s, "rules_version") {
				continue
			}
			keep = append(keep, "`"+s+"`")
		}
		if len(keep) == 0 {
			continue
		}
		sort.Strings(keep)
		v.Stats = append(v.Stats, envoyStatsRow{row.Limiter.Short() + ", " + workersLabel(row.Workers), strings.Join(keep, " ")})
	}
	return v
}

func (r *report) envoyWorkersView(wk int) envoyWorkersView {
	c := r.envoyCompare
	o := c.Options
	v := envoyWorkersView{Workers: wk, Label: workersLabel(wk), LatencyRate: o.Target * satMedian(c.Row(perf.PassThrough, wk))}
	for _, l := range perf.Limiters {
		row := c.Row(l, wk)
		lo, hi := satSpread(row)
		var okShare float64
		var n, okN int64
		for _, cr := range row.Closed {
			n += cr.Requests
			okN += cr.OK
		}
		if n > 0 {
			okShare = 100 * float64(okN) / float64(n)
		}
		cpu := cpuOf(row)
		v.Sat = append(v.Sat, envoySatRow{Limiter: l.String(), Bold: isBold(l), PerSec: satMedian(row), Lo: lo, Hi: hi,
			VsPassPct: 100 * r.satRatio(l, perf.PassThrough, wk), VsLocalPct: 100 * r.satRatio(l, perf.LocalRateLimit, wk),
			OKPct: okShare, CPU: cpu, Total: cpu.Total()})
	}
	for _, l := range perf.Limiters {
		runs := openAt(c.Row(l, wk), o.Target)
		lr := envoyLatencyRow{Limiter: l.String(), Bold: isBold(l), Pass: l == perf.PassThrough,
			P50: time.Duration(medianDur(runs, p50)), P99: time.Duration(medianDur(runs, p99)), P999: time.Duration(medianDur(runs, p999))}
		var sent, ok int64
		for _, x := range runs {
			lr.Dropped += x.Dropped
			lr.Errors += x.Errors
			sent += x.Checks
			ok += x.Admitted
		}
		lr.OKPct = 100 * ratio(float64(ok), float64(sent))
		if !lr.Pass {
			lr.AddedP50, lr.AddedP99, lr.Added999 = r.added(l, wk, o.Target, p50), r.added(l, wk, o.Target, p99), r.added(l, wk, o.Target, p999)
		}
		v.Latency = append(v.Latency, lr)
	}
	return v
}

func (r *report) envoyLatencyTable(wk int) envoyLatencyTable {
	c := r.envoyCompare
	t := envoyLatencyTable{Workers: wk}
	for _, f := range c.Options.Fractions {
		if runs := openAt(c.Row(perf.PassThrough, wk), f); len(runs) > 0 {
			t.Rates = append(t.Rates, runs[0].Rate)
		}
	}
	for _, l := range perf.Limiters {
		row := envoyLatencyPoints{Limiter: l.Short()}
		for _, f := range c.Options.Fractions {
			runs := openAt(c.Row(l, wk), f)
			if len(runs) == 0 {
				continue
			}
			cell := envoyLatencyCell{P50: time.Duration(medianDur(runs, p50)), P99: time.Duration(medianDur(runs, p99)), P999: time.Duration(medianDur(runs, p999))}
			for _, x := range runs {
				cell.Dropped += x.Dropped
			}
			row.Cells = append(row.Cells, cell)
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func (r *report) envoyProfileView(wk int) envoyProfileView {
	c := r.envoyCompare
	v := envoyProfileView{Workers: wk, Err: fmt.Sprint(c.ProfileErr), HasErr: c.ProfileErr != nil, For: c.Options.ProfileFor}
	byClass := map[perf.Limiter][]float64{}
	for _, l := range perf.Limiters {
		row := c.Row(l, wk)
		if len(row.Profile) == 0 {
			continue
		}
		v.Profiled = true
		us := row.ProfileRun.CPU.Envoy
		cls := make([]float64, 4)
		for _, d := range row.Profile {
			cls[dsoClass(d.DSO)] += d.Share
		}
		pr := envoyProfileRow{Limiter: l.Short(), EnvoyUs: us, Objects: row.Profile}
		byClass[l] = make([]float64, 4)
		for i, s := range cls {
			byClass[l][i] = s * us
			pr.Classes = append(pr.Classes, envoyProfileClass{s * us, s})
		}
		v.Rows = append(v.Rows, pr)
	}
	pt, fl, tl, ts := byClass[perf.PassThrough], byClass[perf.FloorModule], byClass[perf.TollgateLocal], byClass[perf.TollgateSynced]
	if pt == nil || fl == nil || tl == nil {
		return v
	}
	v.Compared, v.Floor, v.Local = true, diffOf(fl, pt), diffOf(tl, pt)
	if ts != nil {
		v.HasSynced, v.Synced = true, diffOf(ts, pt)
	}
	return v
}

func (r *report) envoyWhyView(wk int) envoyWhyView {
	c := r.envoyCompare
	cpu := map[perf.Limiter]perf.CPUPerReq{}
	for _, l := range perf.Limiters {
		cpu[l] = cpuOf(c.Row(l, wk))
	}
	add := func(l perf.Limiter) float64 { return cpu[l].Envoy - cpu[perf.PassThrough].Envoy }
	v := envoyWhyView{Workers: wk, AddLocal: add(perf.LocalRateLimit), AddFloor: add(perf.FloorModule), AddTgLocal: add(perf.TollgateLocal),
		AddTgSync: add(perf.TollgateSynced), AddRLS: add(perf.RLSPath),
		RLSService: cpu[perf.RLSPath].Service, RLSRedis: cpu[perf.RLSPath].Redis, TgService: cpu[perf.TollgateSynced].Service, TgRedis: cpu[perf.TollgateSynced].Redis,
		FilterOwn: add(perf.TollgateLocal) - add(perf.FloorModule), SyncAdds: cpu[perf.TollgateSynced].Envoy - cpu[perf.TollgateLocal].Envoy}
	for _, wn := range c.Options.Workers {
		s := r.satRatio(perf.FloorModule, perf.LocalRateLimit, wn)
		v.FloorShares = append(v.FloorShares, envoyFloorShare{100 * s, workersLabel(wn)})
		if s < 0.85 {
			v.Below = append(v.Below, workersLabel(wn))
		}
	}
	pt, fl, tl, ts := profileClasses(c.Row(perf.PassThrough, wk)), profileClasses(c.Row(perf.FloorModule, wk)),
		profileClasses(c.Row(perf.TollgateLocal, wk)), profileClasses(c.Row(perf.TollgateSynced, wk))
	if pt != nil && fl != nil && tl != nil {
		v.Profiled, v.ModuleTl, v.ModuleFl = true, tl[1], fl[1]
		v.EnvoyDiff = tl[0] - fl[0]
		v.EnvoyMore = v.EnvoyDiff > 0
	}
	if ts != nil && tl != nil {
		v.SyncProfiled = true
		v.SyncEnvoy, v.SyncModule, v.SyncKernel = ts[0]-tl[0], ts[1]-tl[1], ts[2]-tl[2]
	}
	synced := c.Row(perf.TollgateSynced, wk)
	acq, cold, allowed := statOf(synced, ".acquires"), statOf(synced, ".requests_cold_admitted"), statOf(synced, ".requests_allowed")
	v.KeyEvery = float64(c.Options.Keys) / max(1, satMedian(synced))
	v.Acquires, v.Allowed = float64(acq), float64(allowed)
	v.AcquiredPct, v.ColdPct = 100*ratio(float64(acq), float64(allowed)), 100*ratio(float64(cold), float64(allowed))
	v.Rejected, v.Timeouts = float64(statOf(synced, ".requests_rejected")), float64(statOf(synced, "upstream_rq_504"))
	v.RLSTotal, v.TgTotal = cpu[perf.RLSPath].Total(), cpu[perf.TollgateSynced].Total()
	v.RLSRemote, v.TgRemote = cpu[perf.RLSPath].Service+cpu[perf.RLSPath].Redis, cpu[perf.TollgateSynced].Service+cpu[perf.TollgateSynced].Redis
	v.RemoteRatio = ratio(v.RLSRemote, v.TgRemote)
	return v
}

// writeEnvoyCompare is section 13.
func (r *report) writeEnvoyCompare(w io.Writer) error {
	return block(w, blockEnvoy, func(w io.Writer) error { return render(w, "envoy", r.envoyView()) })
}

// envoyTarget is one row of the comparison's Targets block (and of the README): its
// cells rendered from templates/envoytargets.tmpl, and whether it was met.
type envoyTarget struct {
	What, Measured string
	Met            bool
}

// envoyJudged is a target judged on every worker count: met only where met with each.
type envoyJudged[T any] struct {
	Workers []T
	Met     bool
	Carried *envoyCarried // the added p99 at the highest rate every limiter carried
}

// envoyCarried is two limiters' added p99 at the highest rate every limiter carried
// with the most workers, when that is not the target's rate.
type envoyCarried struct {
	Rate, Fraction float64
	Workers        int
	A              string // the first limiter's short name
	AddedA, AddedB time.Duration
}

type envoySatTarget struct {
	Label            string
	Pct, LocalPct    float64
	SyncedRPS, LrRPS float64
}

type envoyP99Target struct {
	Label         string
	Synced, Other time.Duration // against local_ratelimit or the RLS path
	Local         time.Duration // Tollgate local only
	Lost          int64         // requests dropped or lost at the target's rate
}

type envoyCPUTarget struct {
	Label              string
	Ratio, Synced, RLS float64
}

type envoyFloorTarget struct {
	Label                       string
	Ratio, Synced, Floor, Local float64 // Local: local only over the floor
}

// envoyTargets are the comparison's rows of the Targets table, each judged on every
// worker count.
func (r *report) envoyTargets() ([]envoyTarget, error) {
	c := r.envoyCompare
	if c == nil {
		return []envoyTarget{{"real Envoy comparison", "not measured", false}}, nil
	}
	f := c.Options.Target
	lost := func(l perf.Limiter, w int) int64 { return r.lostAt(perf.PassThrough, w, f) + r.lostAt(l, w, f) }
	wl := slices.Max(c.Options.Workers)
	cf, carried := r.carriedFraction(wl)
	carriedAt := func(a, b perf.Limiter) *envoyCarried {
		if !carried || cf == f {
			return nil
		}
		return &envoyCarried{Rate: openAt(c.Row(perf.PassThrough, wl), cf)[0].Rate, Fraction: cf, Workers: wl,
			A: a.Short(), AddedA: r.added(a, wl, cf, p99), AddedB: r.added(b, wl, cf, p99)}
	}
	sat := envoyJudged[envoySatTarget]{Met: true}
	p99Local := envoyJudged[envoyP99Target]{Met: true, Carried: carriedAt(perf.TollgateSynced, perf.LocalRateLimit)}
	p99RLS := envoyJudged[envoyP99Target]{Met: true, Carried: carriedAt(perf.TollgateSynced, perf.RLSPath)}
	cpu := envoyJudged[envoyCPUTarget]{Met: true}
	floor := envoyJudged[envoyFloorTarget]{Met: true}
	for _, w := range c.Options.Workers {
		label := workersLabel(w)
		v := r.satRatio(perf.TollgateSynced, perf.LocalRateLimit, w)
		sat.Workers = append(sat.Workers, envoySatTarget{label, 100 * v, 100 * r.satRatio(perf.TollgateLocal, perf.LocalRateLimit, w),
			satMedian(c.Row(perf.TollgateSynced, w)), satMedian(c.Row(perf.LocalRateLimit, w))})
		sat.Met = sat.Met && v >= 0.85

		tg, n := r.added(perf.TollgateSynced, w, f, p99), lost(perf.TollgateSynced, w)
		lr, loc, rls := r.added(perf.LocalRateLimit, w, f, p99), r.added(perf.TollgateLocal, w, f, p99), r.added(perf.RLSPath, w, f, p99)
		p99Local.Workers = append(p99Local.Workers, envoyP99Target{label, tg, lr, loc, n})
		p99Local.Met = p99Local.Met && tg <= lr+100*time.Microsecond && n == 0
		p99RLS.Workers = append(p99RLS.Workers, envoyP99Target{label, tg, rls, 0, n})
		p99RLS.Met = p99RLS.Met && rls > 0 && tg*10 <= rls && n == 0

		tgCPU, rlsCPU := cpuOf(c.Row(perf.TollgateSynced, w)).Total(), cpuOf(c.Row(perf.RLSPath, w)).Total()
		cpu.Workers = append(cpu.Workers, envoyCPUTarget{label, ratio(tgCPU, rlsCPU), tgCPU, rlsCPU})
		cpu.Met = cpu.Met && tgCPU*3 <= rlsCPU

		sy, lo, fl := r.addedEnvoyCPU(perf.TollgateSynced, w), r.addedEnvoyCPU(perf.TollgateLocal, w), r.addedEnvoyCPU(perf.FloorModule, w)
		floor.Workers = append(floor.Workers, envoyFloorTarget{label, ratio(sy, fl), sy, fl, ratio(lo, fl)})
		floor.Met = floor.Met && fl > 0 && sy <= 1.5*fl
	}
	var out []envoyTarget
	for _, t := range []struct {
		name string
		view any
		met  bool
	}{{"sat", sat, sat.Met}, {"p99Local", p99Local, p99Local.Met}, {"p99RLS", p99RLS, p99RLS.Met}, {"cpu", cpu, cpu.Met}, {"floor", floor, floor.Met}} {
		var what, measured strings.Builder
		if err := render(&what, "envoyTarget."+t.name+".what", nil); err != nil {
			return nil, err
		}
		if err := render(&measured, "envoyTarget."+t.name+".measured", t.view); err != nil {
			return nil, err
		}
		out = append(out, envoyTarget{what.String(), measured.String(), t.met})
	}
	return out, nil
}

// writeEnvoyTargets is the comparison's block of the Targets section.
func (r *report) writeEnvoyTargets(w io.Writer) error {
	targets, err := r.envoyTargets()
	if err != nil {
		return err
	}
	return block(w, blockEnvoyTargets, func(w io.Writer) error {
		return render(w, "envoytargets", struct {
			Anchor  string
			Targets []envoyTarget
		}{envoyCompareAnchor, targets})
	})
}

// envoyReadmeRows are the README's rows of the comparison: every target, met or missed.
func (r *report) envoyReadmeRows() ([][]string, error) {
	targets, err := r.envoyTargets()
	if err != nil {
		return nil, err
	}
	var out [][]string
	for _, t := range targets {
		out = append(out, []string{t.What, t.Measured + " — " + strings.Trim(yesNo(t.Met), "*")})
	}
	return out, nil
}
