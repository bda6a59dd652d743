// Command tollgate-bench runs Tollgate's benchmarks end to end and writes BENCHMARKS.md
// and the charts in bench/charts (`make bench`): the filter's decision cost against a
// pass-through module and the floor of its host calls, Tollgate against a per-request
// Redis limiter (go-redis/redis_rate) in the same harness and through HTTP, Redis round
// trips and CPU per 1M requests by key distribution, memory per bucket, the sync
// service's ingest rate, the gRPC rate limit service against redis_rate, the
// differential check against redis_rate and the fleet simulation. Everything runs in
// this process (the gRPC section's service in a child process it builds) against
// redis-servers it starts, so every number of one report comes from one run on one
// machine.
//
// Measuring and writing are apart: each section's numbers (ratios, shares, met or
// missed) are computed once into a view, a struct (views.go and the section's own file),
// and templates/<section>.tmpl holds the section's prose and renders the view through
// the number formatters of render.go. The golden files under testdata hold the rendered
// report for fixed data; after a deliberate change of wording,
// `go test ./bench/cmd/tollgate-bench -run Golden -update` rewrites them.
//
//	go run ./bench/cmd/tollgate-bench -out BENCHMARKS.md
//	go run ./bench/cmd/tollgate-bench -rls-only   # the gRPC section alone, printed
//	go run ./bench/cmd/tollgate-bench -envoy-build-only   # section 12 alone, rewritten in -out
//	go run ./bench/cmd/tollgate-bench -sections regimes,sim-regimes   # sections 10 and 11 alone, printed
//	go run ./bench/cmd/tollgate-bench -sections regimes -out BENCHMARKS.md   # ... replaced in the report
//	go run ./bench/cmd/tollgate-bench -sections envoy -out BENCHMARKS.md -readme README.md   # section 13 (make bench-envoy)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-bench:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	out, charts string
	readme      string  // README whose measured table to rewrite ("": none)
	scale       float64 // multiplies every measured duration (a quick smoke run: 0.2)
	cluster     bool
	mesh        []int         // fleet sizes of the mesh simulation
	soak        time.Duration // how long the VM memory run goes on after 1M requests
	rlsOnly     bool          // measure only the gRPC rate limit service (section 6) and print it
	rlsBin      string        // tollgate-ratelimit to measure ("": built from this tree)
	envoyOnly   bool          // measure only the build steps in Envoy (section 12) and rewrite that section of -out
	sections    []string      // measure only these sections (sections.go)
	regimeKeys  float64       // multiplies the paced regimes' key counts (regimes.go)
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tollgate-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.out, "out", "BENCHMARKS.md", "report to write")
	fs.StringVar(&o.readme, "readme", "", "README.md whose measured table (between its markers) to rewrite from this run")
	fs.StringVar(&o.charts, "charts", "bench/charts", "directory for the PNG charts (linked from the report relative to it)")
	fs.Float64Var(&o.scale, "scale", 1, "multiplier for every measured duration (0.2 for a quick smoke run)")
	fs.BoolVar(&o.cluster, "cluster", true, "also measure the service's ingest on a 6-node Redis Cluster")
	fs.DurationVar(&o.soak, "soak", 10*time.Minute, "after 1,000,000 requests, how long the VM memory run goes on (0: not at all)")
	fs.BoolVar(&o.rlsOnly, "rls-only", false, "measure only the gRPC rate limit service against redis_rate (section 6) and print that section; writes no file")
	fs.StringVar(&o.rlsBin, "rls-bin", "", "tollgate-ratelimit executable the gRPC section measures (empty: built from this tree)")
	fs.BoolVar(&o.envoyOnly, "envoy-build-only", false, "measure only the build steps in Envoy (section 12) and rewrite that section of -out, leaving the rest as it is")
	meshList := fs.String("mesh-gateways", "1,10,100,1000", "fleet sizes of the mesh simulation (comma-separated; the largest takes minutes)")
	fs.Float64Var(&o.regimeKeys, "regime-keys", 1, "multiplier for the paced regimes' key counts, and so their load (0.2 on a machine that cannot carry 5,000 requests/s)")
	sections := fs.String("sections", "", "measure only these sections ("+strings.Join(sectionNames, ", ")+") and print them; with -out, replace them in that report instead")
	if err := fs.Parse(args); err != nil {
		return err
	}
	outGiven := false
	fs.Visit(func(f *flag.Flag) { outGiven = outGiven || f.Name == "out" })
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, f := range strings.Split(*meshList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-mesh-gateways %q: want positive integers", *meshList)
		}
		o.mesh = append(o.mesh, n)
	}
	if o.scale <= 0 {
		return fmt.Errorf("-scale %v: must be positive", o.scale)
	}
	if o.regimeKeys <= 0 {
		return fmt.Errorf("-regime-keys %v: must be positive", o.regimeKeys)
	}
	logger := log.New(stderr, "tollgate-bench: ", log.Ltime)
	r := &report{started: time.Now().UTC(), args: args, scale: o.scale, loads: map[string]perf.LoadResult{}}
	if o.rlsOnly {
		return measureRLSOnly(r, o, logger, stdout)
	}
	if o.envoyOnly {
		return measureEnvoyBuildOnly(r, o, logger)
	}
	if *sections != "" {
		names, err := parseSections(*sections)
		if err != nil {
			return err
		}
		o.sections = names
		return measureSections(r, o, o.sections, outGiven, logger, stdout)
	}
	if err := measure(r, o, logger); err != nil {
		return err
	}
	if err := os.MkdirAll(o.charts, 0o755); err != nil {
		return fmt.Errorf("charts directory: %w", err)
	}
	logger.Print("charts")
	if err := r.charts(o.charts); err != nil {
		return err
	}
	r.elapsed = time.Since(r.started)
	rel, err := filepath.Rel(filepath.Dir(o.out), o.charts)
	if err != nil {
		rel = o.charts
	}
	f, err := os.Create(o.out)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := r.write(f, filepath.ToSlash(rel)); err != nil {
		f.Close()
		return fmt.Errorf("report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if o.readme != "" {
		if err := r.writeReadme(o.readme); err != nil {
			return err
		}
	}
	logger.Printf("wrote %s in %s", o.out, r.elapsed.Round(time.Second))
	return nil
}

// dur scales a measured duration by -scale.
func (o options) dur(d time.Duration) time.Duration {
	return time.Duration(float64(d) * o.scale)
}

// measure runs every benchmark in order and fills r.
func measure(r *report, o options, logger *log.Logger) error {
	r.machine = readMachine()
	ctx := context.Background()

	logger.Print("building modules (wasmbuild.Build: go build -buildmode=c-shared for wasip1, WASI shim linked in, wasm-opt -Oz)")
	mods := map[string][]byte{}
	for _, pkg := range []string{perf.EmptyPkg, perf.FloorPkg, perf.FilterPkg} {
		b, err := perf.BuildModule(pkg)
		if err != nil {
			return err
		}
		mods[pkg] = b
		r.moduleSizes = append(r.moduleSizes, moduleSize{pkg, len(b)})
	}

	logger.Print("starting redis-server")
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	in, err := perf.ReadInfo(ctx, rdb)
	if err != nil {
		return err
	}
	r.machine.redis = in.Version
	svc, err := perf.StartService(store.Standalone, srv.Addrs())
	if err != nil {
		return err
	}
	defer svc.Close()
	st := &perf.Stack{Filter: mods[perf.FilterPkg], Empty: mods[perf.EmptyPkg], Floor: mods[perf.FloorPkg], Redis: rdb, Service: svc}
	// Redis's own background work (serverCron, the service's rules polling) as a baseline.
	idle0, _ := perf.ReadInfo(ctx, rdb)
	time.Sleep(2 * time.Second)
	idle1, _ := perf.ReadInfo(ctx, rdb)
	r.redisIdleMsPerSec = idle1.Since(idle0).CPU * 1e3 / 2

	// 1. Decision cost, with the first version's floor and filter in the same rounds
	// when the repository's history can build them.
	logger.Print("decision cost: empty, floor, filter and the first version's (interleaved rounds)")
	costMods := []perf.CostModule{
		{Name: "empty (pass-through)", Wasm: mods[perf.EmptyPkg]},
		{Name: "floor (unavoidable host calls)", Wasm: mods[perf.FloorPkg]},
		{Name: "Tollgate filter, key from x-api-key", Wasm: mods[perf.FilterPkg], Config: perf.LocalConfig("token_bucket", 1_000_000)},
		{Name: "Tollgate filter, default key (x-api-key, fallback client IP)", Wasm: mods[perf.FilterPkg], Config: perf.DefaultKeyConfig},
	}
	var firstFilter perf.CostModule
	if first, err := perf.BuildAtRevision(perf.FirstVersion, perf.FloorPkg, perf.FilterPkg); err != nil {
		r.firstErr = err
		logger.Printf("first version not measured: %v", err)
	} else {
		firstFilter = perf.CostModule{Name: "first version (" + perf.FirstVersion + "): filter, key from x-api-key", Wasm: first[perf.FilterPkg], Config: perf.LocalConfig("token_bucket", 1_000_000)}
		costMods = append(costMods,
			perf.CostModule{Name: "first version (" + perf.FirstVersion + "): floor", Wasm: first[perf.FloorPkg]}, firstFilter)
	}
	// Last, the same plugin code and rule run natively: what the logic costs without wasm.
	costMods = append(costMods, perf.CostModule{Name: "Tollgate's plugin code natively (filter/nativehost), key from x-api-key",
		Config: perf.LocalConfig("token_bucket", 1_000_000), Native: true})
	costs, err := perf.MeasureCosts(costMods, perf.CostOptions{Round: o.dur(300 * time.Millisecond), Profile: true})
	if err != nil {
		return err
	}
	r.costs, r.native = costs[:len(costs)-1], costs[len(costs)-1]
	if r.firstErr == nil {
		logger.Print("decision cost: the first version's filter and today's in paired chunks")
		if r.firstPairs, err = perf.PairModules(firstFilter.Wasm, mods[perf.FilterPkg], firstFilter.Config, costs[2].NsPerRequest, 900); err != nil {
			return err
		}
	}
	logger.Print("decision cost: telemetry off and on (interleaved rounds)")
	if r.telemetry, err = perf.MeasureTelemetry(mods[perf.FilterPkg], perf.CostOptions{Round: o.dur(300 * time.Millisecond)}); err != nil {
		return err
	}
	logger.Print("build steps: the filter without the jump threading and without the profile (interleaved rounds)")
	if r.recipe, err = perf.MeasureRecipe(mods[perf.FilterPkg], perf.CostOptions{Round: o.dur(300 * time.Millisecond)}); err != nil {
		return err
	}
	logger.Print("match conditions: prefix vs host + prefix + header exact (interleaved rounds)")
	if r.match, err = perf.MeasureMatchCost(mods[perf.FilterPkg], perf.CostOptions{Round: o.dur(300 * time.Millisecond)}); err != nil {
		return err
	}
	logger.Print("concurrency limit: a rule without and with max_in_flight (interleaved rounds)")
	if r.inflight, err = perf.MeasureInFlightCost(mods[perf.FilterPkg], perf.CostOptions{Round: o.dur(300 * time.Millisecond)}); err != nil {
		return err
	}

	logger.Print("response-based cost: without, beside and with cost_from (interleaved rounds)")
	var before []byte
	if prev, err := perf.ShippedAtRevision(perf.BeforeResponseCost, perf.FilterPkg); err != nil {
		r.respBeforeErr = err
		logger.Printf("module before response cost not measured: %v", err)
	} else {
		before = prev[perf.FilterPkg]
	}
	if r.resp, err = perf.MeasureRespCost(mods[perf.FilterPkg], before, perf.CostOptions{Round: o.dur(300 * time.Millisecond)}); err != nil {
		return err
	}

	logger.Print("shaping: a held burst's spacing, another caller's latency meanwhile")
	if r.shape, err = perf.MeasureShaping(mods[perf.FilterPkg]); err != nil {
		return err
	}

	// 2. Against a per-request limiter.
	base := perf.LoadOptions{Duration: o.dur(5 * time.Second), Warmup: o.dur(time.Second)}
	type loadRun struct {
		what string
		fn   func() (perf.LoadResult, error)
	}
	hot := base
	hot.KeySpace = 100
	paced := base
	paced.Rate = pacedRate
	// Through HTTP, every key has been seen (and leased) in a longer warm-up: a run that
	// starts cold measures each key's first acquire, not the steady request path.
	httpOpts := base
	httpOpts.Warmup = o.dur(12 * time.Second)
	for _, lr := range []loadRun{
		{"pass-through", func() (perf.LoadResult, error) { return st.RunPassThrough(base) }},
		{"tollgate local", func() (perf.LoadResult, error) { return st.RunTollgate(base, "gcra", loadLimit, false) }},
		{"tollgate", func() (perf.LoadResult, error) { return st.RunTollgate(base, "gcra", loadLimit, true) }},
		{"redis_rate", func() (perf.LoadResult, error) { return st.RunRedisRate(base, loadLimit) }},
		{"tollgate 100 keys", func() (perf.LoadResult, error) { return st.RunTollgate(hot, "gcra", loadLimit, true) }},
		{"redis_rate 100 keys", func() (perf.LoadResult, error) { return st.RunRedisRate(hot, loadLimit) }},
		{"paced pass-through", func() (perf.LoadResult, error) { return st.RunPassThrough(paced) }},
		{"paced tollgate local", func() (perf.LoadResult, error) { return st.RunTollgate(paced, "gcra", loadLimit, false) }},
		{"paced tollgate", func() (perf.LoadResult, error) { return st.RunTollgate(paced, "gcra", loadLimit, true) }},
		{"paced redis_rate", func() (perf.LoadResult, error) { return st.RunRedisRate(paced, loadLimit) }},
		{"http redis_rate", func() (perf.LoadResult, error) { return st.RunHTTP(httpOpts, perf.HTTPRedisRate, loadLimit) }},
	} {
		logger.Printf("load: %s", lr.what)
		res, err := lr.fn()
		if err != nil {
			return fmt.Errorf("%s: %w", lr.what, err)
		}
		r.loads[lr.what] = res
	}
	if err := r.runHTTPRounds(st, httpOpts, logger); err != nil {
		return err
	}

	// 2b. Sync at mesh scale: steady state (every key touched and leased during the
	// warm-up, the measured time covers the staleness period twice), Tollgate and the
	// per-request limiter side by side; sync callouts per Envoy with 1, 2 and 8 workers.
	steady := base
	steady.Warmup, steady.Duration = o.dur(12*time.Second), o.dur(20*time.Second)
	// Hot keys are offered hotShare of their limit, whatever the machine's speed: closed
	// loop, a fast machine drives 100 keys to their limit, a different regime (the
	// at-the-limit run beside it measures that one).
	steadyHot := steady
	steadyHot.KeySpace = hotKeys
	steadyHot.Rate = hotShare * hotKeys * loadLimit
	atLimit := steadyHot
	atLimit.Rate = 0
	for _, lr := range []loadRun{
		{"steady tollgate", func() (perf.LoadResult, error) { return st.RunTollgate(steady, "gcra", loadLimit, true) }},
		{"steady redis_rate", func() (perf.LoadResult, error) { return st.RunRedisRate(steady, loadLimit) }},
		{"steady tollgate 100 keys", func() (perf.LoadResult, error) { return st.RunTollgate(steadyHot, "gcra", loadLimit, true) }},
		{"steady redis_rate 100 keys", func() (perf.LoadResult, error) { return st.RunRedisRate(steadyHot, loadLimit) }},
		{"steady tollgate 100 keys closed loop", func() (perf.LoadResult, error) { return st.RunTollgate(atLimit, "gcra", loadLimit, true) }},
	} {
		logger.Printf("load: %s", lr.what)
		res, err := lr.fn()
		if err != nil {
			return fmt.Errorf("%s: %w", lr.what, err)
		}
		r.loads[lr.what] = res
	}
	for _, workers := range calloutWorkers {
		lo := base
		lo.Workers, lo.Warmup, lo.Duration = workers, o.dur(8*time.Second), o.dur(6*time.Second)
		logger.Printf("callouts: %d workers", workers)
		res, err := st.RunTollgate(lo, "gcra", loadLimit, true)
		if err != nil {
			return fmt.Errorf("callouts with %d workers: %w", workers, err)
		}
		r.callouts = append(r.callouts, calloutRun{workers: workers, res: res})
	}

	// 10. The paced regimes against redis_rate and the hot keys at their limit.
	if err := r.regimes.measurePaced(st, o, logger); err != nil {
		return err
	}

	// 3. Redis cost by key distribution.
	distOpts := perf.LoadOptions{Duration: o.dur(3 * time.Second), Warmup: o.dur(time.Second)}
	for _, d := range perf.Distributions {
		logger.Printf("redis cost: %s", d.Name)
		c, err := st.RunRedisCost(d, distOpts, distLimit)
		if err != nil {
			return fmt.Errorf("redis cost %s: %w", d.Name, err)
		}
		r.dists = append(r.dists, c)
	}

	// 4. Memory.
	logger.Print("memory")
	for _, a := range perf.Algorithms {
		for _, synced := range []bool{false, true} {
			m, err := st.MeasureSharedData(a, synced, memKeys)
			if err != nil {
				return err
			}
			r.shared = append(r.shared, m)
		}
	}
	if r.redisMem, err = perf.MeasureRedisMemory(ctx, svc.Store, memShapes); err != nil {
		return err
	}
	if r.redisRateMem, err = perf.RedisRateMemory(ctx, rdb); err != nil {
		return err
	}
	if r.keyHashMem, err = perf.MeasureKeyHashMemory(ctx, svc.Store, 500); err != nil {
		return err
	}

	logger.Print("memory: a worker VM's linear memory over 1,000,000 requests")
	if r.vmMem, err = perf.VMMemory(mods[perf.FilterPkg], vmMemKeys, 1_000_000, 100_000, o.soak); err != nil {
		return err
	}

	// 5. Service ingest.
	for _, conc := range []int{1, 4} {
		for _, viaHTTP := range []bool{false, true} {
			logger.Printf("ingest: standalone, concurrency %d, http %v", conc, viaHTTP)
			res, err := perf.RunIngest(svc, rdb, viaHTTP, conc, o.dur(3*time.Second))
			if err != nil {
				return err
			}
			r.ingest = append(r.ingest, res)
		}
	}
	for _, every := range []int{1, 10} {
		logger.Printf("hot-key lists: Redis time per delta, a flush every %d batches", every)
		c, err := perf.MeasureTopCost(srv.Addr(), every, 4, max(10, int(20*o.scale)))
		if err != nil {
			return err
		}
		r.topCost = append(r.topCost, c)
	}
	if o.cluster {
		logger.Print("starting a 6-node Redis Cluster")
		cl, err := redistest.LaunchCluster(redistest.Options{})
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		csvc, err := perf.StartService(store.Cluster, cl.Addrs())
		if err != nil {
			cl.Stop()
			return err
		}
		for _, conc := range []int{1, 4} {
			for _, viaHTTP := range []bool{false, true} {
				logger.Printf("ingest: cluster, concurrency %d, http %v", conc, viaHTTP)
				res, err := perf.RunIngest(csvc, nil, viaHTTP, conc, o.dur(3*time.Second))
				if err != nil {
					csvc.Close()
					cl.Stop()
					return err
				}
				r.ingest = append(r.ingest, res)
			}
		}
		csvc.Close()
		cl.Stop()
	}

	// 6. The gRPC rate limit service against the per-request limiter, same Redis.
	logger.Printf("gRPC rate limit service against redis_rate: %v keys", rlsKeys)
	if r.rls, err = perf.CompareRLS(o.rlsBin, rdb, rlsOptions(o), rlsKeys); err != nil {
		return fmt.Errorf("gRPC rate limit service: %w", err)
	}

	// Admin API at scale, on a Redis of its own (300,000 keys would weigh on the
	// measurements above and below).
	logger.Printf("admin API: usage and reset with %v caller keys", adminSizes)
	if r.admin, err = measureAdmin(ctx); err != nil {
		return err
	}

	// 7. Differential.
	logger.Print("differential check against redis_rate")
	if r.diff, err = perf.Differential(ctx, rdb, 5, 400); err != nil {
		return err
	}

	// 10. The build steps in Envoy.
	if err := r.measureEnvoyBuild(o, logger); err != nil {
		return fmt.Errorf("build steps in Envoy: %w", err)
	}
	// 13. Against Envoy's own rate limiting, in real Envoys.
	if err := r.measureEnvoyCompare(o, logger); err != nil {
		return err
	}

	// 8. Simulation.
	logger.Print("fleet simulation")
	r.simGateways = perf.SweepGateways(simGateways)
	r.simInterval = perf.SweepInterval(simIntervals)
	logger.Printf("mesh simulation: %d keys over %v gateways", perf.MeshKeys, o.mesh)
	r.simMesh = perf.SweepMesh(o.mesh)
	// 11. The fleet's regimes.
	r.regimes.measureSim(logger)
	return nil
}

// rlsKeys are the caller key counts of the gRPC section: 10 hot keys and 10,000.
var rlsKeys = perf.RLSKeys

// rlsCallers is the gRPC section's concurrent callers (one gRPC connection).
const rlsCallers = 32

// rlsOptions is the gRPC section's load: 32 callers, 35 s measured after a warm-up of
// 5 s. The warm-up: a replica sizes cold-start allowances once it has heard the fleet
// size for 3 s, and its leases by the demand its first reports show (the measurement
// is of a service that has been running, as a deployed one has). The 35 s: a lease
// lives until the epoch after next begins (20–40 s with the default 20 s epochs) and is
// renewed 2 s before, so every key's lease granted in the warm-up is renewed within the
// measured time: its Redis work is counted, not left after the window.
func rlsOptions(o options) perf.LoadOptions {
	return perf.LoadOptions{Concurrency: rlsCallers, Duration: o.dur(35 * time.Second), Warmup: o.dur(5 * time.Second)}
}

// measureRLSOnly runs the gRPC section alone on a Redis of its own and prints it.
func measureRLSOnly(r *report, o options, logger *log.Logger, stdout io.Writer) error {
	r.machine = readMachine()
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	logger.Printf("gRPC rate limit service against redis_rate: %v keys", rlsKeys)
	if r.rls, err = perf.CompareRLS(o.rlsBin, rdb, rlsOptions(o), rlsKeys); err != nil {
		return err
	}
	return r.writeRLS(stdout)
}

// Workload constants, quoted in the report.
const (
	loadLimit = 1000  // GCRA, per key per second, in the load comparison
	hotKeys   = 100   // keys of the hot-key runs
	hotShare  = 0.85  // of their limit the steady hot-key runs offer each key
	distLimit = 1000  // token bucket, per key per second, in the Redis-cost runs
	pacedRate = 20000 // requests/s of the fixed-rate latency runs
	memKeys   = 10_000
	vmMemKeys = 100_000
)

// adminSizes are the numbers of caller keys the admin API is timed at; adminSamples
// the usage and reset calls at each.
var adminSizes = []int{1_000, 10_000, 100_000, 300_000}

const adminSamples = 200

// measureAdmin times usage and reset at adminSizes on a Redis and service of their own.
func measureAdmin(ctx context.Context) ([]perf.AdminPoint, error) {
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		return nil, fmt.Errorf("admin redis: %w", err)
	}
	defer srv.Stop()
	svc, err := perf.StartService(store.Standalone, srv.Addrs())
	if err != nil {
		return nil, err
	}
	defer svc.Close()
	return svc.MeasureAdminScale(ctx, adminSizes, adminSamples)
}

var (
	memShapes      = [][2]int{{1, 1}, {4, 2}, {16, 2}}
	calloutWorkers = []int{1, 2, 8}
	simGateways    = []int{1, 2, 4, 8, 16}
	simIntervals   = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, time.Second}
)
