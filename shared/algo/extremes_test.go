package algo

import (
	"fmt"
	"math/big"
	"math/rand"
	"sort"
	"testing"
)

// extremeParams is every valid combination of the bounds: limit 1 and the algorithm's
// maximum, the shortest window that limit allows (1 ms, or Limit µs at one permit per
// µs) and the longest (31 days), and for the buckets no burst and the largest burst
// that still refills within MaxRefillUs.
func extremeParams(k Kind) []Params {
	var out []Params
	if k == Calendar {
		for _, l := range []int64{1, MaxLimit} {
			for _, per := range []Period{Day, Month} {
				for _, off := range []int64{-MaxOffsetMinutes, MaxOffsetMinutes} {
					out = append(out, CalendarParams(l, per, off))
				}
			}
		}
		return out
	}
	for _, l := range []int64{1, k.MaxLimit()} {
		for _, w := range []int64{max(MinWindowUs, l), MaxWindowUs} {
			bursts := []int64{0}
			if k.HasBurst() {
				bursts = append(bursts, min(MaxBurst, mulDiv(MaxRefillUs, l, w)))
			}
			for _, b := range bursts {
				p := Params{Kind: k, Limit: l, WindowUs: w, Burst: b}
				if p.Validate() == nil {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// client is a caller that asks for cost permits whenever it is its turn and, when
// refused, comes back exactly at the announced Retry-After.
type client struct {
	next, cost int64
}

// extremeCost draws a request size: one permit, the largest request (MaxCost), the
// whole capacity, one more than the capacity (never fits), or anything in between.
func extremeCost(rng *rand.Rand, capa int64) int64 {
	switch rng.Intn(6) {
	case 0:
		return 1
	case 1:
		return MaxCost
	case 2:
		return min(capa, MaxCost)
	case 3:
		return capa + 1
	default:
		return 1 + rng.Int63n(min(capa, MaxCost))
	}
}

// extremeThink is how long an admitted client waits before asking again: nothing, one
// µs, about one permit's worth of refill, a fraction of the window, or several windows.
func extremeThink(rng *rand.Rand, p Params) int64 {
	switch rng.Intn(6) {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return rng.Int63n(2*p.WindowUs/p.Limit + 1)
	case 3:
		return rng.Int63n(p.WindowUs/8 + 1)
	default:
		return rng.Int63n(3 * p.WindowUs)
	}
}

// runClients drives a few clients against one bucket from start until end (or for
// decisions decisions) and returns what was admitted. It checks on the way that every
// refusal's RetryAfter is exact for the state it was computed on: cost fits then and
// not one µs earlier.
func runClients(t *testing.T, name string, p Params, rng *rand.Rand, start, end int64, decisions int) []event {
	t.Helper()
	capa := p.Capacity()
	clients := make([]client, 1+rng.Intn(3))
	for i := range clients {
		clients[i] = client{next: start + rng.Int63n(p.WindowUs), cost: extremeCost(rng, capa)}
	}
	var s State
	var admitted []event
	refused := 0
	for range decisions {
		c := &clients[0]
		for i := range clients {
			if clients[i].next < c.next {
				c = &clients[i]
			}
		}
		now := c.next
		if now > end {
			break
		}
		r := Decide(p, s, now, c.cost)
		s = r.State
		if a := Available(p, s, now); a > capa {
			t.Fatalf("%s: %d available at %d, above capacity %d", name, a, now, capa)
		}
		if r.Allowed {
			admitted = append(admitted, event{now, c.cost})
			c.next = now + extremeThink(rng, p)
			c.cost = extremeCost(rng, capa)
			continue
		}
		refused++
		ra := r.RetryAfterUs
		if ra <= 0 {
			t.Fatalf("%s: refused %d at %d with RetryAfter %d", name, c.cost, now, ra)
		}
		if c.cost <= capa {
			if !Decide(p, s, now+ra, c.cost).Allowed {
				t.Fatalf("%s: %d refused at now+RetryAfter (%d+%d)", name, c.cost, now, ra)
			}
			if Decide(p, s, now+ra-1, c.cost).Allowed {
				t.Fatalf("%s: %d admitted one µs before now+RetryAfter (%d+%d)", name, c.cost, now, ra)
			}
			c.next = now + ra
			continue
		}
		// A request that never fits: the client gives up on it (its RetryAfter is a
		// backoff of up to MaxAheadUs, not a time at which it fits).
		c.cost = extremeCost(rng, capa)
		c.next = now + extremeThink(rng, p)
	}
	if refused == 0 {
		t.Fatalf("%s: nothing refused in %d decisions: the bucket was never at its limit", name, decisions)
	}
	return admitted
}

// maxInWindow is the most permits admitted within any span of w µs: the largest sum of
// the events in (t - w, t] over the event times t.
func maxInWindow(ev []event, w int64) (most, at int64) {
	var sum int64
	i := 0
	for _, e := range ev {
		sum += e.n
		for ev[i].t <= e.t-w {
			sum -= ev[i].n
			i++
		}
		if sum > most {
			most, at = sum, e.t
		}
	}
	return most, at
}

// maxPerAlignedWindow is the most permits admitted in one window [k·w, (k+1)·w).
func maxPerAlignedWindow(ev []event, w int64) (most, at int64) {
	sums := map[int64]int64{}
	for _, e := range ev {
		k := floorDiv(e.t, w)
		sums[k] += e.n
		if sums[k] > most {
			most, at = sums[k], k*w
		}
	}
	return most, at
}

// bucketExcess is max over i ≤ j of (Σ_{i..j} n)·W − (t_j − t_i)·L, which a token
// bucket keeps at or below C·W: over [t_i, t_j] it admits at most C + (t_j − t_i)·L/W.
// In big integers: the terms reach 2^80.
func bucketExcess(ev []event, p Params) *big.Int {
	w, l := big.NewInt(p.WindowUs), big.NewInt(p.Limit)
	var best, bestStart *big.Int // bestStart: max over i of t_i·L − S_{i−1}·W
	prefix := new(big.Int)       // S_{j}
	for _, e := range ev {
		start := new(big.Int).Mul(big.NewInt(e.t), l)
		start.Sub(start, new(big.Int).Mul(prefix, w))
		if bestStart == nil || start.Cmp(bestStart) > 0 {
			bestStart = start
		}
		prefix.Add(prefix, big.NewInt(e.n))
		end := new(big.Int).Mul(prefix, w)
		end.Sub(end, new(big.Int).Mul(big.NewInt(e.t), l))
		end.Add(end, bestStart)
		if best == nil || end.Cmp(best) > 0 {
			best = end
		}
	}
	if best == nil {
		return new(big.Int)
	}
	return best
}

// TestPropertyExtremes: at every combination of the bounds, with clients that come back
// exactly at Retry-After, no algorithm admits more than its documented limit:
//
//   - token_bucket, gcra: at most C + Δt·L/W over any interval of length Δt;
//   - sliding_window_log: at most L in any span of W;
//   - sliding_window_counter: at most 2L − 1 in any span of W (the previous window's
//     permits bunched at its end, see swcState);
//   - fixed_window: at most L per aligned window (so at most 2L in any span of W);
//   - calendar: at most L per calendar period.
//
// Times start at 0, just above −MaxTimeUs and just below MaxTimeUs, where the Lua
// twins' doubles have the least room.
func TestPropertyExtremes(t *testing.T) {
	const (
		decisions = 3000
		span      = MaxAheadUs // how far the clients may get: 420 windows of 31 days
	)
	cases := 0
	for _, k := range append(allKinds, Calendar) {
		for pi, p := range extremeParams(k) {
			for si, start := range []int64{0, -MaxTimeUs + 1, MaxTimeUs - span - MaxRefillUs - 3*p.WindowUs} {
				name := fmt.Sprintf("%v %+v start %d", k, p, start)
				rng := rand.New(rand.NewSource(int64(k)*100 + int64(pi)*10 + int64(si)))
				ev := runClients(t, name, p, rng, start, start+span, decisions)
				sort.SliceStable(ev, func(i, j int) bool { return ev[i].t < ev[j].t })
				cases++
				t.Logf("%s: %d admitted", name, len(ev))
				switch k {
				case TokenBucket, GCRA:
					cw := new(big.Int).Mul(big.NewInt(p.Capacity()), big.NewInt(p.WindowUs))
					if x := bucketExcess(ev, p); x.Cmp(cw) > 0 {
						t.Errorf("%s: admitted Σn·W − Δt·L = %v, above C·W = %v", name, x, cw)
					}
				case SlidingWindowLog:
					if most, at := maxInWindow(ev, p.WindowUs); most > p.Limit {
						t.Errorf("%s: %d admitted in the window ending at %d", name, most, at)
					}
				case SlidingWindowCounter:
					if most, at := maxInWindow(ev, p.WindowUs); most > 2*p.Limit-1 {
						t.Errorf("%s: %d admitted in the window ending at %d", name, most, at)
					}
				case FixedWindow:
					if most, at := maxPerAlignedWindow(ev, p.WindowUs); most > p.Limit {
						t.Errorf("%s: %d admitted in the window starting at %d", name, most, at)
					}
				case Calendar:
					per := map[int64]int64{}
					for _, e := range ev {
						i, _, _ := CalendarWindow(p, e.t)
						if per[i] += e.n; per[i] > p.Limit {
							t.Errorf("%s: %d admitted in calendar period %d", name, per[i], i)
							break
						}
					}
				}
			}
		}
	}
	if cases < 6*3*3 {
		t.Fatalf("only %d cases: extremeParams lost combinations", cases)
	}
}
