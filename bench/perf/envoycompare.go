package perf

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// CompareOptions say how MeasureEnvoyCompare runs. Zero fields take the defaults.
type CompareOptions struct {
	Release string        // envoyproc.Newest
	Workers []int         // Envoy --concurrency values ({1, 2})
	Keys    int           // callers, uniform (10,000)
	Conns   int           // closed loop: keep-alive connections (48)
	Warmup  time.Duration // closed loop per Envoy before the rounds (2 s)
	Chunk   time.Duration // closed loop: one measured chunk (2.5 s)
	Rounds  int           // closed loop: rounds, every Envoy once per round, order rotated (3)
	// Open loop: Poisson arrivals at Fractions of pass-through's saturation (same
	// worker count), OpenChunk measured after OpenWarmup; the fraction Target again in
	// TargetRounds rounds in all. Fractions other than Target run for the largest worker
	// count only (the latency chart).
	Fractions    []float64     // {0.1, 0.25, 0.5, 0.75}
	Target       float64       // 0.5
	TargetRounds int           // 3
	OpenChunk    time.Duration // 3 s
	OpenWarmup   time.Duration // 0.5 s
	// Profile runs `perf record` on the Envoys of the limiters listed (the largest
	// worker count) over a closed-loop chunk of ProfileFor each, when perf is installed.
	Profile    []Limiter
	ProfileFor time.Duration // 3 s
	Log        *log.Logger
}

func (o CompareOptions) withDefaults() CompareOptions {
	if o.Release == "" {
		o.Release = envoyproc.Newest
	}
	if len(o.Workers) == 0 {
		o.Workers = []int{1, 2}
	}
	if o.Keys == 0 {
		o.Keys = 10_000
	}
	if o.Conns == 0 {
		o.Conns = 48
	}
	if o.Warmup == 0 {
		o.Warmup = 2 * time.Second
	}
	if o.Chunk == 0 {
		o.Chunk = 2500 * time.Millisecond
	}
	if o.Rounds == 0 {
		o.Rounds = 3
	}
	if len(o.Fractions) == 0 {
		o.Fractions = []float64{0.1, 0.25, 0.5, 0.75}
	}
	if o.Target == 0 {
		o.Target = 0.5
	}
	if o.TargetRounds == 0 {
		o.TargetRounds = 3
	}
	if o.OpenChunk == 0 {
		o.OpenChunk = 3 * time.Second
	}
	if o.OpenWarmup == 0 {
		o.OpenWarmup = 500 * time.Millisecond
	}
	if o.ProfileFor == 0 {
		o.ProfileFor = 3 * time.Second
	}
	if o.Log == nil {
		o.Log = log.New(os.Stderr, "", log.Ltime)
	}
	return o
}

// CPUPerReq is CPU time per request in µs by process over one chunk. Service and Redis
// have their idle rate (measured in the same round over pass-through's chunk, when no
// request reaches them) taken off. Bench is this process: the load generator and the
// upstream.
type CPUPerReq struct {
	Envoy, Service, Redis, Bench float64
}

// Total is the CPU per request of the processes a deployment runs: Envoy, service, Redis.
func (c CPUPerReq) Total() float64 { return c.Envoy + c.Service + c.Redis }

// ClosedRun is one closed-loop chunk.
type ClosedRun struct {
	PerSec   float64
	Requests int64
	OK       int64 // 200s
	Errors   int64
	CPU      CPUPerReq
	raw      cpuDelta
}

// OpenRun is one open-loop chunk.
type OpenRun struct {
	Fraction float64
	Round    int
	PacedResult
	CPU      CPUPerReq
	FirstErr string // the first transport error, when Errors > 0
	raw      cpuDelta
}

// CompareRow is one limiter in an Envoy with Workers workers.
type CompareRow struct {
	Limiter Limiter
	Workers int
	Closed  []ClosedRun
	Open    []OpenRun
	// Profile is where Envoy's CPU went at Target (perf record, by shared object), when
	// profiled.
	Profile    []DSOShare
	ProfileRun ClosedRun // the closed-loop chunk the profile sampled
	// Stats are Envoy's counters of the limiter after the run (a check that it decided).
	Stats []string
}

// DSOShare is one shared object's share of the samples of a profile.
type DSOShare struct {
	DSO   string
	Share float64 // 0..1
}

// EnvoyCompare is the comparison's result.
type EnvoyCompare struct {
	Options    CompareOptions
	Version    string // envoy --version
	Rows       []CompareRow
	Took       time.Duration
	ProfileErr error // why the profiles are missing
}

// Row returns the row of l with w workers.
func (c *EnvoyCompare) Row(l Limiter, w int) *CompareRow {
	for i := range c.Rows {
		if c.Rows[i].Limiter == l && c.Rows[i].Workers == w {
			return &c.Rows[i]
		}
	}
	return nil
}

// cpuSnap is the CPU the processes have used so far.
type cpuSnap struct {
	envoy, service, redis, bench time.Duration
	at                           time.Time
}

type cpuDelta struct {
	envoy, service, redis, bench time.Duration
	elapsed                      time.Duration
	requests                     int64
}

// compareEnv is what every Envoy of the comparison shares.
type compareEnv struct {
	o        CompareOptions
	svc      *Process
	redisPID int
	rdb      *redis.Client
	reqs     [][]byte
}

func (e *compareEnv) snap(envoyPID int) cpuSnap {
	s := cpuSnap{at: time.Now(), bench: selfCPU()}
	s.envoy, _ = ProcessCPU(envoyPID)
	s.service, _ = ProcessCPU(e.svc.Pid)
	s.redis, _ = ProcessCPU(e.redisPID)
	return s
}

func (a cpuSnap) to(b cpuSnap, requests int64) cpuDelta {
	return cpuDelta{envoy: b.envoy - a.envoy, service: b.service - a.service, redis: b.redis - a.redis, bench: b.bench - a.bench,
		elapsed: b.at.Sub(a.at), requests: requests}
}

// perReq turns d into µs per request, the idle rates (CPU per second of the service and
// Redis with no request reaching them) taken off.
func (d cpuDelta) perReq(idleSvc, idleRedis float64) CPUPerReq {
	if d.requests == 0 {
		return CPUPerReq{}
	}
	n := float64(d.requests)
	sec := d.elapsed.Seconds()
	us := func(x time.Duration) float64 { return float64(x) / 1e3 / n }
	return CPUPerReq{
		Envoy:   us(d.envoy),
		Service: max(0, (float64(d.service)/1e3-idleSvc*sec*1e6)/n),
		Redis:   max(0, (float64(d.redis)/1e3-idleRedis*sec*1e6)/n),
		Bench:   us(d.bench),
	}
}

// idle is the service's and Redis's CPU in seconds per second over d.
func (d cpuDelta) idle() (svc, redis float64) {
	s := d.elapsed.Seconds()
	if s <= 0 {
		return 0, 0
	}
	return d.service.Seconds() / s, d.redis.Seconds() / s
}

// MeasureEnvoyCompare starts a Redis, the sync service as its own process (its sync API
// and its gRPC RLS), an upstream, and one Envoy (o.Release, V8) per limiter and worker
// count, all from the shipped envoy.yaml (LimiterConfig), all up at once. Then, over
// the same o.Keys callers:
//
//   - closed loop: o.Rounds rounds; in each, every Envoy in turn (the order rotated by
//     round) gets o.Chunk of o.Conns connections sending as fast as answers come;
//     requests/s and CPU per request by process;
//   - open loop: at o.Fractions of pass-through's median saturation (same worker count),
//     Poisson arrivals, latency from each request's scheduled time; every Envoy in turn
//     at one rate before the next rate, the same schedule (seed) for every limiter;
//   - where perf is installed, a CPU profile by shared object of the Envoys of o.Profile
//     at o.Target.
func MeasureEnvoyCompare(filter, floor []byte, serviceBin string, o CompareOptions) (*EnvoyCompare, error) {
	o = o.withDefaults()
	began := time.Now()
	c := &EnvoyCompare{Options: o}
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	info, err := ReadInfo(context.Background(), rdb)
	if err != nil {
		return nil, err
	}
	svc, err := StartProcess(serviceBin, srv.Addr())
	if err != nil {
		return nil, err
	}
	defer svc.Stop()
	if err := svc.PutRules(CompareRules()); err != nil {
		return nil, err
	}
	backend, stop, err := RawBackend()
	if err != nil {
		return nil, err
	}
	defer stop()
	dir, err := os.MkdirTemp("", "tollgate-envoy-compare-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root, bin := "", ""
	if root, err = wasmbuild.RepoRoot(); err == nil {
		bin, err = envoyproc.Binary(root, o.Release)
	}
	if err != nil {
		return nil, err
	}
	c.Version, _ = envoyproc.Version(bin)
	env := &compareEnv{o: o, svc: svc, redisPID: info.PID, rdb: rdb, reqs: compareRequests(o.Keys)}
	_, rlsPortS, _ := net.SplitHostPort(svc.RLSAddr)
	rlsPort, _ := strconv.Atoi(rlsPortS)
	syncAddr := strings.TrimPrefix(svc.URL, "http://")

	// One Envoy per limiter and worker count, started three at a time (V8 compiles the
	// module on the starting Envoy's threads).
	var envoys []*compareEnvoy
	for _, w := range o.Workers {
		for _, l := range Limiters {
			c.Rows = append(c.Rows, CompareRow{Limiter: l, Workers: w})
		}
	}
	for i := range c.Rows {
		envoys = append(envoys, &compareEnvoy{row: &c.Rows[i]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	o.Log.Printf("real Envoy %s: starting %d Envoys (%d limiters × workers %v)", o.Release, len(envoys), len(Limiters), o.Workers)
	sem := make(chan struct{}, 3)
	var wg sync.WaitGroup
	errs := make([]error, len(envoys))
	for i, r := range envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			l := r.row.Limiter
			wasm := filter
			if l == FloorModule {
				wasm = floor
			}
			r.e, errs[i] = StartEnvoy(ctx, dir, EnvoyOptions{Release: o.Release, Wasm: wasm, Backend: backend, Sync: syncAddr,
				Concurrency: r.row.Workers, Edit: func(cfg []byte) ([]byte, error) { return LimiterConfig(l, cfg, rlsPort) }})
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s, %d workers: %w", l, r.row.Workers, errs[i])
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, r := range envoys {
			if r.e != nil {
				_ = r.e.Stop()
			}
		}
	}()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	o.Log.Printf("real Envoy: all up in %s; warm-up %s each", time.Since(began).Round(time.Second), o.Warmup)
	for _, r := range envoys {
		if _, err := env.closed(r.e, o.Warmup); err != nil {
			return nil, fmt.Errorf("%s, %d workers, warm-up: %w", r.row.Limiter, r.row.Workers, err)
		}
	}

	// Closed loop, rounds with the order rotated.
	for round := 0; round < o.Rounds; round++ {
		o.Log.Printf("real Envoy: closed loop, round %d of %d", round+1, o.Rounds)
		idle := map[int][2]float64{}
		for k := range envoys {
			r := envoys[(k+round)%len(envoys)]
			run, err := env.closed(r.e, o.Chunk)
			if err != nil {
				return nil, fmt.Errorf("%s, %d workers: %w", r.row.Limiter, r.row.Workers, err)
			}
			r.row.Closed = append(r.row.Closed, run)
			if r.row.Limiter == PassThrough {
				s, rd := run.raw.idle()
				idle[r.row.Workers] = [2]float64{s, rd}
			}
		}
		for _, r := range envoys {
			cr := &r.row.Closed[len(r.row.Closed)-1]
			id := idle[r.row.Workers]
			cr.CPU = cr.raw.perReq(id[0], id[1])
		}
	}

	// Open loop at fractions of pass-through's saturation.
	sat := map[int]float64{}
	for _, w := range o.Workers {
		sat[w] = medianBy(c.Row(PassThrough, w).Closed, func(r ClosedRun) float64 { return r.PerSec })
	}
	type step struct {
		frac  float64
		round int
		w     int
	}
	var steps []step
	largest := slices.Max(o.Workers)
	for round := 0; round < o.TargetRounds; round++ {
		for _, w := range o.Workers {
			for _, f := range o.Fractions {
				if f == o.Target || (round == 0 && w == largest) {
					steps = append(steps, step{f, round, w})
				}
			}
		}
	}
	for si, s := range steps {
		rate := s.frac * sat[s.w]
		o.Log.Printf("real Envoy: open loop %d of %d, %d workers, %.0f requests/s (%.2f of pass-through's saturation)", si+1, len(steps), s.w, rate, s.frac)
		var group []*compareEnvoy
		for _, r := range envoys {
			if r.row.Workers == s.w {
				group = append(group, r)
			}
		}
		seed := uint64(1000*s.w + 100*s.round + int(100*s.frac) + 1)
		var idleSvc, idleRedis float64
		for k := range group {
			r := group[(k+si)%len(group)]
			run, err := env.open(r.e, rate, seed)
			if err != nil {
				return nil, fmt.Errorf("%s, %d workers, open loop: %w", r.row.Limiter, r.row.Workers, err)
			}
			run.Fraction, run.Round = s.frac, s.round
			r.row.Open = append(r.row.Open, run)
			if r.row.Limiter == PassThrough {
				idleSvc, idleRedis = run.raw.idle()
			}
		}
		for _, r := range group {
			or := &r.row.Open[len(r.row.Open)-1]
			or.CPU = or.raw.perReq(idleSvc, idleRedis)
		}
	}

	// Where Envoy's CPU goes, by shared object, at saturation.
	if len(o.Profile) > 0 {
		if _, err := exec.LookPath("perf"); err != nil {
			c.ProfileErr = fmt.Errorf("perf is not installed")
		} else {
			for _, l := range o.Profile {
				r := findRunning(envoys, l, largest)
				if r == nil {
					continue
				}
				o.Log.Printf("real Envoy: perf record on %s, %d workers", l, largest)
				run, prof, err := env.profile(r.e, dir)
				if err != nil {
					c.ProfileErr = fmt.Errorf("%s: %w", l, err)
					o.Log.Print(c.ProfileErr)
					continue
				}
				run.CPU = run.raw.perReq(0, 0)
				r.row.Profile, r.row.ProfileRun = prof, run
			}
		}
	}
	for _, r := range envoys {
		if st, err := r.e.Stats(ctx); err == nil {
			switch r.row.Limiter {
			case LocalRateLimit:
				r.row.Stats = MatchingStats(st, "http_local_rate_limit.")
			case RLSPath:
				r.row.Stats = MatchingStats(st, "cluster.backend.ratelimit.")
			case TollgateLocal:
				r.row.Stats = MatchingStats(st, "wasmcustom.tollgate.")
			case TollgateSynced:
				r.row.Stats = append(MatchingStats(st, "wasmcustom.tollgate."), MatchingStats(st, "tollgate_ratelimit.internal.upstream_rq_")...)
			}
		}
		if lines := r.e.VMFailureLines(); len(lines) > 0 {
			return nil, fmt.Errorf("%s, %d workers: Wasm VM failures: %s", r.row.Limiter, r.row.Workers, strings.Join(lines[:min(3, len(lines))], "; "))
		}
	}
	c.Took = time.Since(began)
	return c, nil
}

// compareEnvoy is one running Envoy of the comparison and its row.
type compareEnvoy struct {
	row *CompareRow
	e   *Envoy
}

func findRunning(envoys []*compareEnvoy, l Limiter, w int) *compareEnvoy {
	for _, r := range envoys {
		if r.row.Limiter == l && r.row.Workers == w {
			return r
		}
	}
	return nil
}

func medianBy[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return Median(v)
}

// Median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// closed drives e closed loop for d over env's keys from o.Conns connections.
func (env *compareEnv) closed(e *Envoy, d time.Duration) (ClosedRun, error) {
	addr := strings.TrimPrefix(e.URL, "http://")
	var total, ok, errs atomic.Int64
	var first atomic.Value
	before := env.snap(e.Pid())
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < env.o.Conns; i++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 0x636c6f736564))
			var c *rawConn
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for time.Now().Before(deadline) {
				if c == nil {
					var err error
					if c, err = dialRaw(addr); err != nil {
						errs.Add(1)
						first.CompareAndSwap(nil, err)
						time.Sleep(10 * time.Millisecond)
						continue
					}
				}
				status, err := c.do(env.reqs[rng.IntN(len(env.reqs))], time.Now().Add(5*time.Second))
				if err != nil {
					c.Close()
					c = nil
					if status == 0 {
						errs.Add(1)
						first.CompareAndSwap(nil, err)
						continue
					}
				}
				total.Add(1)
				if status == 200 {
					ok.Add(1)
				}
			}
		}(uint64(i + 1))
	}
	wg.Wait()
	after := env.snap(e.Pid())
	run := ClosedRun{Requests: total.Load(), OK: ok.Load(), Errors: errs.Load()}
	run.raw = before.to(after, run.Requests)
	run.PerSec = float64(run.Requests) / run.raw.elapsed.Seconds()
	if run.Errors > run.Requests/100 {
		return run, fmt.Errorf("%d errors in %d requests: %v", run.Errors, run.Requests, first.Load())
	}
	return run, nil
}

// connPool lends keep-alive connections to the open loop's requests, dialing more when
// every one is busy.
type connPool struct {
	addr string
	free chan *rawConn
}

func (p *connPool) get() (*rawConn, error) {
	select {
	case c := <-p.free:
		return c, nil
	default:
		return dialRaw(p.addr)
	}
}

func (p *connPool) put(c *rawConn) {
	select {
	case p.free <- c:
	default:
		c.Close()
	}
}

func (p *connPool) close() {
	for {
		select {
		case c := <-p.free:
			c.Close()
		default:
			return
		}
	}
}

// open offers e rate requests/s, Poisson, for o.OpenWarmup + o.OpenChunk (runOpenLoop:
// latency from each request's scheduled time).
func (env *compareEnv) open(e *Envoy, rate float64, seed uint64) (OpenRun, error) {
	pool := &connPool{addr: strings.TrimPrefix(e.URL, "http://"), free: make(chan *rawConn, 4096)}
	defer pool.close()
	po := PacedOptions{Keys: len(env.reqs), PerKey: rate / float64(len(env.reqs)), Warmup: env.o.OpenWarmup, Duration: env.o.OpenChunk,
		MaxInFlight: 2048, Timeout: 2 * time.Second, Seed: seed}.withDefaults()
	var first atomic.Value
	fn := func(ctx context.Context, k int) (bool, error) {
		c, err := pool.get()
		if err != nil {
			first.CompareAndSwap(nil, err)
			return false, err
		}
		dl, _ := ctx.Deadline()
		status, err := c.do(env.reqs[k], dl)
		if err != nil {
			c.Close()
			if status == 0 {
				first.CompareAndSwap(nil, err)
				return false, err
			}
		} else {
			pool.put(c)
		}
		return status == 200, nil
	}
	var before, after cpuSnap
	res := runOpenLoop(po, fn, func() { before = env.snap(e.Pid()) }, func() { after = env.snap(e.Pid()) })
	run := OpenRun{PacedResult: res}
	run.raw = before.to(after, res.Sent)
	if e, ok := first.Load().(error); ok {
		run.FirstErr = e.Error()
	}
	// Errors (requests not answered within the timeout, connections that failed) are
	// the limiter's result at this rate, reported with the run, not a failure of it.
	return run, nil
}

// profile samples e's threads with perf record over a closed-loop chunk of
// o.ProfileFor (Envoy as busy as it gets, so the samples are Envoy's work and not its
// idle loop), and returns the chunk and the samples' shares by shared object.
func (env *compareEnv) profile(e *Envoy, dir string) (ClosedRun, []DSOShare, error) {
	data := dir + "/perf-" + strconv.Itoa(e.Pid()) + ".data"
	secs := strconv.FormatFloat(env.o.ProfileFor.Seconds(), 'f', 2, 64)
	var recErr error
	var recOut []byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		rec := exec.Command("perf", "record", "-F", "999", "-p", strconv.Itoa(e.Pid()), "-o", data, "--", "sleep", secs)
		recOut, recErr = rec.CombinedOutput()
	}()
	run, err := env.closed(e, env.o.ProfileFor)
	<-done
	if err != nil {
		return run, nil, err
	}
	if recErr != nil {
		return run, nil, fmt.Errorf("perf record: %w: %s", recErr, recOut)
	}
	rep, err := exec.Command("perf", "report", "-i", data, "--sort", "dso", "--stdio", "--percent-limit", "0.5").Output()
	if err != nil {
		return run, nil, fmt.Errorf("perf report: %w", err)
	}
	return run, parseDSOReport(string(rep)), nil
}

// parseDSOReport reads `perf report --sort dso --stdio`'s "  57.09%  libc.so.6" lines.
func parseDSOReport(s string) []DSOShare {
	var out []DSOShare
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || !strings.HasSuffix(f[0], "%") {
			continue
		}
		p, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
		if err != nil {
			continue
		}
		out = append(out, DSOShare{DSO: strings.Join(f[1:], " "), Share: p / 100})
	}
	return out
}
