package perf

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// TestGCRAMatchesRedisRate replays the same request sequences (times and costs)
// through Tollgate's GCRA — shared/algo in Go and the sync service's Lua fragment in
// Redis — and through go-redis/redis_rate's unmodified script on a pinned clock, on one
// real Redis: Go and Lua agree bit for bit; redis_rate makes the same decisions except
// within 1 µs of a boundary (its float seconds), and its retry-after and reset-after
// are within 1 ms. The intended differences are in BENCHMARKS.md.
func TestGCRAMatchesRedisRate(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	rep, err := Differential(context.Background(), rdb, 2, 300)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Failures {
		t.Error(f)
	}
	if rep.GoLuaMismatches != 0 || rep.RemainingOtherwise != 0 {
		t.Errorf("Go/Lua mismatches %d, remaining mismatches %d", rep.GoLuaMismatches, rep.RemainingOtherwise)
	}
	if rep.Allowed == 0 || rep.Rejected == 0 {
		t.Errorf("sequences exercised only one outcome: %d allowed, %d rejected", rep.Allowed, rep.Rejected)
	}
	if rep.MaxRetryDiffUs > 1000 || rep.MaxResetDiffUs > 1000 {
		t.Errorf("retry-after differs by up to %.1f µs, reset by %.1f µs (limit 1000)", rep.MaxRetryDiffUs, rep.MaxResetDiffUs)
	}
	t.Logf("%+v", *rep)
}

// TestPinnedClock checks the harness itself: redis_rate on a pinned clock must see the
// pinned time, not the server's, or the differential compares nothing.
func TestPinnedClock(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	pc := &PinnedClock{Client: rdb, NowUs: DiffEpochUs}
	lim := LimiterOnClock(pc)
	ctx := context.Background()
	limit := redisRateLimit(1, 1) // one per second, burst 1
	cases := []struct {
		name    string
		atUs    int64
		allowed bool
	}{
		{"first request", 0, true},
		{"same instant", 0, false},
		{"half a second later", 500_000, false},
		{"one second later", 1_000_000, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pc.NowUs = DiffEpochUs + c.atUs
			r, err := lim.Allow(ctx, "pinned", limit)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Allowed > 0; got != c.allowed {
				t.Fatalf("allowed=%v at +%d µs, want %v (result %+v)", got, c.atUs, c.allowed, r)
			}
		})
	}
}
