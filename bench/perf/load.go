package perf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// ClusterName is the Envoy cluster name of the sync service in the benchmark's plugin
// configurations.
const ClusterName = "tollgate_ratelimit"

// SyncRuleConfig is a plugin configuration with one rule (algorithm algo, limit per
// second) synced every 100 ms to the service behind ClusterName. The key is the
// x-api-key header with no fallback (the default key falls back to the client IP,
// which makes the filter read the peer address on every request).
func SyncRuleConfig(node, algo string, limit int) []byte {
	return []byte(`{"sync":{"cluster":"` + ClusterName + `","authority":"ratelimit","secret":"` + SyncSecret +
		`","node":"` + node + `","interval_ms":100,"timeout_ms":250},` +
		`"key":{"source":"header","name":"x-api-key"},` +
		`"rules":[{"id":"api","algorithm":"` + algo + `","limit":` + strconv.Itoa(limit) + `,"window":"1s"}]}`)
}

// LocalConfig is SyncRuleConfig without the sync section: every decision local.
func LocalConfig(algo string, limit int) []byte {
	return []byte(`{"key":{"source":"header","name":"x-api-key"},` +
		`"rules":[{"id":"api","algorithm":"` + algo + `","limit":` + strconv.Itoa(limit) + `,"window":"1s"}]}`)
}

// LoadOptions shapes a closed-loop load: Concurrency goroutines, each sending its next
// request as soon as the previous one is answered, with keys drawn by Keys.
type LoadOptions struct {
	Concurrency int           // default 8
	Workers     int           // wasm worker VMs (Envoy --concurrency), default 2
	Duration    time.Duration // measured (default 5 s)
	Warmup      time.Duration // before the measurement (default 1 s)
	// Keys returns, for one goroutine's rng, the generator of its key indexes
	// (default: uniform over KeySpace).
	Keys func(rng *rand.Rand) func() int
	// KeySpace is the number of distinct keys Keys draws from (default 10,000).
	KeySpace int
	// KeyPrefix makes the keys of one run distinct from other runs on the same Redis.
	KeyPrefix string
	// Rate, when > 0, paces the load to Rate requests/s in all (each goroutine sends on
	// its own schedule of Concurrency/Rate intervals) instead of closed-loop, so latency
	// is measured below saturation. A goroutine that falls behind its schedule sends at
	// once (the latency of the late request does not include the lateness).
	Rate float64
}

func (o LoadOptions) withDefaults() LoadOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.Duration <= 0 {
		o.Duration = 5 * time.Second
	}
	if o.Warmup <= 0 {
		o.Warmup = time.Second
	}
	if o.KeySpace <= 0 {
		o.KeySpace = 10_000
	}
	if o.Keys == nil {
		o.Keys = Uniform(o.KeySpace)
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = fmt.Sprintf("b%d", time.Now().UnixNano()%1e9)
	}
	return o
}

// LoadResult is what one load run measured.
type LoadResult struct {
	Name                      string
	Concurrency               int
	Rate                      float64 // offered rate (0: closed loop)
	Checks, Admitted, Errors  int64
	Elapsed                   time.Duration
	ChecksPerSec              float64
	P50, P90, P99, P999, PMax time.Duration
	Redis                     RedisWork
	// RoundTrips is Redis round trips in the measured time: pipelines of the sync
	// service for Tollgate, one per check for a per-request limiter.
	RoundTrips int64
	// Metrics is the change of the filter's metrics over the measured time.
	Metrics map[string]int64
	// Held is the requests the gateway host paused in the measured time (the filter
	// held them for an acquire or a strict check until the service answered).
	Held int64
}

// RedisWholeCPUPerCheck is the redis-server process's CPU per check (µs), all its
// threads and idle work included (RedisWork.WholeCPU).
func (r LoadResult) RedisWholeCPUPerCheck() float64 {
	if r.Checks == 0 {
		return 0
	}
	return r.Redis.WholeCPU() * 1e6 / float64(r.Checks)
}

// HeldShare is the share of checks the gateway host paused, in per cent.
func (r LoadResult) HeldShare() float64 {
	if r.Checks == 0 {
		return 0
	}
	return 100 * float64(r.Held) / float64(r.Checks)
}

// RedisCPUPerCheck is Redis CPU time per check, in µs.
func (r LoadResult) RedisCPUPerCheck() float64 {
	if r.Checks == 0 {
		return 0
	}
	return r.Redis.CPU * 1e6 / float64(r.Checks)
}

// checkFunc runs one request for key index k on goroutine g and reports whether it was
// admitted.
type checkFunc func(ctx context.Context, g, k int) (admitted bool, err error)

// runLoad runs fn closed-loop: o.Warmup unmeasured, then o.Duration measured, with
// before/after hooks around the measured part.
func runLoad(o LoadOptions, fn checkFunc, before, after func()) LoadResult {
	res := LoadResult{Concurrency: o.Concurrency, Rate: o.Rate}
	phase := func(d time.Duration, measure bool) {
		var stop atomic.Bool
		var mu sync.Mutex
		var lats []time.Duration
		var wg sync.WaitGroup
		var checks, admitted, errs atomic.Int64
		start := time.Now()
		for g := 0; g < o.Concurrency; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g)+1, uint64(time.Now().UnixNano())))
				mine := make([]time.Duration, 0, 1<<16)
				ctx := context.Background()
				var n, a, e int64
				var every time.Duration
				if o.Rate > 0 {
					every = time.Duration(float64(o.Concurrency) / o.Rate * 1e9)
				}
				keys := o.Keys(rng)
				next := start.Add(time.Duration(rng.Int64N(int64(max(every, 1)))))
				for !stop.Load() {
					if every > 0 {
						if d := time.Until(next); d > 0 {
							time.Sleep(d)
						}
						next = next.Add(every)
					}
					k := keys()
					t0 := time.Now()
					ok, err := fn(ctx, g, k)
					lat := time.Since(t0)
					n++
					if err != nil {
						e++
						continue
					}
					if ok {
						a++
					}
					if measure {
						mine = append(mine, lat)
					}
				}
				checks.Add(n)
				admitted.Add(a)
				errs.Add(e)
				mu.Lock()
				lats = append(lats, mine...)
				mu.Unlock()
			}(g)
		}
		time.Sleep(d)
		stop.Store(true)
		wg.Wait()
		if !measure {
			return
		}
		res.Elapsed = time.Since(start)
		res.Checks, res.Admitted, res.Errors = checks.Load(), admitted.Load(), errs.Load()
		res.ChecksPerSec = float64(res.Checks) / res.Elapsed.Seconds()
		slices.Sort(lats)
		res.P50, res.P90, res.P99, res.P999 = Percentile(lats, 50), Percentile(lats, 90), Percentile(lats, 99), Percentile(lats, 99.9)
		if len(lats) > 0 {
			res.PMax = lats[len(lats)-1]
		}
	}
	phase(o.Warmup, false)
	if before != nil {
		before()
	}
	phase(o.Duration, true)
	if after != nil {
		after()
	}
	return res
}

// Uniform draws keys uniformly from n.
func Uniform(n int) func(*rand.Rand) func() int {
	return func(rng *rand.Rand) func() int { return func() int { return rng.IntN(n) } }
}

// Zipf draws keys from n with a Zipf law of exponent s (> 1): key 0 the most frequent.
func Zipf(n int, s float64) func(*rand.Rand) func() int {
	return func(rng *rand.Rand) func() int {
		z := rand.NewZipf(rng, s, 1, uint64(n-1))
		return func() int { return int(z.Uint64()) }
	}
}

// Hot sends every request for key 0.
func Hot(*rand.Rand) func() int { return func() int { return 0 } }

// maxPrebuilt bounds the requests built ahead of a run; larger key spaces build each
// request when it is sent.
const maxPrebuilt = 100_000

// requests returns the request for a key index: built ahead (shared read-only by all
// goroutines) for small key spaces, built per call for large ones.
func requests(o LoadOptions) func(k int) *wazerohost.Request {
	if o.KeySpace > maxPrebuilt {
		return func(k int) *wazerohost.Request { return BenchRequest(o.KeyPrefix + "-" + strconv.Itoa(k)) }
	}
	out := make([]*wazerohost.Request, o.KeySpace)
	for i := range out {
		out[i] = BenchRequest(o.KeyPrefix + "-" + strconv.Itoa(i))
	}
	return func(k int) *wazerohost.Request { return out[k] }
}

// Stack is what a load run needs: the modules, the Redis server and the sync service.
type Stack struct {
	Filter, Empty []byte
	Floor         []byte        // the floor module, for the HTTP comparison (optional)
	Redis         *redis.Client // for INFO and for the per-request limiter
	Service       *Service
}

func (s *Stack) info() RedisInfo {
	in, err := ReadInfo(context.Background(), s.Redis)
	if err != nil {
		return RedisInfo{}
	}
	return in
}

// RunTollgate is Tollgate's decision path under load: the compiled filter on
// o.Workers VMs, syncing every 100 ms with the service (or, with synced false, deciding
// locally only), one rule of algorithm algo and limit/s per key; goroutine g sends to worker g mod Workers through Exchange, so a request may
// wait for its worker like a request queued on an Envoy worker thread.
func (s *Stack) RunTollgate(o LoadOptions, algo string, limit int, synced bool) (LoadResult, error) {
	o = o.withDefaults()
	h, err := s.tollgateHost(o, algo, limit, synced, nil)
	if err != nil {
		return LoadResult{}, err
	}
	defer h.Close()
	reqs := requests(o)
	fn := func(_ context.Context, g, k int) (bool, error) {
		resp, err := h.ExchangeWait(context.Background(), g%o.Workers, reqs(k), UpstreamOK)
		if err != nil {
			return false, err
		}
		return resp.Status == 200, nil
	}
	res := s.measure(o, fn, h)
	res.Name = "Tollgate (filter, 100 ms sync)"
	if !synced {
		res.Name = "Tollgate (filter, local only)"
	}
	return res, nil
}

// tollgateHost starts the filter with SyncRuleConfig (synced) or LocalConfig on
// o.Workers VMs.
func (s *Stack) tollgateHost(o LoadOptions, algo string, limit int, synced bool, upstream wazerohost.Upstream) (*wazerohost.Host, error) {
	cfg := SyncRuleConfig("gw-bench", algo, limit)
	if !synced {
		cfg = LocalConfig(algo, limit)
	}
	h, err := wazerohost.New(wazerohost.Config{
		Wasm: s.Filter, Workers: o.Workers, PluginConfig: cfg,
		NodeID: "gw-bench", Clusters: map[string][]string{ClusterName: {s.Service.Addr}},
		Upstream: upstream, LogLevel: wazerohost.LogWarn,
	})
	if err != nil {
		return nil, fmt.Errorf("tollgate host: %w", err)
	}
	return h, nil
}

// measure runs fn under o and fills in the Redis work, the service's round trips and,
// when h is not nil, the change of the filter's metrics.
func (s *Stack) measure(o LoadOptions, fn checkFunc, h *wazerohost.Host) LoadResult {
	return s.measureWith(func(before, after func()) LoadResult { return runLoad(o, fn, before, after) }, h)
}

// measureWith is measure for any load runner: run calls before when the measured time
// starts and after when it ends.
func (s *Stack) measureWith(run func(before, after func()) LoadResult, h *wazerohost.Host) LoadResult {
	var in0, in1 RedisInfo
	var t0, t1, p0, p1 int64
	var m0, m1 map[string]int64
	snap := func(in *RedisInfo, t, p *int64, m *map[string]int64) {
		*in = s.info()
		if s.Service != nil {
			*t, _ = s.Service.RoundTrips()
		}
		if h != nil {
			*m = h.Metrics()
			*p = h.Stats().Paused
		}
	}
	res := run(func() { snap(&in0, &t0, &p0, &m0) }, func() { snap(&in1, &t1, &p1, &m1) })
	res.Redis = in1.Since(in0)
	res.RoundTrips = t1 - t0
	res.Held = p1 - p0
	if h != nil {
		res.Metrics = map[string]int64{}
		for k, v := range m1 {
			if d := v - m0[k]; d != 0 {
				res.Metrics[k] = d
			}
		}
	}
	return res
}

// RunRedisRate is the per-request limiter in the same harness: goroutine g calls
// go-redis/redis_rate's Allow (GCRA, one EVALSHA round trip to Redis) for the key, then,
// when admitted, runs the request through the pass-through module on worker
// g mod Workers, as Envoy's ratelimit filter asks its service before the request
// continues. A rejection is answered without the module.
func (s *Stack) RunRedisRate(o LoadOptions, limit int) (LoadResult, error) {
	o = o.withDefaults()
	rdb := redis.NewClient(&redis.Options{Addr: s.Redis.Options().Addr, PoolSize: max(2*o.Concurrency, 20)})
	defer rdb.Close()
	lim := redis_rate.NewLimiter(rdb)
	h, err := wazerohost.New(wazerohost.Config{Wasm: s.Empty, Workers: o.Workers, LogLevel: wazerohost.LogWarn})
	if err != nil {
		return LoadResult{}, fmt.Errorf("pass-through host: %w", err)
	}
	defer h.Close()
	reqs := requests(o)
	rl := redis_rate.PerSecond(limit)
	fn := func(ctx context.Context, g, k int) (bool, error) {
		r, err := lim.Allow(ctx, o.KeyPrefix+"-"+strconv.Itoa(k), rl)
		if err != nil {
			return false, err
		}
		if r.Allowed == 0 {
			return false, nil
		}
		resp, err := h.Exchange(g%o.Workers, reqs(k), UpstreamOK)
		if err != nil {
			return false, err
		}
		return resp.Status == 200, nil
	}
	res := s.measure(o, fn, nil)
	res.Name = "per-request redis_rate (GCRA)"
	res.RoundTrips = res.Redis.Scripts()
	return res, nil
}

// RunPassThrough is the baseline: the pass-through module alone, no limiter.
func (s *Stack) RunPassThrough(o LoadOptions) (LoadResult, error) {
	o = o.withDefaults()
	h, err := wazerohost.New(wazerohost.Config{Wasm: s.Empty, Workers: o.Workers, LogLevel: wazerohost.LogWarn})
	if err != nil {
		return LoadResult{}, fmt.Errorf("pass-through host: %w", err)
	}
	defer h.Close()
	reqs := requests(o)
	fn := func(_ context.Context, g, k int) (bool, error) {
		resp, err := h.Exchange(g%o.Workers, reqs(k), UpstreamOK)
		if err != nil {
			return false, err
		}
		return resp.Status == 200, nil
	}
	res := s.measure(o, fn, nil)
	res.Name = "pass-through (no limiter)"
	return res, nil
}
