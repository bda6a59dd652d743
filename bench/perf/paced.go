package perf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// PacedOptions shapes an open-loop load: Keys keys, each a Poisson process of PerKey
// requests per second (one Poisson stream of Keys × PerKey requests/s whose every
// request is for a key drawn uniformly), sent on that schedule whatever the answers
// take. A request's latency is measured from its scheduled time, not from when it was
// sent, so a request that waits behind a slow one (or behind a late scheduler) counts
// the wait: what a client that does not slow down with the server sees.
type PacedOptions struct {
	Keys   int
	PerKey float64 // requests per second per key
	// Warmup runs the same schedule unmeasured before the Duration measured.
	Warmup, Duration time.Duration
	Workers          int // gateway worker VMs (default 2)
	// MaxInFlight bounds the requests in flight: a request scheduled while that many
	// are unanswered is not sent and counts as Dropped (default 4,096).
	MaxInFlight int
	// Timeout ends a request that has not been answered (an error; default 5 s).
	Timeout   time.Duration
	KeyPrefix string
	Seed      uint64
	// HTTP sends the requests through a gateway front over loopback HTTP (RunHTTP's
	// path) instead of into the gateway host in this process (RunTollgate's).
	HTTP bool
}

func (o PacedOptions) withDefaults() PacedOptions {
	if o.Keys <= 0 {
		o.Keys = 1
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.Duration <= 0 {
		o.Duration = 5 * time.Second
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 4096
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = fmt.Sprintf("p%d", time.Now().UnixNano()%1e9)
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	return o
}

// Rate is the offered load in all, requests per second.
func (o PacedOptions) Rate() float64 { return float64(o.Keys) * o.PerKey }

// PacedResult is one open-loop run.
type PacedResult struct {
	LoadResult
	Keys   int
	PerKey float64
	// Dropped counts requests of the measured time not sent because MaxInFlight were
	// unanswered; a run with drops did not carry the load.
	Dropped int64
	// SendLagP99 is the 99th percentile of how late the scheduler sent a request: the
	// harness's own share of every latency.
	SendLagP99 time.Duration
	// Sent counts the measured requests that were sent (not dropped): those whose
	// sending the snapshots enclose, so the ones the gateway host's counters (Held) saw.
	Sent int64
	// InFlightStart and InFlightEnd are the requests unanswered when the first and the
	// last snapshot were taken: the work that may fall on either side of one.
	InFlightStart, InFlightEnd int64
}

// HeldShare is the share of the requests sent in the measured time that the gateway
// host paused, in per cent.
func (r PacedResult) HeldShare() float64 {
	if r.Sent == 0 {
		return 0
	}
	return 100 * float64(r.Held) / float64(r.Sent)
}

// pacedCheck runs one request for key index k.
type pacedCheck func(ctx context.Context, k int) (admitted bool, err error)

// newSchedule returns o's schedule: each call gives the next request's time from the
// start of the run, its key and whether it is in the measured time, until ok is false at
// the end of the run. The warm-up and the measured time draw from random streams of
// their own, so runs with the same seed offer the same measured schedule whatever their
// warm-up.
func newSchedule(o PacedOptions) func() (at time.Duration, key int, measured, ok bool) {
	rng := rand.New(rand.NewPCG(o.Seed, 0x706163656421))
	measuredRng := rand.New(rand.NewPCG(o.Seed, 0x6d6561737572))
	gap := 1 / o.Rate() // seconds between requests, on average
	var t float64       // seconds since the start
	from, to := o.Warmup.Seconds(), (o.Warmup + o.Duration).Seconds()
	return func() (time.Duration, int, bool, bool) {
		t += rng.ExpFloat64() * gap
		if rng != measuredRng && t >= from {
			rng, t = measuredRng, from+measuredRng.ExpFloat64()*gap
		}
		if t >= to || o.Rate() <= 0 {
			return 0, 0, false, false
		}
		return time.Duration(t * 1e9), rng.IntN(o.Keys), t >= from, true
	}
}

// runOpenLoop runs fn on o's schedule: o.Warmup unmeasured, then o.Duration measured.
// The scheduler calls before just before it sends the first request of the measured
// time and after once it has sent the last, so the snapshots they take enclose exactly
// the measured requests' sending (a snapshot delays the next sends by its own duration,
// which their latency counts). Requests scheduled in the measured time are the checks of
// the result; the run returns when every one of them has been answered or timed out.
func runOpenLoop(o PacedOptions, fn pacedCheck, before, after func()) PacedResult {
	res := PacedResult{Keys: o.Keys, PerKey: o.PerKey}
	res.Rate = o.Rate()
	next := newSchedule(o)
	var (
		mu                     sync.Mutex
		lats, lags             []time.Duration
		wg                     sync.WaitGroup
		inflight               atomic.Int64
		checks, admitted, errs atomic.Int64
		dropped, sent          int64
		started                bool
		measuredAt             time.Time
		start                  = time.Now()
		ctx, cancel            = context.WithCancel(context.Background())
	)
	defer cancel()
	for {
		offset, k, inMeasure, ok := next()
		if !ok {
			break
		}
		at := start.Add(offset)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		if inMeasure && !started {
			started = true
			res.InFlightStart = inflight.Load()
			if before != nil {
				before()
			}
			measuredAt = time.Now()
		}
		if inflight.Load() >= int64(o.MaxInFlight) {
			if inMeasure {
				dropped++
			}
			continue
		}
		if inMeasure {
			sent++
			mu.Lock()
			lags = append(lags, time.Since(at))
			mu.Unlock()
		}
		inflight.Add(1)
		wg.Add(1)
		go func(at time.Time, k int, measured bool) {
			defer wg.Done()
			defer inflight.Add(-1)
			rctx, rcancel := context.WithTimeout(ctx, o.Timeout)
			ok, err := fn(rctx, k)
			rcancel()
			lat := time.Since(at)
			if !measured {
				return
			}
			checks.Add(1)
			if err != nil {
				errs.Add(1)
				return
			}
			if ok {
				admitted.Add(1)
			}
			mu.Lock()
			lats = append(lats, lat)
			mu.Unlock()
		}(at, k, inMeasure)
	}
	if !started { // nothing scheduled in the measured time
		res.InFlightStart = inflight.Load()
		if before != nil {
			before()
		}
		measuredAt = time.Now()
	}
	// The last requests are still being answered: their Redis work falls after the
	// snapshot as the warm-up's last requests' fell after the first one.
	if d := time.Until(start.Add(o.Warmup + o.Duration)); d > 0 {
		time.Sleep(d)
	}
	res.Elapsed = time.Since(measuredAt)
	res.InFlightEnd = inflight.Load()
	if after != nil {
		after()
	}
	wg.Wait()
	res.Sent = sent
	res.Checks, res.Admitted, res.Errors, res.Dropped = checks.Load(), admitted.Load(), errs.Load(), dropped
	res.ChecksPerSec = float64(res.Checks) / o.Duration.Seconds()
	slices.Sort(lats)
	res.P50, res.P90, res.P99, res.P999 = Percentile(lats, 50), Percentile(lats, 90), Percentile(lats, 99), Percentile(lats, 99.9)
	if len(lats) > 0 {
		res.PMax = lats[len(lats)-1]
	}
	slices.Sort(lags)
	res.SendLagP99 = Percentile(lags, 99)
	return res
}

// RunPaced offers o's open-loop load to kind's limiter (HTTPTollgate: the filter synced
// with the service; HTTPRedisRate: redis_rate's Allow, then the pass-through module;
// HTTPPassThrough: the pass-through module alone), GCRA limit/s per key. By default the
// requests go into the gateway host in this process as RunTollgate's do (the n-th
// request of the schedule to worker n mod Workers; a held request waits for the
// filter's answer without holding its worker); with o.HTTP through a gateway front and
// one shared keep-alive connection pool, as RunHTTP's. Either way a request that is
// held does not hold up the next one of the schedule.
func (s *Stack) RunPaced(o PacedOptions, kind HTTPKind, limit int) (PacedResult, error) {
	o = o.withDefaults()
	if o.PerKey <= 0 {
		return PacedResult{}, fmt.Errorf("paced run: %v requests/s per key", o.PerKey)
	}
	var (
		fn   pacedCheck
		h    *wazerohost.Host
		name string
	)
	if o.HTTP {
		// Concurrency sizes redis_rate's connection pool (2 × 128) for the open loop's requests in flight.
		g, err := s.startGateway(LoadOptions{Workers: o.Workers, Concurrency: 128}, kind, limit)
		if err != nil {
			return PacedResult{}, err
		}
		defer g.close()
		tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1024, DisableCompression: true}
		client := &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
		fn = func(ctx context.Context, k int) (bool, error) {
			return g.get(ctx, client, o.KeyPrefix+"-"+strconv.Itoa(k))
		}
		h, name = g.h, g.name
	} else {
		var closeFn func()
		var err error
		fn, h, name, closeFn, err = s.pacedInProcess(o, kind, limit)
		if err != nil {
			return PacedResult{}, err
		}
		defer closeFn()
	}
	var pr PacedResult
	res := s.measureWith(func(before, after func()) LoadResult {
		pr = runOpenLoop(o, fn, before, after)
		return pr.LoadResult
	}, h)
	pr.LoadResult = res // Redis work, held requests and metrics between the snapshots
	pr.Name = name
	if kind == HTTPRedisRate {
		pr.RoundTrips = pr.Redis.Scripts()
	}
	return pr, nil
}

// pacedInProcess is the request of kind's limiter into a gateway host in this process.
func (s *Stack) pacedInProcess(o PacedOptions, kind HTTPKind, limit int) (pacedCheck, *wazerohost.Host, string, func(), error) {
	lo := LoadOptions{Workers: o.Workers, KeySpace: o.Keys, KeyPrefix: o.KeyPrefix}.withDefaults()
	reqs := requests(lo)
	var next atomic.Uint64
	worker := func() int { return int(next.Add(1) % uint64(o.Workers)) }
	switch kind {
	case HTTPTollgate:
		h, err := s.tollgateHost(lo, "gcra", limit, true, nil)
		if err != nil {
			return nil, nil, "", nil, err
		}
		fn := func(ctx context.Context, k int) (bool, error) {
			resp, err := h.ExchangeWait(ctx, worker(), reqs(k), UpstreamOK)
			if err != nil {
				return false, err
			}
			return resp.Status == 200, nil
		}
		return fn, h, "Tollgate (filter, 100 ms sync)", func() { h.Close() }, nil
	case HTTPRedisRate, HTTPPassThrough:
		h, err := wazerohost.New(wazerohost.Config{Wasm: s.Empty, Workers: o.Workers, LogLevel: wazerohost.LogWarn})
		if err != nil {
			return nil, nil, "", nil, fmt.Errorf("pass-through host: %w", err)
		}
		pass := func(k int) (bool, error) {
			resp, err := h.Exchange(worker(), reqs(k), UpstreamOK)
			if err != nil {
				return false, err
			}
			return resp.Status == 200, nil
		}
		if kind == HTTPPassThrough {
			return func(_ context.Context, k int) (bool, error) { return pass(k) }, h, "pass-through (no limiter)", func() { h.Close() }, nil
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Redis.Options().Addr, PoolSize: 256})
		lim := redis_rate.NewLimiter(rdb)
		rl := redis_rate.PerSecond(limit)
		fn := func(ctx context.Context, k int) (bool, error) {
			r, err := lim.Allow(ctx, o.KeyPrefix+"-"+strconv.Itoa(k), rl)
			if err != nil {
				return false, err
			}
			if r.Allowed == 0 {
				return false, nil
			}
			return pass(k)
		}
		return fn, h, "per-request redis_rate (GCRA)", func() { h.Close(); rdb.Close() }, nil
	}
	return nil, nil, "", nil, fmt.Errorf("paced run: no in-process path for limiter kind %d", kind)
}
