package perf

import (
	"context"
	"math"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// TestOpenLoop checks the paced harness on a stand-in request: it sends the schedule's
// number of requests, counts only the measured ones, takes its snapshots around the
// measured time, does not let a held request hold up the next ones (open loop) and
// counts a held request's wait from its scheduled time, and drops what exceeds
// MaxInFlight instead of queueing it. Nothing here depends on how fast the machine is:
// a held request is held until the measured time ends.
func TestOpenLoop(t *testing.T) {
	const rate = 2000.0
	cases := []struct {
		name     string
		hold     bool // requests of key 0 are held until the measured time ends
		inFlight int
	}{
		{"counts and snapshots", false, 0},
		{"a held key does not hold the others", true, 0},
		{"in-flight bound drops", true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := PacedOptions{Keys: 20, PerKey: rate / 20, Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond,
				MaxInFlight: c.inFlight, Seed: 1}.withDefaults()
			release := make(chan struct{})
			var calls, othersDone atomic.Int64
			fn := func(ctx context.Context, k int) (bool, error) {
				calls.Add(1)
				if k == 0 && c.hold {
					select {
					case <-release:
					case <-ctx.Done():
						return false, ctx.Err()
					}
					return true, nil
				}
				othersDone.Add(1)
				return k%2 == 0, nil
			}
			var beforeAt, afterAt time.Time
			var doneAtEnd int64
			start := time.Now()
			res := runOpenLoop(o, fn, func() { beforeAt = time.Now() }, func() {
				afterAt = time.Now()
				doneAtEnd = othersDone.Load()
				close(release)
			})
			// A busy machine makes the snapshots late, never early.
			if beforeAt.IsZero() || afterAt.Sub(start) < o.Warmup+o.Duration || beforeAt.Sub(start) < o.Warmup-time.Millisecond {
				t.Fatalf("snapshots %v and %v after the start", beforeAt.Sub(start), afterAt.Sub(start))
			}
			if res.Elapsed <= 0 || res.Elapsed > afterAt.Sub(beforeAt) {
				t.Errorf("elapsed %v between snapshots %v apart", res.Elapsed, afterAt.Sub(beforeAt))
			}
			want := rate * o.Duration.Seconds() // Poisson: ± 3σ is ± 95 of 1,000
			if c.inFlight > 0 {
				if res.Dropped < int64(want*0.8) || res.Checks+res.Dropped < int64(want*0.85) {
					t.Fatalf("%d checks, %d dropped: want nearly all dropped behind the held request", res.Checks, res.Dropped)
				}
				return
			}
			if math.Abs(float64(res.Checks)-want) > 0.15*want || res.Dropped != 0 || res.Errors != 0 || res.Sent != res.Checks {
				t.Fatalf("%d checks (%d sent, %d dropped, %d errors), want about %.0f, all sent", res.Checks, res.Sent, res.Dropped, res.Errors, want)
			}
			if n := calls.Load(); n <= res.Checks {
				t.Errorf("%d calls for %d measured checks: the warm-up sent nothing", n, res.Checks)
			}
			if share := float64(res.Admitted) / float64(res.Checks); share < 0.35 || share > 0.65 {
				t.Errorf("admitted share %.2f, want about half (even keys, and key 0)", share)
			}
			if res.P50 > res.P99 || res.P99 > res.PMax || res.ChecksPerSec != float64(res.Checks)/o.Duration.Seconds() {
				t.Errorf("p50 %v, p99 %v, max %v, %v checks/s", res.P50, res.P99, res.PMax, res.ChecksPerSec)
			}
			if c.hold {
				// The other keys' requests were answered while key 0's were held.
				if all := othersDone.Load(); doneAtEnd < all*9/10 {
					t.Errorf("%d of %d other requests answered while key 0 was held", doneAtEnd, all)
				}
				// Key 0's first measured request waited until the end: counted from its schedule.
				if res.PMax < o.Duration/2 {
					t.Errorf("longest latency %v: the held requests' wait is not in it", res.PMax)
				}
			}
		})
	}
}

// TestSumExecRuntime reads the CPU line of a /proc/<pid>/task/<tid>/sched file.
func TestSumExecRuntime(t *testing.T) {
	cases := []struct {
		name, in string
		want     time.Duration
		err      bool
	}{
		{"sched file", "redis-server (42, #threads: 5)\n---\nse.exec_start : 287493.326638\nse.sum_exec_runtime                          :           990.202084\nnr_switches : 3\n",
			990202084 * time.Nanosecond, false},
		{"no line", "se.vruntime : 1.0\n", 0, true},
		{"not a number", "se.sum_exec_runtime : x\n", 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := sumExecRuntime([]byte(c.in))
			if (err != nil) != c.err {
				t.Fatalf("err %v, want error %v", err, c.err)
			}
			if d := got - c.want; d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

// TestProcessCPUFollowsGetrusage: the CPU read from /proc for this process grows as
// getrusage's does while it burns CPU.
func TestProcessCPUFollowsGetrusage(t *testing.T) {
	p0, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r0 := selfCPU()
	// Burn 100 ms of CPU (by getrusage's count: the machine may be busy), 10 s at most.
	x := 1.0
	for end := time.Now().Add(10 * time.Second); selfCPU()-r0 < 100*time.Millisecond && time.Now().Before(end); {
		for range 10_000 {
			x = math.Sqrt(x + 1)
		}
	}
	p1, _ := ProcessCPU(os.Getpid())
	r1 := selfCPU()
	dp, dr := p1-p0, r1-r0
	if dr < 100*time.Millisecond || dp < dr*3/4 || dp > dr*5/4+20*time.Millisecond {
		t.Fatalf("/proc says %v, getrusage %v (x %v)", dp, dr, x)
	}
}

// TestPacedRunsOnRealStack runs a tiny paced comparison on the real parts: the three
// limiters carry the schedule with no error; nothing is refused (the limit is never
// reached); redis_rate makes one script call per check; the Redis CPU comes from
// /proc and agrees with INFO's; the held count is the host's.
func TestPacedRunsOnRealStack(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	svc, err := StartService(store.Standalone, srv.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	st := &Stack{Filter: wasmtest.FilterWasm(t), Empty: wasmtest.BuildWasm(t, EmptyPkg), Redis: rdb, Service: svc}
	for _, k := range []struct {
		name string
		kind HTTPKind
		http bool
	}{{"pass-through", HTTPPassThrough, false}, {"redis_rate", HTTPRedisRate, false}, {"tollgate", HTTPTollgate, false},
		{"redis_rate over HTTP", HTTPRedisRate, true}, {"tollgate over HTTP", HTTPTollgate, true}} {
		t.Run(k.name, func(t *testing.T) {
			o := PacedOptions{Keys: 50, PerKey: 8, Warmup: 300 * time.Millisecond, Duration: time.Second, Seed: 3, HTTP: k.http}
			res, err := st.RunPaced(o, k.kind, 1000)
			if err != nil {
				t.Fatal(err)
			}
			want := o.Rate() * o.Duration.Seconds()
			if math.Abs(float64(res.Checks)-want) > 0.3*want || res.Errors != 0 || res.Dropped != 0 || res.Admitted != res.Checks {
				t.Fatalf("%d checks (%d admitted, %d errors, %d dropped), want about %.0f, all admitted", res.Checks, res.Admitted, res.Errors, res.Dropped, want)
			}
			if !res.Redis.ProcOK || res.Redis.WholeCPU() <= 0 {
				t.Fatalf("no Redis CPU from /proc: %+v", res.Redis)
			}
			if res.Held < 0 || res.Held > res.Checks+int64(o.Keys) {
				t.Errorf("held %d of %d checks", res.Held, res.Checks)
			}
			switch k.kind {
			case HTTPRedisRate:
				// One script call per check: those of requests in flight at either
				// snapshot may fall on its other side.
				if res.RoundTrips < res.Checks-res.InFlightEnd || res.RoundTrips > res.Checks+res.InFlightStart {
					t.Errorf("%d script calls for %d checks (%d in flight at the start, %d at the end)", res.RoundTrips, res.Checks, res.InFlightStart, res.InFlightEnd)
				}
				if res.Held != 0 {
					t.Errorf("the pass-through module held %d requests", res.Held)
				}
			case HTTPTollgate:
				if res.Metrics == nil {
					t.Errorf("no filter metrics")
				}
			}
		})
	}
}

// TestRedisProcCPUMatchesInfo: the redis-server CPU read from /proc and Redis's own
// used_cpu_sys + used_cpu_user grow alike under script calls.
func TestRedisProcCPUMatchesInfo(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	in0, err := ReadInfo(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if in0.PID <= 0 || !in0.ProcOK {
		t.Fatalf("pid %d, /proc read %v", in0.PID, in0.ProcOK)
	}
	script := redis.NewScript(`local n = 0 for i = 1, 2000 do n = n + i end redis.call('SET', KEYS[1], n) return n`)
	for i := range 3000 {
		if err := script.Run(ctx, rdb, []string{"k" + string(rune('a'+i%26))}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	in1, err := ReadInfo(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	w := in1.Since(in0)
	if !w.ProcOK || w.CPU < 0.02 || w.ProcCPU < 0.75*w.CPU || w.ProcCPU > 1.25*w.CPU+0.01 {
		t.Fatalf("/proc %.4f s, INFO %.4f s", w.ProcCPU, w.CPU)
	}
	if w.WholeCPU() != w.ProcCPU {
		t.Errorf("WholeCPU %.4f, want /proc's %.4f", w.WholeCPU(), w.ProcCPU)
	}
}

// TestScheduleSameWhateverTheWarmup: two runs with one seed offer the same measured
// requests (times from the start of the measured time, keys) whatever their warm-ups,
// at the rate asked.
func TestScheduleSameWhateverTheWarmup(t *testing.T) {
	type req struct {
		at time.Duration
		k  int
	}
	measured := func(warmup time.Duration) []req {
		o := PacedOptions{Keys: 100, PerKey: 10, Warmup: warmup, Duration: 2 * time.Second, Seed: 5}.withDefaults()
		next := newSchedule(o)
		var out []req
		var last time.Duration
		for {
			at, k, m, ok := next()
			if !ok {
				break
			}
			if at < last || k < 0 || k >= o.Keys || m != (at >= warmup) {
				t.Fatalf("request at %v (after %v), key %d, measured %v", at, last, k, m)
			}
			last = at
			if m {
				out = append(out, req{at - warmup, k})
			}
		}
		return out
	}
	a, b := measured(0), measured(3*time.Second)
	if len(a) < 1800 || len(a) > 2200 {
		t.Fatalf("%d requests in 2 s at 1,000/s", len(a))
	}
	if len(a) != len(b) {
		t.Fatalf("%d and %d measured requests", len(a), len(b))
	}
	for i := range a {
		if d := a[i].at - b[i].at; a[i].k != b[i].k || d < -time.Microsecond || d > time.Microsecond {
			t.Fatalf("request %d: %+v and %+v", i, a[i], b[i])
		}
	}
}
