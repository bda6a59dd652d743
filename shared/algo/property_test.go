package algo

import (
	"bytes"
	"math/bits"
	"math/rand"
	"testing"
)

// walk runs a random sequence of Take/Refund/Decide on a fresh state and calls check
// before every operation. Time only moves forward.
func walk(t *testing.T, seed int64, k Kind, steps int, check func(p Params, s State, now int64, rng *rand.Rand)) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	p := randParams(rng, k)
	var s State
	now := rng.Int63n(1 << 50)
	if rng.Intn(4) == 0 {
		now = 0
	}
	for range steps {
		now += randStep(rng, p)
		check(p, s, now, rng)
		switch rng.Intn(6) {
		case 0:
			s = Take(p, s, now, rng.Int63n(p.Capacity()+1))
		case 1:
			s = Refund(p, s, now, rng.Int63n(p.Capacity()+1))
		default:
			s = Decide(p, s, now, randCost(rng, p)).State
		}
	}
}

// TestPropertyAlgebra checks, for every algorithm and on states reached by random
// sequences, the relations the sync service and the filter rely on.
func TestPropertyAlgebra(t *testing.T) {
	for _, k := range append(allKinds, Calendar) {
		t.Run(k.String(), func(t *testing.T) {
			for seed := range int64(60) {
				walk(t, seed, k, 200, func(p Params, s State, now int64, rng *rand.Rand) {
					t.Helper()
					capa := p.Capacity()
					a := Available(p, s, now)
					if a > capa {
						t.Fatalf("seed %d %+v: Available %d above capacity %d", seed, p, a, capa)
					}
					n := rng.Int63n(2*capa + 1)

					// Take(n) reduces Available by exactly n; Refund(n) undoes it.
					taken := Take(p, s, now, n)
					if got := Available(p, taken, now); got != a-n {
						t.Fatalf("seed %d %+v: Available after Take(%d) = %d, want %d", seed, p, n, got, a-n)
					}
					if got := Available(p, Refund(p, taken, now, n), now); got != a {
						t.Fatalf("seed %d %+v: Available after Take+Refund(%d) = %d, want %d", seed, p, n, got, a)
					}
					// Refund never goes above full.
					if got := Available(p, Refund(p, s, now, 3*capa+MaxCount), now); got != capa {
						t.Fatalf("seed %d %+v: Available after a huge Refund = %d, want %d", seed, p, got, capa)
					}

					// Decide admits iff cost fits, and then is exactly Take(cost).
					cost := randCost(rng, p)
					r := Decide(p, s, now, cost)
					if r.Allowed != (cost <= a) {
						t.Fatalf("seed %d %+v: Decide(%d) allowed=%v with %d available", seed, p, cost, r.Allowed, a)
					}
					if r.Allowed {
						if want := Take(p, s, now, cost); !bytes.Equal(r.State, want) {
							t.Fatalf("seed %d %+v: Decide(%d) state %x != Take state %x", seed, p, cost, r.State, want)
						}
						if r.Remaining != a-cost || Available(p, r.State, now) != a-cost || r.RetryAfterUs != 0 {
							t.Fatalf("seed %d %+v: allowed Decide(%d) = %+v with %d available before", seed, p, cost, r, a)
						}
						if r.ResetUs != ResetAt(p, r.State, now) {
							t.Fatalf("seed %d %+v: ResetUs %d != ResetAt %d", seed, p, r.ResetUs, ResetAt(p, r.State, now))
						}
					} else {
						if Available(p, r.State, now) != a || r.Remaining != max(a, 0) {
							t.Fatalf("seed %d %+v: rejected Decide(%d) changed the state: %+v, %d available before", seed, p, cost, r, a)
						}
						if ra := RetryAfter(p, s, now, cost); r.RetryAfterUs != ra || ra <= 0 {
							t.Fatalf("seed %d %+v: rejected Decide(%d) retry %d, RetryAfter %d", seed, p, cost, r.RetryAfterUs, ra)
						}
						if r.ResetUs != ResetAt(p, s, now) {
							t.Fatalf("seed %d %+v: ResetUs %d != ResetAt %d", seed, p, r.ResetUs, ResetAt(p, s, now))
						}
					}

					// RetryAfter is exact: cost fits at now+ra and not a µs earlier.
					if ra := RetryAfter(p, s, now, cost); cost <= capa {
						if !Decide(p, s, now+ra, cost).Allowed {
							t.Fatalf("seed %d %+v: Decide(%d) rejected at now+RetryAfter (%d)", seed, p, cost, ra)
						}
						if ra > 0 && Decide(p, s, now+ra-1, cost).Allowed {
							t.Fatalf("seed %d %+v: Decide(%d) admitted before now+RetryAfter (%d)", seed, p, cost, ra)
						}
					}

					// ResetAt is when the bucket is full again (FixedWindow: the window end).
					rs := ResetAt(p, s, now)
					if rs < now || Available(p, s, rs) != capa {
						t.Fatalf("seed %d %+v: ResetAt %d (now %d) leaves %d available", seed, p, rs, now, Available(p, s, rs))
					}
					if k != FixedWindow && k != Calendar && rs > now && Available(p, s, rs-1) == capa {
						t.Fatalf("seed %d %+v: full before ResetAt %d", seed, p, rs)
					}
					if k == FixedWindow && rs != floorDiv(now, p.WindowUs)*p.WindowUs+p.WindowUs {
						t.Fatalf("seed %d %+v: ResetAt %d is not the end of the window of %d", seed, p, rs, now)
					}
					if _, _, end := CalendarWindow(p, now); k == Calendar && rs != end && rs != ResetAt(p, nil, end) {
						// the end of the period, or of the next one for a state kept one
						// period ahead (a clock stepped back)
						t.Fatalf("seed %d %+v: ResetAt %d is not the end of the period of %d", seed, p, rs, now)
					}
					if len(s) > p.MaxStateLen() {
						t.Fatalf("seed %d %+v: state of %d bytes above MaxStateLen %d", seed, p, len(s), p.MaxStateLen())
					}
				})
			}
		})
	}
}

type event struct{ t, n int64 }

// mulAdd128 returns a·b + c·d as a 128-bit number (hi, lo).
func mulAdd128(a, b, c, d int64) (hi, lo uint64) {
	h1, l1 := bits.Mul64(uint64(a), uint64(b))
	h2, l2 := bits.Mul64(uint64(c), uint64(d))
	lo, carry := bits.Add64(l1, l2, 0)
	hi, _ = bits.Add64(h1, h2, carry)
	return hi, lo
}

func less128(h1, l1, h2, l2 uint64) bool { return h1 < h2 || (h1 == h2 && l1 < l2) }

// TestPropertyBucketBound: over every interval [t_i, t_j] of a random sequence, a
// token bucket (and GCRA) admits at most C + (t_j - t_i)·L/W permits.
func TestPropertyBucketBound(t *testing.T) {
	for _, k := range []Kind{TokenBucket, GCRA} {
		t.Run(k.String(), func(t *testing.T) {
			for seed := range int64(80) {
				rng := rand.New(rand.NewSource(seed))
				p := randParams(rng, k)
				var s State
				var now int64
				var got []event
				rejected := 0
				for range 400 {
					now += randStep(rng, p)
					cost := randCost(rng, p)
					r := Decide(p, s, now, cost)
					s = r.State
					if r.Allowed {
						got = append(got, event{now, cost})
					} else {
						rejected++
					}
				}
				if rejected == 0 {
					continue // nothing was at the limit
				}
				c := p.Capacity()
				for i := range got {
					var sum int64
					for j := i; j < len(got); j++ {
						sum += got[j].n
						// sum·W ≤ C·W + (t_j - t_i)·L
						h1, l1 := mulAdd128(sum, p.WindowUs, 0, 0)
						h2, l2 := mulAdd128(c, p.WindowUs, got[j].t-got[i].t, p.Limit)
						if less128(h2, l2, h1, l1) {
							t.Fatalf("seed %d %+v: %d permits admitted in [%d, %d]", seed, p, sum, got[i].t, got[j].t)
						}
					}
				}
			}
		})
	}
}

// countIn sums the events in (to - w, to].
func countIn(log []event, to, w int64) int64 {
	var sum int64
	for _, e := range log {
		if e.t > to-w && e.t <= to {
			sum += e.n
		}
	}
	return sum
}

// refundNewest removes n permits from the end of log (what Refund does to a log).
func refundNewest(log []event, now, w, n int64) []event {
	for len(log) > 0 && n > 0 {
		last := &log[len(log)-1]
		if last.t <= now-w {
			break
		}
		c := min(last.n, n)
		last.n -= c
		n -= c
		if last.n == 0 {
			log = log[:len(log)-1]
		}
	}
	return log
}

// TestPropertySlidingLogExact: against an exact reference log, the sliding window log
// never admits more than Limit in any window of length W and never rejects a request
// that fits.
func TestPropertySlidingLogExact(t *testing.T) {
	for seed := range int64(80) {
		rng := rand.New(rand.NewSource(seed))
		p := randParams(rng, SlidingWindowLog)
		var s State
		var now int64
		var ref []event
		for i := range 300 {
			now += randStep(rng, p)
			x := countIn(ref, now, p.WindowUs)
			if got := Available(p, s, now); got != p.Limit-x {
				t.Fatalf("seed %d step %d %+v: Available %d, exact %d", seed, i, p, got, p.Limit-x)
			}
			switch rng.Intn(8) {
			case 0:
				n := rng.Int63n(p.Limit + 1)
				s = Take(p, s, now, n)
				ref = append(ref, event{now, n})
			case 1:
				n := rng.Int63n(p.Limit + 1)
				s = Refund(p, s, now, n)
				ref = refundNewest(ref, now, p.WindowUs, n)
			default:
				cost := randCost(rng, p)
				r := Decide(p, s, now, cost)
				if r.Allowed != (x+cost <= p.Limit) {
					t.Fatalf("seed %d step %d %+v: Decide(%d) allowed=%v with %d in the window", seed, i, p, cost, r.Allowed, x)
				}
				s = r.State
				if r.Allowed {
					ref = append(ref, event{now, cost})
				}
			}
		}
	}
}

// TestPropertySlidingCounterError checks the error bound documented on swcState against
// an exact log, and the 2·Limit-1 bound on any interval of length W.
func TestPropertySlidingCounterError(t *testing.T) {
	for seed := range int64(80) {
		rng := rand.New(rand.NewSource(seed))
		p := randParams(rng, SlidingWindowCounter)
		n := p.norm()
		var s State
		var now int64
		var ref, admitted []event
		for i := range 300 {
			now += randStep(rng, p)
			st := swcLoad(n, s, now)
			e := now - st.start
			share := ceilMulDiv(st.prev, p.WindowUs-e, p.WindowUs)
			est := st.curr + share
			x := countIn(ref, now, p.WindowUs)
			if d := est - x; d < share-st.prev || d > share {
				t.Fatalf("seed %d step %d %+v: estimate %d, exact %d, prev %d, share %d", seed, i, p, est, x, st.prev, share)
			}
			if rng.Intn(10) == 0 {
				k := rng.Int63n(p.Limit + 1)
				s = Take(p, s, now, k)
				ref = append(ref, event{now, k})
				continue
			}
			cost := randCost(rng, p)
			r := Decide(p, s, now, cost)
			s = r.State
			if r.Allowed {
				ref = append(ref, event{now, cost})
				admitted = append(admitted, event{now, cost})
			}
		}
		// Decide alone (no Take) never puts more than 2L-1 into any interval of length W.
		// Checked on a Decide-only replay of the same parameters.
		rng = rand.New(rand.NewSource(seed))
		s, now, admitted = nil, 0, admitted[:0]
		for range 300 {
			now += randStep(rng, p)
			cost := randCost(rng, p)
			r := Decide(p, s, now, cost)
			s = r.State
			if r.Allowed {
				admitted = append(admitted, event{now, cost})
			}
		}
		for _, e := range admitted {
			if x := countIn(admitted, e.t, p.WindowUs); x > 2*p.Limit-1 {
				t.Fatalf("seed %d %+v: %d admitted in the window ending at %d", seed, p, x, e.t)
			}
		}
	}
}

// TestSlidingCounterEvenTraffic: when permits are spread evenly, the estimate is within
// one permit of the exact count.
func TestSlidingCounterEvenTraffic(t *testing.T) {
	for _, p := range []Params{
		{Kind: SlidingWindowCounter, Limit: 100, WindowUs: minute},
		{Kind: SlidingWindowCounter, Limit: 7, WindowUs: second},
		{Kind: SlidingWindowCounter, Limit: 1000, WindowUs: 3 * second},
	} {
		t.Run(p.Kind.String(), func(t *testing.T) {
			n := p.norm()
			var s State
			var ref []event
			gap := p.WindowUs / p.Limit
			for now := int64(0); now < 5*p.WindowUs; now += gap / 3 {
				if now%gap < gap/3 {
					s = Take(p, s, now, 1)
					ref = append(ref, event{now, 1})
				}
				st := swcLoad(n, s, now)
				est := st.curr + swcWeighted(n, st, now)
				if d := est - countIn(ref, now, p.WindowUs); d < -1 || d > 1 {
					t.Fatalf("%+v at %d: estimate %d off the exact count by %d", p, now, est, d)
				}
			}
		})
	}
}

func ceilMulDiv(a, b, c int64) int64 {
	q, r := mulDivRem(a, b, c)
	if r > 0 {
		q++
	}
	return q
}
