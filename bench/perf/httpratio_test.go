package perf

import (
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// BenchmarkHTTPRatio is the gateway-host comparison of `make bench` (pass-through, the
// floor module, and the filter with its 100 ms sync, 10,000 keys, the filter's keys
// leased in a warm-up) run alone, to compare a change side by side:
//
//	go test -run '^$' -bench HTTPRatio -benchtime 1x ./bench/perf
//
// TOLLGATE_HTTP_PROFILE=DIR writes a CPU profile of each run (the process holds the
// load generator, the gateway host, the upstream and the sync service; Redis is its
// own process and reported as CPU per check). b.N is ignored: one comparison runs.
func BenchmarkHTTPRatio(b *testing.B) {
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	svc, err := StartService(store.Standalone, srv.Addrs())
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()
	filter, err := BuildModule(FilterPkg)
	if err != nil {
		b.Fatal(err)
	}
	empty, err := BuildModule(EmptyPkg)
	if err != nil {
		b.Fatal(err)
	}
	floor, err := BuildModule(FloorPkg)
	if err != nil {
		b.Fatal(err)
	}
	st := &Stack{Filter: filter, Empty: empty, Floor: floor, Redis: rdb, Service: svc}
	o := LoadOptions{Duration: 5 * time.Second, Warmup: 12 * time.Second}
	dir := os.Getenv("TOLLGATE_HTTP_PROFILE")
	run := func(name string, kind HTTPKind) LoadResult {
		if dir != "" {
			f, err := os.Create(dir + "/" + name + ".prof")
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
			defer pprof.StopCPUProfile()
		}
		r, err := st.RunHTTP(o, kind, 1000) // make bench's limit per key (never reached)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%-14s %8.0f req/s  p50 %v  p99 %v  Redis %.1f µs/request  round trips %d",
			name, r.ChecksPerSec, r.P50, r.P99, r.RedisCPUPerCheck(), r.RoundTrips)
		return r
	}
	pass := run("pass-through", HTTPPassThrough)
	fl := run("floor", HTTPFloor)
	tg := run("tollgate", HTTPTollgate)
	b.Logf("floor %.0f %% of the pass-through's requests/s, Tollgate %.0f %% (%.0f %% of the floor's)",
		100*fl.ChecksPerSec/pass.ChecksPerSec, 100*tg.ChecksPerSec/pass.ChecksPerSec, 100*tg.ChecksPerSec/fl.ChecksPerSec)
	b.ReportMetric(tg.ChecksPerSec/pass.ChecksPerSec, "x-pass-through")
	b.ReportMetric(0, "ns/op")
}
