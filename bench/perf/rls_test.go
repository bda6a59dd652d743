package perf

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
)

func TestStatCPU(t *testing.T) {
	// Fields 14 and 15 (utime, stime) are 250 and 50 ticks.
	tail := " S 1 2 3 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1234 5678 90 18446744073709551615"
	cases := []struct {
		name, line string
		want       time.Duration
		err        string
	}{
		{"plain name", "4242 (tollgate-ratel)" + tail, 3 * time.Second, ""},
		{"name with spaces and parentheses", "4242 (a) b (c)" + tail, 3 * time.Second, ""},
		{"truncated", "4242 (x) S 1 2 3", 0, "too few fields"},
		{"no name", "4242 x S", 0, "no command name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := statCPU([]byte(c.line))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestCompareRLS runs the gRPC section in small against the service built from this
// tree: every check answered, the service's round trips and CPU seen, and redis_rate's
// round trips exactly its checks (one EVALSHA each), so the section's columns measure
// what they say.
func TestCompareRLS(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	out, err := CompareRLS("", rdb, LoadOptions{Concurrency: 4, Duration: 500 * time.Millisecond, Warmup: 200 * time.Millisecond}, []int{1, 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 {
		t.Fatalf("%d comparisons, want 2", len(out))
	}
	for _, c := range out {
		t.Run(fmt.Sprint(c.Keys, " keys"), func(t *testing.T) {
			r := c.Rate
			for _, s := range []RLSResult{c.Leases, c.Strict} {
				if s.Load.Checks == 0 || s.Load.Errors != 0 || s.Load.Admitted != s.Load.Checks {
					t.Errorf("service: %d checks, %d errors, %d admitted", s.Load.Checks, s.Load.Errors, s.Load.Admitted)
				}
				if s.RoundTrips < 0 || s.RoundTrips > s.Load.Checks {
					t.Errorf("service: %d round trips for %d checks", s.RoundTrips, s.Load.Checks)
				}
				if s.ServiceCPU <= 0 || s.Load.Redis.CPU <= 0 {
					t.Errorf("service CPU %v, Redis CPU %v s", s.ServiceCPU, s.Load.Redis.CPU)
				}
			}
			if c.Strict.RoundTrips == 0 || c.Leases.RoundTripsPerCheck() >= c.Strict.RoundTripsPerCheck() {
				t.Errorf("round trips per check: %.4f with leases, %.4f without: leases should decide most checks in memory",
					c.Leases.RoundTripsPerCheck(), c.Strict.RoundTripsPerCheck())
			}
			if r.Load.Checks == 0 || r.Load.Errors != 0 || r.RoundTrips != r.Load.Checks {
				t.Errorf("redis_rate: %d checks, %d errors, %d round trips", r.Load.Checks, r.Load.Errors, r.RoundTrips)
			}
			t.Logf("leases %d checks, %.4f round trips/check, %.0f µs CPU/check; without %d checks, %.3f, %.0f µs; redis_rate %d checks",
				c.Leases.Load.Checks, c.Leases.RoundTripsPerCheck(), c.Leases.ServiceCPUPerCheck(),
				c.Strict.Load.Checks, c.Strict.RoundTripsPerCheck(), c.Strict.ServiceCPUPerCheck(), r.Load.Checks)
		})
	}
}
