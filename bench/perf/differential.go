package perf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// DiffParams are the GCRA rules the differential replays: integer and fractional
// emission intervals, burst below, at and above the rate.
var DiffParams = []algo.Params{
	{Kind: algo.GCRA, Limit: 10, WindowUs: 1_000_000, Burst: 10},
	{Kind: algo.GCRA, Limit: 100, WindowUs: 60_000_000, Burst: 20},
	{Kind: algo.GCRA, Limit: 5, WindowUs: 1_000_000, Burst: 1},
	{Kind: algo.GCRA, Limit: 7, WindowUs: 3_000_000, Burst: 3},
	{Kind: algo.GCRA, Limit: 1000, WindowUs: 1_000_000, Burst: 50},
	{Kind: algo.GCRA, Limit: 3, WindowUs: 1_000_000},
}

// DiffEpochUs is the virtual clock's origin: 2027-01-15, µs since the Unix epoch.
const DiffEpochUs = 1_800_000_000_000_000

// DiffReport summarizes a differential run of Tollgate's GCRA (Go and Lua) against
// go-redis/redis_rate on the same requests.
type DiffReport struct {
	Sequences, Steps  int
	Allowed, Rejected int
	// GoLuaMismatches counts steps where shared/algo and the service's Lua differ in
	// any output (decision, state bytes, remaining, reset, retry-after): must be 0.
	GoLuaMismatches int
	// Flips counts steps where redis_rate decided otherwise; BoundaryFlips those of
	// them within 1 µs of the exact decision boundary (float rounding in redis_rate,
	// accepted), after which the sequence restarts from fresh buckets.
	Flips, BoundaryFlips int
	// MaxRetryDiffUs and MaxResetDiffUs are the largest differences of retry-after (on
	// rejections) and reset-after between Tollgate and redis_rate, in µs.
	MaxRetryDiffUs, MaxResetDiffUs float64
	// RemainingPlusOne counts admitted steps where Tollgate's remaining is one more
	// than redis_rate's (redis_rate truncates a float that rounding left just below an
	// integer); RemainingOtherwise must be 0.
	RemainingPlusOne, RemainingOtherwise int
	// RejectedWithRemaining counts rejections where Tollgate reports permits left (a
	// request costing more than what is left) and redis_rate reports 0: intended.
	RejectedWithRemaining int
	// Failures describes each step outside the tolerances (at most 10).
	Failures []string
}

func (r *DiffReport) fail(format string, a ...any) {
	if len(r.Failures) < 10 {
		r.Failures = append(r.Failures, fmt.Sprintf(format, a...))
	}
}

// Differential replays seqs random request sequences of steps requests for each of
// DiffParams through algo.Decide, the Lua fragment in Redis and redis_rate's script on
// a pinned clock, all on rdb.
func Differential(ctx context.Context, rdb *redis.Client, seqs, steps int) (*DiffReport, error) {
	lua, err := LoadLuaGCRA(rdb)
	if err != nil {
		return nil, err
	}
	pc := &PinnedClock{Client: rdb}
	rr := LimiterOnClock(pc)
	rep := &DiffReport{}
	run := time.Now().UnixNano()
	for pi, p := range DiffParams {
		capa := p.Capacity()
		t := float64(p.WindowUs) / float64(p.Limit) // emission interval, µs
		limit := redis_rate.Limit{Rate: int(p.Limit), Period: time.Duration(p.WindowUs) * time.Microsecond, Burst: int(capa)}
		for seq := 0; seq < seqs; seq++ {
			rep.Sequences++
			rng := rand.New(rand.NewPCG(uint64(pi), uint64(seq)))
			gen := 0
			key := func() string { return fmt.Sprintf("diff-%d-%d-%d-%d", run, pi, seq, gen) }
			var goSt, luaSt algo.State
			now := int64(0)
			for i := 0; i < steps; i++ {
				now += diffGap(rng, t, p.WindowUs)
				cost := int64(1)
				switch x := rng.IntN(100); {
				case x < 15:
					cost = 2 + rng.Int64N(2)
				case x < 18:
					cost = capa + 1 // never fits: both must say when it would have
				}
				rep.Steps++
				prev := goSt
				g := algo.Decide(p, prev, now, cost)
				l, err := lua.Decide(ctx, p, luaSt, now, cost)
				if err != nil {
					return rep, err
				}
				if g.Allowed != l.Allowed || string(g.State) != string(l.State) || g.Remaining != l.Remaining ||
					g.ResetUs != l.ResetUs || g.RetryAfterUs != l.RetryAfterUs {
					rep.GoLuaMismatches++
					rep.fail("%+v step %d (t=%d µs, cost %d): Go %+v, Lua %+v", p, i, now, cost, g, l)
				}
				goSt, luaSt = g.State, l.State
				pc.NowUs = DiffEpochUs + now
				r, err := rr.AllowN(ctx, key(), limit, int(cost))
				if err != nil {
					return rep, fmt.Errorf("redis_rate: %w", err)
				}
				// Virtual time runs far ahead of real time: keep redis_rate's key from
				// expiring on the real clock in the middle of a sequence.
				if err := rdb.Persist(ctx, "rate:"+key()).Err(); err != nil {
					return rep, fmt.Errorf("PERSIST: %w", err)
				}
				rrAllowed := r.Allowed > 0
				if g.Allowed != rrAllowed {
					rep.Flips++
					// Within 1 µs of the boundary: redis_rate's float seconds may round either way.
					boundary := (!g.Allowed && g.RetryAfterUs <= 1) ||
						(g.Allowed && !algo.Decide(p, prev, now-1, cost).Allowed)
					if !boundary {
						rep.fail("%+v step %d (t=%d µs, cost %d): Tollgate allowed=%v, redis_rate allowed=%v", p, i, now, cost, g.Allowed, rrAllowed)
					} else {
						rep.BoundaryFlips++
					}
					gen++ // start both over from fresh buckets
					goSt, luaSt = nil, nil
					continue
				}
				resetDiff := absF(float64(g.ResetUs-now) - float64(r.ResetAfter)/1e3)
				rep.MaxResetDiffUs = max(rep.MaxResetDiffUs, resetDiff)
				if resetDiff > 1000 {
					rep.fail("%+v step %d: reset in %d µs, redis_rate %v", p, i, g.ResetUs-now, r.ResetAfter)
				}
				if g.Allowed {
					rep.Allowed++
					switch g.Remaining {
					case int64(r.Remaining):
					case int64(r.Remaining) + 1:
						rep.RemainingPlusOne++
					default:
						rep.RemainingOtherwise++
						rep.fail("%+v step %d: remaining %d, redis_rate %d", p, i, g.Remaining, r.Remaining)
					}
					continue
				}
				rep.Rejected++
				if g.Remaining > 0 {
					rep.RejectedWithRemaining++
				}
				retryDiff := absF(float64(g.RetryAfterUs) - float64(r.RetryAfter)/1e3)
				rep.MaxRetryDiffUs = max(rep.MaxRetryDiffUs, retryDiff)
				if retryDiff > 1000 {
					rep.fail("%+v step %d: retry after %d µs, redis_rate %v", p, i, g.RetryAfterUs, r.RetryAfter)
				}
			}
		}
	}
	return rep, nil
}

// diffGap draws the time to the next request: often simultaneous, often a fraction of
// the emission interval t, sometimes exact multiples of t (to land on boundaries), now
// and then several windows (the bucket refills completely).
func diffGap(rng *rand.Rand, t float64, windowUs int64) int64 {
	switch x := rng.IntN(100); {
	case x < 25:
		return 0
	case x < 55:
		return rng.Int64N(int64(t/4) + 1)
	case x < 80:
		return rng.Int64N(int64(2*t) + 1)
	case x < 95:
		return int64(t) * (1 + rng.Int64N(3))
	default:
		return rng.Int64N(3*windowUs + 1)
	}
}

func absF(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// redisRateLimit is rate per second with burst.
func redisRateLimit(rate, burst int) redis_rate.Limit {
	return redis_rate.Limit{Rate: rate, Period: time.Second, Burst: burst}
}
