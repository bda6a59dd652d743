package algo

import (
	"math"
	"math/big"
	"math/rand"
	"testing"
)

// refGCRA is the virtual-scheduling GCRA written the obvious way, in exact rationals:
// emission interval T = W/L, tolerance τ = C·T, admit cost iff tat' + cost·T - τ ≤ now
// where tat' = max(tat, now). It is the algorithm go-redis/redis_rate implements.
type refGCRA struct {
	t, tau *big.Rat
	tat    *big.Rat // nil: never used
}

func newRefGCRA(p Params) *refGCRA {
	t := big.NewRat(p.WindowUs, p.Limit)
	return &refGCRA{t: t, tau: new(big.Rat).Mul(t, big.NewRat(p.Capacity(), 1))}
}

func ratCeil(x *big.Rat) int64 {
	q, m := new(big.Int).DivMod(x.Num(), x.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func ratFloor(x *big.Rat) int64 {
	q, _ := new(big.Int).DivMod(x.Num(), x.Denom(), new(big.Int))
	return q.Int64()
}

// margin is allowAt - now for cost: how far now is from the decision's boundary
// (positive: rejected by that many µs).
func (g *refGCRA) margin(now, cost int64) *big.Rat {
	n := big.NewRat(now, 1)
	tat := n
	if g.tat != nil && g.tat.Cmp(n) > 0 {
		tat = g.tat
	}
	at := new(big.Rat).Add(tat, new(big.Rat).Mul(g.t, big.NewRat(cost, 1)))
	return at.Sub(at, g.tau).Sub(at, n)
}

// allow returns the decision, remaining (when allowed), retry-after (when rejected) and
// reset-after, the last two as exact rationals in µs.
func (g *refGCRA) allow(now, cost int64) (ok bool, remaining int64, retry, reset *big.Rat) {
	n := big.NewRat(now, 1)
	tat := n
	if g.tat != nil && g.tat.Cmp(n) > 0 {
		tat = g.tat
	}
	newTat := new(big.Rat).Add(tat, new(big.Rat).Mul(g.t, big.NewRat(cost, 1)))
	allowAt := new(big.Rat).Sub(newTat, g.tau)
	if allowAt.Cmp(n) > 0 {
		return false, 0, new(big.Rat).Sub(allowAt, n), new(big.Rat).Sub(tat, n)
	}
	g.tat = newTat
	rem := new(big.Rat).Quo(new(big.Rat).Sub(n, allowAt), g.t)
	return true, ratFloor(rem), new(big.Rat), new(big.Rat).Sub(newTat, n)
}

// TestGCRAMatchesReference: GCRA admits exactly what the reference admits, with the same
// remaining, and its retry-after and reset are the reference's rounded up to the µs.
func TestGCRAMatchesReference(t *testing.T) {
	for seed := range int64(100) {
		rng := rand.New(rand.NewSource(seed))
		p := randParams(rng, GCRA)
		ref := newRefGCRA(p)
		var s State
		now := rng.Int63n(1 << 50)
		for i := range 300 {
			now += randStep(rng, p)
			cost := randCost(rng, p)
			r := Decide(p, s, now, cost)
			ok, rem, retry, reset := ref.allow(now, cost)
			if r.Allowed != ok {
				t.Fatalf("seed %d step %d %+v: cost %d at %d allowed=%v, reference %v", seed, i, p, cost, now, r.Allowed, ok)
			}
			if ok && r.Remaining != rem {
				t.Fatalf("seed %d step %d %+v: remaining %d, reference %d", seed, i, p, r.Remaining, rem)
			}
			if r.RetryAfterUs != ratCeil(retry) {
				t.Fatalf("seed %d step %d %+v: retry %d, reference %s", seed, i, p, r.RetryAfterUs, retry.FloatString(3))
			}
			if r.ResetUs-now != ratCeil(reset) {
				t.Fatalf("seed %d step %d %+v: reset in %d, reference %s", seed, i, p, r.ResetUs-now, reset.FloatString(3))
			}
			s = r.State
		}
	}
}

// redisRate is a transcription of go-redis/redis_rate v10's allowN script (float
// seconds, times relative to an epoch as the script's jan_1_2017), kept to show that
// GCRA decides as redis_rate does. The float arithmetic can only disagree at a boundary,
// so a disagreement is accepted only when the exact reference puts now within 1 µs of it.
type redisRate struct {
	burst, rate, period float64
	tat                 float64
	set                 bool
}

func (l *redisRate) allowN(nowUs, cost int64) (allowed bool, remaining int64, retryAfter, resetAfter float64) {
	now := float64(nowUs) / 1e6
	emission := l.period / l.rate
	increment := emission * float64(cost)
	burstOffset := emission * l.burst
	tat := now
	if l.set {
		tat = math.Max(l.tat, now)
	}
	newTat := tat + increment
	allowAt := newTat - burstOffset
	diff := now - allowAt
	rem := diff / emission
	if rem < 0 {
		return false, 0, -diff, tat - now
	}
	if newTat-now > 0 {
		l.tat, l.set = newTat, true
	}
	return true, int64(rem), -1, newTat - now
}

func TestGCRAMatchesRedisRate(t *testing.T) {
	for seed := range int64(100) {
		rng := rand.New(rand.NewSource(seed))
		p := randParams(rng, GCRA)
		if p.WindowUs > hour {
			p.WindowUs = hour // keep the floats' relative error far below 1 µs
		}
		rr := &redisRate{burst: float64(p.Capacity()), rate: float64(p.Limit), period: float64(p.WindowUs) / 1e6}
		ref := newRefGCRA(p)
		var s State
		var now int64
		for i := range 300 {
			now += randStep(rng, p)
			cost := randCost(rng, p)
			r := Decide(p, s, now, cost)
			margin := ref.margin(now, cost)
			ref.allow(now, cost)
			ok, rem, retry, reset := rr.allowN(now, cost)
			if r.Allowed != ok {
				// Only a float rounding at the boundary may flip a decision.
				if margin.Abs(margin).Cmp(big.NewRat(1, 1)) > 0 {
					t.Fatalf("seed %d step %d %+v: cost %d allowed=%v, redis_rate %v", seed, i, p, cost, r.Allowed, ok)
				}
				rr = &redisRate{burst: rr.burst, rate: rr.rate, period: rr.period}
				ref, s = newRefGCRA(p), nil // resynchronise after the accepted flip
				continue
			}
			if ok && r.Remaining != rem && r.Remaining != rem+1 { // rem is truncated from a float
				t.Fatalf("seed %d step %d %+v: remaining %d, redis_rate %d", seed, i, p, r.Remaining, rem)
			}
			if !ok && math.Abs(float64(r.RetryAfterUs)/1e6-retry) > 1e-3 {
				t.Fatalf("seed %d step %d %+v: retry %d µs, redis_rate %f s", seed, i, p, r.RetryAfterUs, retry)
			}
			if math.Abs(float64(r.ResetUs-now)/1e6-reset) > 1e-3 {
				t.Fatalf("seed %d step %d %+v: reset in %d µs, redis_rate %f s", seed, i, p, r.ResetUs-now, reset)
			}
			s = r.State
		}
	}
}
