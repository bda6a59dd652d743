package algodiff

import (
	"context"
	"fmt"
	"math/big"
	"math/rand"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
)

// boundsHarness returns the Lua copies of shared/algo's bounds, and what the fragment's
// algo__norm makes of parameters far beyond every bound (limit, window, capacity).
const boundsHarness = `
local l, w, c = algo__norm({limit = 2^50, window_us = 2^60, burst = 2^50})
return {algo__MAX_LIMIT, algo__MAX_LOG_LIMIT, algo__MAX_BURST, algo__MIN_WINDOW, algo__MAX_WINDOW,
  algo__MAX_REFILL, algo__MAX_AHEAD, algo__MAX_COUNT, algo__SLACK, algo__EXACT, l, w, c or l}
`

// TestLuaBoundsMatchGo: the bounds the Lua fragments clamp to are shared/algo's
// constants, asked of Redis for every fragment as the service builds it, so the two
// cannot drift apart.
func TestLuaBoundsMatchGo(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	for k := range algo.Kind(algo.NumKinds) {
		t.Run(k.String(), func(t *testing.T) {
			frag, err := store.Fragment(k)
			if err != nil {
				t.Fatalf("fragment: %v", err)
			}
			got, err := redis.NewScript(frag+boundsHarness).Run(ctx, rdb, nil).Int64Slice()
			if err != nil {
				t.Fatalf("script: %v", err)
			}
			huge := algo.Params{Kind: k, Limit: 1 << 50, WindowUs: 1 << 60, Burst: 1 << 50}
			want := []struct {
				name string
				v    int64
			}{
				{"MaxLimit", algo.MaxLimit}, {"MaxLogLimit", algo.MaxLogLimit}, {"MaxBurst", algo.MaxBurst},
				{"MinWindowUs", algo.MinWindowUs}, {"MaxWindowUs", algo.MaxWindowUs},
				{"MaxRefillUs", algo.MaxRefillUs}, {"MaxAheadUs", algo.MaxAheadUs},
				{"MaxCount", algo.MaxCount}, {"LogSlack", algo.LogSlack}, {"2^53", 1 << 53},
				{"clamped limit", k.MaxLimit()}, {"clamped window", algo.MaxWindowUs},
				{"clamped capacity", huge.Capacity()},
			}
			if len(got) != len(want) {
				t.Fatalf("%d values from Lua, want %d: %v", len(got), len(want), got)
			}
			for i, w := range want {
				if got[i] != w.v {
					t.Errorf("%s: %d in Lua, %d in Go", w.name, got[i], w.v)
				}
			}
		})
	}
}

// mulDivHarness runs algo__muldivrem on (a, b, c) triples and returns q, r pairs.
const mulDivHarness = `
local out = {}
for i = 1, #ARGV, 3 do
  local q, r = algo__muldivrem(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  if q ~= math.floor(q) or q >= 2^53 or r ~= math.floor(r) or r >= 2^53 then
    error('not an exact integer: ' .. tostring(q) .. ' ' .. tostring(r))
  end
  out[#out + 1] = q
  out[#out + 1] = r
end
return out
`

// logUniform draws from [lo, hi] with every bit length equally likely, so small and
// huge values are both common.
func logUniform(rng *rand.Rand, lo, hi int64) int64 {
	bitsHi := 64 - countLeadingZeros(uint64(hi))
	for {
		v := rng.Int63n(int64(1)<<rng.Intn(bitsHi) + 1)
		v += rng.Int63n(int64(1)<<rng.Intn(bitsHi) + 1)
		if v >= lo && v <= hi {
			return v
		}
	}
}

func countLeadingZeros(x uint64) int {
	n := 0
	for x&(1<<63) == 0 && n < 64 {
		x <<= 1
		n++
	}
	return n
}

// TestLuaMulDivRemExact checks the Lua long division against math/big over random
// triples at the sizes the algorithms use: divisors up to 2^42 (MaxWindowUs is below
// it), factors up to 2^53 and every quotient below 2^53, plus the corners.
func TestLuaMulDivRemExact(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	frag, err := store.Fragment(algo.TokenBucket)
	if err != nil {
		t.Fatalf("fragment: %v", err)
	}
	script := redis.NewScript(frag + mulDivHarness)
	const exact = int64(1) << 53
	maxC := int64(1)<<42 - 1
	rng := rand.New(rand.NewSource(42))
	corners := [][3]int64{
		{algo.MaxAheadUs, algo.MaxLimit, algo.MaxWindowUs},
		{algo.MaxRefillUs, algo.MaxLimit, algo.MaxWindowUs},
		{algo.MaxAheadUs, algo.MaxWindowUs, algo.MaxWindowUs},
		{algo.MaxAheadUs - 1, maxC, maxC},
		{exact - 1, 1, 1},
		{exact - 1, maxC - 1, maxC},
		{maxC - 1, exact - 1, maxC},
		{algo.MaxCount, algo.MaxWindowUs - 1, algo.MaxWindowUs},
		{algo.MaxBurst, algo.MaxWindowUs, algo.MaxLimit},
		{0, 5, 7}, {5, 0, 7}, {1, 1, maxC},
		// around 2^52, where the script leaves the one-division path for the digit loop
		{1 << 26, 1 << 26, 3}, {1 << 26, 1<<26 - 1, 3}, {1<<52 - 1, 1, 1<<41 + 7},
		{1<<51 + 1, 1, 3}, {94906265, 47453132, 999999937}, {1<<52 - 1, 1, 1},
		{67108863, 67108865, maxC}, {4503599627370495, 1, 4503599},
	}
	cases := 0
	for batch := range 40 {
		var triples [][3]int64
		if batch == 0 {
			triples = corners
		}
		for len(triples) < 2500 {
			c := logUniform(rng, 1, maxC)
			if rng.Intn(4) == 0 {
				c = algo.MaxWindowUs - rng.Int63n(1000) // one-month windows
			}
			b := logUniform(rng, 1, exact-1)
			// a·b/c < 2^53: a ≤ (2^53 − 1)·c / b.
			hi := new(big.Int).Mul(big.NewInt(exact-1), big.NewInt(c))
			hi.Quo(hi, big.NewInt(b))
			aMax := exact - 1
			if hi.IsInt64() && hi.Int64() < aMax {
				aMax = hi.Int64()
			}
			if aMax < 1 {
				continue
			}
			a := logUniform(rng, 1, aMax)
			if rng.Intn(8) == 0 {
				a = aMax // quotients right at the 2^53 edge
			}
			triples = append(triples, [3]int64{a, b, c})
		}
		args := make([]any, 0, 3*len(triples))
		for _, tr := range triples {
			args = append(args, tr[0], tr[1], tr[2])
		}
		got, err := script.Run(ctx, rdb, nil, args...).Int64Slice()
		if err != nil {
			t.Fatalf("batch %d: script: %v", batch, err)
		}
		for i, tr := range triples {
			q, r := new(big.Int), new(big.Int)
			q.QuoRem(new(big.Int).Mul(big.NewInt(tr[0]), big.NewInt(tr[1])), big.NewInt(tr[2]), r)
			if tr[0] <= 0 || tr[1] <= 0 {
				q.SetInt64(0)
				r.SetInt64(0)
			}
			if got[2*i] != q.Int64() || got[2*i+1] != r.Int64() {
				t.Fatalf("muldivrem(%d, %d, %d) = %d, %d in Lua; exact %v, %v", tr[0], tr[1], tr[2], got[2*i], got[2*i+1], q, r)
			}
			cases++
		}
	}
	t.Logf("%d cases", cases)
	if cases < 100_000 {
		t.Fatalf("only %d cases", cases)
	}
}

// extremeParams is every valid combination of the bounds for kind k (limit 1 and the
// maximum, the shortest and the longest window, no burst and the largest burst that
// refills within MaxRefillUs), plus the same just beyond them (clamped identically).
func extremeParams(k algo.Kind) []algo.Params {
	var out []algo.Params
	if k.CalendarPeriods() {
		for _, l := range []int64{1, algo.MaxLimit} {
			for per := algo.Day; per <= algo.Month; per++ {
				for _, off := range []int64{-algo.MaxOffsetMinutes, 0, algo.MaxOffsetMinutes} {
					p := algo.CalendarParams(l, per, off)
					out = append(out, p, algo.Params{Kind: k, Limit: l + 1, WindowUs: p.WindowUs + 1, Burst: p.Burst + 1})
				}
			}
		}
		return out
	}
	for _, l := range []int64{1, k.MaxLimit()} {
		for _, w := range []int64{max(algo.MinWindowUs, l), algo.MaxWindowUs} {
			for _, b := range []int64{0, algo.MaxBurst} {
				p := algo.Params{Kind: k, Limit: l, WindowUs: w, Burst: b}
				if p.Validate() != nil {
					p.Burst = p.Capacity() // the largest burst that refills in time
				}
				out = append(out, p, algo.Params{Kind: k, Limit: l + 1, WindowUs: w + 1, Burst: b + 1})
			}
		}
	}
	return out
}

// TestLuaMatchesGoAtTheBounds runs random sequences at every combination of the bounds
// through Go and the Lua fragment in Redis: costs up to MaxCost and the capacity,
// clients coming back at Retry-After, times near ±MaxTimeUs. Every number and every
// state byte must agree.
func TestLuaMatchesGoAtTheBounds(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	for k := range algo.Kind(algo.NumKinds) {
		t.Run(k.String(), func(t *testing.T) {
			frag, err := store.Fragment(k)
			if err != nil {
				t.Fatalf("fragment: %v", err)
			}
			script := redis.NewScript(frag + harness)
			rng := rand.New(rand.NewSource(int64(k) + 100))
			seqs := 0
			for pi, p := range extremeParams(k) {
				for si := range 3 {
					w := min(max(p.WindowUs, algo.MinWindowUs), algo.MaxWindowUs)
					starts := []int64{-algo.MaxTimeUs + 1, algo.MaxTimeUs - 400*w - algo.MaxRefillUs, rng.Int63n(algo.MaxTimeUs)}
					now := starts[si]
					capa := p.Capacity()
					var st algo.State
					init := st
					if rng.Intn(3) == 0 {
						init = algo.Take(p, nil, now, capa+rng.Int63n(capa+1)) // starts in debt
						st = init
					}
					var steps []step
					for range 200 {
						op := []byte{'d', 'd', 'd', 'd', 't', 'r'}[rng.Intn(6)]
						n := []int64{1, algo.MaxCost, capa, capa + 1, 1 + rng.Int63n(min(capa, algo.MaxCost)), 1 << 40}[rng.Intn(6)]
						switch rng.Intn(4) {
						case 0:
							now += algo.RetryAfter(p, st, now, n) // back exactly at Retry-After
						case 1:
							now = boundary(rng, p, st, now, n)
						default:
							now += []int64{0, 1, w / min(p.Limit, w) * 2, w / 3, 2 * w}[rng.Intn(5)]
						}
						now = min(max(now, -algo.MaxTimeUs+1), algo.MaxTimeUs-1)
						s := step{op: op, now: now, n: n}
						steps = append(steps, s)
						st = s.apply(p, st)
					}
					args := []any{p.Limit, p.WindowUs, p.Burst, string(init)}
					for _, s := range steps {
						args = append(args, string(s.op), s.now, s.n)
					}
					res, err := script.Run(ctx, rdb, nil, args...).Slice()
					if err != nil {
						t.Fatalf("params %d %+v: script: %v", pi, p, err)
					}
					if len(res) != len(steps) {
						t.Fatalf("params %d: %d rows for %d steps", pi, len(res), len(steps))
					}
					compare(t, fmt.Sprintf("params %d %+v start %d", pi, p, starts[si]), p, init, steps, res)
					seqs++
				}
			}
			t.Logf("%d sequences of 200 steps", seqs)
		})
	}
}
