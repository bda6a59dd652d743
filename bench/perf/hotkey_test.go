package perf

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// BenchmarkHotKeysAtLimit is the closed-loop hot-key run of `make bench` in short: 100
// keys of a GCRA rule of 1,000/s driven to their limit by 8 closed-loop clients through
// the synced filter (2 worker VMs), beside redis_rate on the same keys, each on a fresh
// Redis; it reports both limiters' Redis CPU per check (whole redis-server process, idle
// included) and their ratio, and how many of Tollgate's script calls were acquires:
//
//	go test -run '^$' -bench HotKeysAtLimit -benchtime 1x ./bench/perf
//
// TOLLGATE_HOT_SECONDS sets the measured time (default 10 s, after a 4 s warm-up),
// TOLLGATE_HOT_LIMIT the rule's limit per key and second (default 1,000: a machine
// slower than 100,000 checks/s does not drive the keys to their limit, and a lower limit
// does), TOLLGATE_HOT_RATE a paced load in requests/s in all instead of the closed loop
// (100 × the limit: every key at its limit). b.N is ignored: one comparison runs.
func BenchmarkHotKeysAtLimit(b *testing.B) {
	secs := 10
	if n, err := strconv.Atoi(os.Getenv("TOLLGATE_HOT_SECONDS")); err == nil && n > 0 {
		secs = n
	}
	limit := 1000
	if n, err := strconv.Atoi(os.Getenv("TOLLGATE_HOT_LIMIT")); err == nil && n > 0 {
		limit = n
	}
	o := LoadOptions{KeySpace: 100, Duration: time.Duration(secs) * time.Second, Warmup: 4 * time.Second}
	if r, err := strconv.ParseFloat(os.Getenv("TOLLGATE_HOT_RATE"), 64); err == nil && r > 0 {
		o.Rate = r
	}
	filter, err := BuildModule(FilterPkg)
	if err != nil {
		b.Fatal(err)
	}
	empty, err := BuildModule(EmptyPkg)
	if err != nil {
		b.Fatal(err)
	}
	run := func(tollgate bool) LoadResult {
		srv, err := redistest.Launch(redistest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Stop()
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		st := &Stack{Filter: filter, Empty: empty, Redis: rdb}
		if !tollgate {
			res, err := st.RunRedisRate(o, limit)
			if err != nil {
				b.Fatal(err)
			}
			return res
		}
		svc, err := StartService(store.Standalone, srv.Addrs())
		if err != nil {
			b.Fatal(err)
		}
		defer svc.Close()
		st.Service = svc
		res, err := st.RunTollgate(o, "gcra", limit, true)
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	tg, rr := run(true), run(false)
	for _, r := range []LoadResult{tg, rr} {
		b.Logf("%-32s %8.0f checks/s  admitted %5.1f %%  Redis CPU %6.2f µs/check  script calls %d  metrics %v",
			r.Name, r.ChecksPerSec, 100*float64(r.Admitted)/float64(max(r.Checks, 1)), r.RedisCPUPerCheck(), r.Redis.Scripts(), r.Metrics)
	}
	ratio := rr.RedisCPUPerCheck() / max(tg.RedisCPUPerCheck(), 1e-9)
	b.Logf("Tollgate's Redis CPU per check is 1/%.1f of redis_rate's", ratio)
	b.ReportMetric(ratio, "x-redis_rate")
	b.ReportMetric(tg.RedisCPUPerCheck(), "tollgate-µs/check")
	b.ReportMetric(rr.RedisCPUPerCheck(), "redis_rate-µs/check")
}
