package perf

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// The A/B comparison of two builds of the filter in real Envoy: the tree's filter
// against a baseline module (TOLLGATE_AB_BASELINE, the path of another build's
// filter.wasm), each as Tollgate local and Tollgate synced, beside pass-through,
// local_ratelimit and the floor module, every Envoy of §13's setup (LimiterConfig),
// closed-loop chunks interleaved in rounds with the order rotated. It prints requests/s,
// Envoy CPU per request and the ratios §13's targets are stated in, side by side, so a
// change to the filter is judged in one run on a shared machine. Not part of `make
// test`: it runs only when TOLLGATE_AB_BASELINE is set.
//
//	cp build/filter.wasm /tmp/before.wasm   # on the commit to compare against
//	TOLLGATE_AB_BASELINE=/tmp/before.wasm go test -run TestEnvoyAB -v -timeout 20m ./bench/perf
//
// TOLLGATE_AB_WORKERS (default 2), TOLLGATE_AB_ROUNDS (5) and TOLLGATE_AB_PERF=1 (a perf
// profile by shared object of the four filter Envoys) adjust it. The filter's counters
// over the rounds say how each build decided (acquires, each a request held for the
// service; cold admissions; deltas reported per admitted request). TOLLGATE_AB_OPEN=<rate>
// adds, after the closed loop, rounds of Poisson arrivals at that many requests/s
// (every Envoy in turn, the same schedule): latency percentiles from each request's
// scheduled time, where a request held for an acquire shows.
func TestEnvoyAB(t *testing.T) {
	basePath := os.Getenv("TOLLGATE_AB_BASELINE")
	if basePath == "" {
		t.Skip("set TOLLGATE_AB_BASELINE to a baseline filter.wasm to compare against")
	}
	baseline, err := os.ReadFile(basePath)
	if err != nil {
		t.Fatal(err)
	}
	workers := envInt("TOLLGATE_AB_WORKERS", 2)
	rounds := envInt("TOLLGATE_AB_ROUNDS", 5)
	tree := wasmtest.BuildWasm(t, FilterPkg)
	floor := wasmtest.BuildWasm(t, FloorPkg)
	bin, err := BuildService(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o := CompareOptions{Workers: []int{workers}, Rounds: rounds}.withDefaults()
	o.Log = log.New(os.Stderr, "", log.Ltime)

	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	info, err := ReadInfo(context.Background(), rdb)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := StartProcess(bin, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := svc.PutRules(CompareRules()); err != nil {
		t.Fatal(err)
	}
	backend, stop, err := RawBackend()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()
	env := &compareEnv{o: o, svc: svc, redisPID: info.PID, rdb: rdb, reqs: compareRequests(o.Keys)}
	_, rlsPortS, _ := net.SplitHostPort(svc.RLSAddr)
	rlsPort, _ := strconv.Atoi(rlsPortS)
	syncAddr := strings.TrimPrefix(svc.URL, "http://")

	type abRow struct {
		name    string
		limiter Limiter
		wasm    []byte
		e       *Envoy
		runs    []ClosedRun
		prof    []DSOShare
		profRun ClosedRun
		edit    func([]byte) ([]byte, error)
		// stats: the filter's counters over the closed-loop rounds, and over the
		// open-loop runs (TOLLGATE_AB_OPEN).
		stats, openStats map[string]uint64
		opens            []OpenRun
	}
	rows := []*abRow{
		{name: "pass-through", limiter: PassThrough},
		{name: "local_ratelimit", limiter: LocalRateLimit},
		{name: "floor module", limiter: FloorModule, wasm: floor},
		{name: "local, baseline", limiter: TollgateLocal, wasm: baseline},
		{name: "local, this tree", limiter: TollgateLocal, wasm: tree},
		{name: "synced, baseline", limiter: TollgateSynced, wasm: baseline},
		{name: "synced, this tree", limiter: TollgateSynced, wasm: tree},
	}
	if only := os.Getenv("TOLLGATE_AB_ONLY"); only != "" {
		// Only the references and the rows whose name starts with it ("local", "synced").
		kept := rows[:0]
		for _, r := range rows {
			if r.wasm == nil || r.limiter == FloorModule || strings.HasPrefix(r.name, only) {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	if os.Getenv("TOLLGATE_AB_TELEMETRY_OFF") == "1" {
		// The tree's filter with the per-rule stats and the decision metadata off: what
		// the telemetry costs.
		rows = append(rows, &abRow{name: "local, telem. off", limiter: TollgateLocal, wasm: tree, edit: telemetryOff})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for _, r := range rows {
		wasm := r.wasm
		if wasm == nil {
			wasm = tree
		}
		l, edit := r.limiter, r.edit
		r.e, err = StartEnvoy(ctx, dir, EnvoyOptions{Release: o.Release, Wasm: wasm, Backend: backend, Sync: syncAddr,
			Concurrency: workers, Edit: func(cfg []byte) ([]byte, error) {
				cfg, err := LimiterConfig(l, cfg, rlsPort)
				if err == nil && edit != nil {
					cfg, err = edit(cfg)
				}
				return cfg, err
			}})
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		defer r.e.Stop()
	}
	for _, r := range rows {
		if _, err := env.closed(r.e, o.Warmup); err != nil {
			t.Fatalf("%s warm-up: %v", r.name, err)
		}
	}
	runRound := func(round int) {
		o.Log.Printf("A/B: round %d of %d (load %s)", round+1, rounds, loadAvg())
		for k := range rows {
			r := rows[(k+round)%len(rows)]
			run, err := env.closed(r.e, o.Chunk)
			if err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
			run.CPU = run.raw.perReq(0, 0)
			r.runs = append(r.runs, run)
		}
	}
	// The filter's counters (acquires, cold admissions, deltas) around a phase.
	counters := func(into func(r *abRow) *map[string]uint64, f func()) {
		before := map[*abRow]map[string]uint64{}
		for _, r := range rows {
			if r.wasm != nil && r.limiter != FloorModule {
				before[r], _ = r.e.Stats(ctx)
			}
		}
		f()
		for r, b := range before {
			after, err := r.e.Stats(ctx)
			if err != nil || b == nil {
				continue
			}
			d := map[string]uint64{}
			for k, v := range after {
				if strings.HasPrefix(k, "wasmcustom.tollgate.") && v >= b[k] {
					d[strings.TrimPrefix(k, "wasmcustom.tollgate.")] = v - b[k]
				}
			}
			*into(r) = d
		}
	}
	counters(func(r *abRow) *map[string]uint64 { return &r.stats }, func() {
		for round := 0; round < rounds; round++ {
			runRound(round)
		}
	})
	if rate := envInt("TOLLGATE_AB_OPEN", 0); rate > 0 {
		// Poisson arrivals at a fixed rate, every Envoy in turn, the same schedule: held
		// requests show as latency (latency from each request's scheduled time).
		counters(func(r *abRow) *map[string]uint64 { return &r.openStats }, func() {
			for round := 0; round < rounds; round++ {
				o.Log.Printf("A/B: open loop at %d/s, round %d of %d (load %s)", rate, round+1, rounds, loadAvg())
				for k := range rows {
					r := rows[(k+round)%len(rows)]
					run, err := env.open(r.e, float64(rate), uint64(round+1))
					if err != nil {
						t.Fatalf("%s: %v", r.name, err)
					}
					r.opens = append(r.opens, run)
				}
			}
		})
	}
	if os.Getenv("TOLLGATE_AB_PERF") == "1" {
		for _, r := range rows {
			if r.limiter != TollgateLocal && r.limiter != TollgateSynced && r.limiter != FloorModule {
				continue
			}
			run, prof, err := env.profile(r.e, dir)
			if err != nil {
				t.Logf("%s: perf: %v", r.name, err)
				continue
			}
			run.CPU = run.raw.perReq(0, 0)
			r.prof, r.profRun = prof, run
		}
	}
	// Per round: each row's requests/s over local_ratelimit's and its Envoy CPU above
	// pass-through over the floor module's; medians over the rounds.
	med := func(f func(i int) float64) float64 {
		v := make([]float64, rounds)
		for i := range v {
			v[i] = f(i)
		}
		return Median(v)
	}
	byName := map[string]*abRow{}
	for _, r := range rows {
		byName[r.name] = r
	}
	lrl, pt, fl := byName["local_ratelimit"], byName["pass-through"], byName["floor module"]
	fmt.Printf("\nA/B in real Envoy %s, %d workers, %d rounds of %s (load at the end %s)\n", o.Release, workers, rounds, o.Chunk, loadAvg())
	fmt.Printf("%-18s %12s %10s %12s %14s\n", "limiter", "requests/s", "vs lrl", "Envoy µs/req", "above pt/floor")
	for _, r := range rows {
		rps := med(func(i int) float64 { return r.runs[i].PerSec })
		vs := med(func(i int) float64 { return r.runs[i].PerSec / lrl.runs[i].PerSec })
		cpu := med(func(i int) float64 { return r.runs[i].CPU.Envoy })
		above := med(func(i int) float64 {
			return (r.runs[i].CPU.Envoy - pt.runs[i].CPU.Envoy) / (fl.runs[i].CPU.Envoy - pt.runs[i].CPU.Envoy)
		})
		fmt.Printf("%-18s %12.0f %9.1f%% %12.1f %13.2fx\n", r.name, rps, 100*vs, cpu, above)
	}
	// Each build's Envoy CPU against the baseline's in the same rounds.
	for _, mode := range []string{"local", "synced"} {
		a, b := byName[mode+", this tree"], byName[mode+", baseline"]
		if a == nil || b == nil {
			continue
		}
		var per []string
		for i := range a.runs {
			per = append(per, fmt.Sprintf("%.2f", a.runs[i].CPU.Envoy/b.runs[i].CPU.Envoy))
		}
		fmt.Printf("%s: Envoy µs/req, this tree over baseline, by round: %s (median %.3f)\n", mode, strings.Join(per, " "),
			med(func(i int) float64 { return a.runs[i].CPU.Envoy / b.runs[i].CPU.Envoy }))
	}
	// How the filter decided: per admitted request, the acquires (each holds a request
	// for the service's answer), the cold admissions and the deltas reported.
	perReq := func(st map[string]uint64) string {
		n := float64(st["requests_allowed"])
		if n == 0 {
			return "no requests"
		}
		return fmt.Sprintf("%d admitted: acquires %.3f %%, cold %.1f %%, deltas %.3f, syncs %d", st["requests_allowed"],
			100*float64(st["acquires"])/n, 100*float64(st["requests_cold_admitted"])/n, float64(st["sync_deltas_sent"])/n, st["sync_sent"])
	}
	for _, r := range rows {
		if r.stats != nil {
			fmt.Printf("counters %-18s closed loop: %s\n", r.name, perReq(r.stats))
		}
	}
	if len(rows[0].opens) > 0 {
		fmt.Printf("open loop at %s/s (medians of %d rounds):\n", os.Getenv("TOLLGATE_AB_OPEN"), rounds)
		fmt.Printf("%-18s %10s %10s %10s %12s %8s\n", "limiter", "p50", "p99", "p99.9", "added p99", "dropped")
		for _, r := range rows {
			q := func(f func(x OpenRun) time.Duration) time.Duration {
				return time.Duration(med(func(i int) float64 { return float64(f(r.opens[i])) }))
			}
			added := q(func(x OpenRun) time.Duration { return x.P99 }) - time.Duration(med(func(i int) float64 { return float64(pt.opens[i].P99) }))
			var dropped int64
			for _, x := range r.opens {
				dropped += x.Dropped
			}
			var per []string
			for _, x := range r.opens {
				per = append(per, fmt.Sprintf("%s/%d", x.P99.Round(100*time.Microsecond), x.Dropped))
			}
			fmt.Printf("%-18s %10s %10s %10s %12s %8d  by round (p99/dropped): %s\n", r.name, q(func(x OpenRun) time.Duration { return x.P50 }).Round(10*time.Microsecond),
				q(func(x OpenRun) time.Duration { return x.P99 }).Round(10*time.Microsecond), q(func(x OpenRun) time.Duration { return x.P999 }).Round(10*time.Microsecond),
				added.Round(10*time.Microsecond), dropped, strings.Join(per, " "))
		}
		for _, r := range rows {
			if r.openStats != nil {
				fmt.Printf("counters %-18s open loop: %s\n", r.name, perReq(r.openStats))
			}
		}
	}
	for _, r := range rows {
		if len(r.prof) == 0 {
			continue
		}
		var parts []string
		for _, d := range r.prof {
			if d.Share >= 0.01 {
				parts = append(parts, fmt.Sprintf("%s %.1f µs", d.DSO, d.Share*r.profRun.CPU.Envoy))
			}
		}
		fmt.Printf("perf %-18s Envoy %.1f µs/req: %s\n", r.name, r.profRun.CPU.Envoy, strings.Join(parts, ", "))
	}
}

// TestHostCallsAB counts the host calls per admitted request of the tree's filter and,
// when TOLLGATE_AB_BASELINE is set, of the baseline module, on the wazero host with §13's
// rule and request, local and synced to a real service (steady state, after the
// buckets' leases are granted).
func TestHostCallsAB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and the service")
	}
	mods := map[string][]byte{"this tree": wasmtest.BuildWasm(t, FilterPkg)}
	if p := os.Getenv("TOLLGATE_AB_BASELINE"); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		mods["baseline"] = b
	}
	bin, err := BuildService(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	svc, err := StartProcess(bin, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := svc.PutRules(CompareRules()); err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := json.Unmarshal(CompareRules(), &rules); err != nil {
		t.Fatal(err)
	}
	local, _ := json.Marshal(rules)
	rules["sync"] = map[string]any{"cluster": "tollgate_ratelimit", "secret": SyncSecret, "interval_ms": 100, "timeout_ms": 250,
		"lease_ttl_ms": 1000, "expected_nodes": 1}
	synced, _ := json.Marshal(rules)
	names := make([]string, 0, len(mods))
	for n := range mods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, mode := range []struct {
			name string
			cfg  []byte
		}{{"local", local}, {"synced", synced}} {
			h, err := wazerohost.New(wazerohost.Config{Wasm: mods[name], PluginConfig: mode.cfg, Workers: 1, LogLevel: wazerohost.LogWarn, CountHostCalls: true,
				Clusters: map[string][]string{"tollgate_ratelimit": {strings.TrimPrefix(svc.URL, "http://")}}})
			if err != nil {
				t.Fatal(err)
			}
			// 100 callers, as §13's many: each request of the steady state finds its lease.
			reqs := make([]*wazerohost.Request, 100)
			for i := range reqs {
				reqs[i] = &wazerohost.Request{Method: "GET", Path: "/v1/search?q=tollgate", Authority: "api.example.com",
					Header: []wazerohost.Pair{{"user-agent", "tollgate-bench"}, {"accept", "*/*"}, {"x-api-key", "ab-" + strconv.Itoa(i)}}}
			}
			for i := 0; i < 2000; i++ {
				h.HandleOn(0, reqs[i%len(reqs)])
				if i%100 == 99 {
					time.Sleep(20 * time.Millisecond) // ticks: syncs, leases
				}
			}
			const n = 2000
			before := h.HostCalls()
			for i := 0; i < n; i++ {
				if _, err := h.Exchange(0, reqs[i%len(reqs)], &wazerohost.Response{Status: 200}); err != nil {
					t.Fatal(err)
				}
			}
			after := h.HostCalls()
			var parts []string
			var total float64
			for k, v := range after {
				if d := float64(v-before[k]) / n; d > 0.001 {
					parts = append(parts, fmt.Sprintf("%s %.2f", strings.TrimPrefix(k, "proxy_"), d))
					if k != "proxy_on_memory_allocate" {
						total += d
					}
				}
			}
			sort.Strings(parts)
			fmt.Printf("host calls per request, %s, %s: %.2f (%s)\n", name, mode.name, total, strings.Join(parts, ", "))
			h.Close()
		}
	}
}

// telemetryOff turns the filter's per-rule stats and decision metadata off in a
// LimiterConfig bootstrap.
func telemetryOff(cfg []byte) ([]byte, error) {
	const at = `"rules": [`
	i := strings.Index(string(cfg), at)
	if i < 0 {
		return nil, fmt.Errorf("no rules in the filter configuration")
	}
	return []byte(string(cfg[:i]) + `"telemetry": {"rule_stats": false, "decision_metadata": false}, ` + string(cfg[i:])), nil
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// TestDecisionCostAB times one admitted request of §1 (a single local rule) through the
// tree's filter, the baseline module (TOLLGATE_AB_BASELINE) and the floor module on the
// wazero host, in interleaved rounds (MeasureCosts), with the module code's share from a
// profile: the module code a change to the filter saves, without Envoy's noise.
func TestDecisionCostAB(t *testing.T) {
	p := os.Getenv("TOLLGATE_AB_BASELINE")
	if p == "" {
		t.Skip("set TOLLGATE_AB_BASELINE to a baseline filter.wasm to compare against")
	}
	baseline, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg := []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":1000000,"window":"1s"}]}`)
	costs, err := MeasureCosts([]CostModule{
		{Name: "floor", Wasm: wasmtest.BuildWasm(t, FloorPkg)},
		{Name: "baseline", Wasm: baseline, Config: cfg},
		{Name: "this tree", Wasm: wasmtest.BuildWasm(t, FilterPkg), Config: cfg},
	}, CostOptions{Rounds: envInt("TOLLGATE_AB_ROUNDS", 9), Profile: true, CountedReqs: 2000})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range costs {
		fmt.Printf("%-10s %8.0f ns/request, module code %6.0f ns, host calls %.2f, allocs %.2f\n", c.Module, c.NsPerRequest, c.GuestNsPerRequest, c.HostCallsPerRequest, c.AllocsPerRequest)
	}
}
