package rlqs

import (
	"math"
	"math/bits"
	"slices"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// share is the token bucket an Envoy enforces for one window: its share of the window's
// rate and of its capacity.
type share struct {
	MaxTokens     uint32
	TokensPerFill uint32
	FillSec       int64 // whole seconds: Envoy 1.40 reads only the seconds of fill_interval
}

// rate is the share's refill rate in permits per second.
func (s share) rate() float64 { return float64(s.TokensPerFill) / float64(s.FillSec) }

// portion is one Envoy's part of a key's rule: w of total (0 < w ≤ total). Shares are
// weighted by each Envoy's recent demand on the key (Server.portion), so portions of
// the Envoys using a key sum to one.
type portion struct{ w, total int64 }

// whole is the portion of the only Envoy on a key.
var whole = portion{1, 1}

func (q portion) normalized() portion {
	if q.total <= 0 || q.w <= 0 || q.w > q.total {
		return whole
	}
	return q
}

// of is x·w/total for x ≥ 0, rounded down, without overflow (the product is taken in
// 128 bits; the quotient is at most x).
func (q portion) of(x int64) int64 {
	q = q.normalized()
	hi, lo := bits.Mul64(uint64(max(x, 0)), uint64(q.w))
	v, _ := bits.Div64(hi, lo, uint64(q.total))
	return int64(v)
}

// demand is what the Envoys using a key asked of it lately, in requests a second ×1000
// (admitted and denied: what they were offered): this Envoy's and every other's.
type demand struct {
	mine   int64
	others []int64
}

func (d demand) equal(o demand) bool { return d.mine == o.mine && slices.Equal(d.others, o.others) }

// portion is this Envoy's part of the rate of window p. Each Envoy's demand counts at
// least 1/8 of an even share (so an Envoy whose traffic on the key is starting is not
// held near zero until its next report). While the demands fit in the rule, each Envoy
// gets its demand scaled by the same factor, up to 5/4 (headroom for a client whose
// traffic grows a little on it, or whose count in one report was low by chance), and
// what is left beyond 5/4 is shared evenly on top. When they exceed the rule, it is
// filled like water: those asking least get their demand, and the rest share what is
// left evenly, so no Envoy is held below another's share while it asks for more. The
// portions of the Envoys using a key sum to at most one, so their shares sum to at most
// the rule (RATIONALE.md "Envoy's rate_limit_quota filter").
func (d demand) portion(p algo.Params) portion { return fraction(d.fractions(p)[0]) }

// burstPortion is this Envoy's part of what the bucket holds at once: the square root of
// its part of the rate, scaled so the parts of the Envoys on the key sum to one. A burst
// absorbs how arrivals between reports stray from the rate, and for a Poisson stream of
// rate λ that is about √(λT) over a span T: bursts in proportion to √λ give every Envoy
// the same chance of refusing a client within its share. In proportion to λ, a client
// at 90 % of its limit sending 1 in 10 requests to each of three Envoys got one permit
// at once on each and was refused there, while its busy Envoy held a burst it never
// used.
func (d demand) burstPortion(p algo.Params) portion {
	fr := d.fractions(p)
	var sum float64
	for _, f := range fr {
		sum += math.Sqrt(f)
	}
	if sum <= 0 {
		return whole
	}
	return fraction(math.Sqrt(fr[0]) / sum)
}

// fractions is the part of the rate of window p of every Envoy on the key, this one's
// first (demand.portion states how they are set).
func (d demand) fractions(p algo.Params) []float64 {
	// In floating point: a rule of 5 an hour is 0.0014 permits a second, and the
	// portions only size token buckets (their sum is checked in tests, not their digits).
	n := float64(len(d.others) + 1)
	rule := float64(p.Limit) * 1e6 / float64(max(p.WindowUs, 1)) // permits a second
	floor := rule / (8 * n)
	wants := make([]float64, 0, len(d.others)+1)
	wants = append(wants, max(float64(d.mine)/1000, floor))
	for _, r := range d.others {
		wants = append(wants, max(float64(r)/1000, floor))
	}
	var sum float64
	for _, w := range wants {
		sum += w
	}
	out := make([]float64, len(wants))
	switch {
	case sum*5/4 >= rule && sum <= rule:
		// Demands scaled by rule/sum (≤ 5/4): the rule shared in proportion.
		for i, w := range wants {
			out[i] = w / sum
		}
	case sum <= rule:
		// Demands with 5/4 headroom, and what is left shared evenly on top.
		for i, w := range wants {
			out[i] = (w*5/4 + (rule-sum*5/4)/n) / rule
		}
	default:
		sorted := slices.Clone(wants)
		slices.Sort(sorted)
		left, k := rule, n
		for _, w := range sorted {
			if w*k > left {
				break
			}
			left -= w
			k--
		}
		// wants above the level share what is left evenly; those below got theirs.
		level := left / max(k, 1)
		for i, w := range wants {
			out[i] = min(w, level) / rule
		}
	}
	return out
}

// portionScale is the denominator of a portion computed from demand.
const portionScale = 1 << 30

// fraction is f (0 < f ≤ 1) as a portion, rounded down (never below 1/portionScale).
func fraction(f float64) portion {
	return portion{int64(min(max(f*portionScale, 1), portionScale)), portionScale}
}

// shareOf sizes one Envoy's token bucket for a window of parameters p: its portion q of
// the window's rate and its portion burst of the window's capacity. The portion weighs
// the Envoys (streams of this replica) that had requests on the key within two report
// intervals by the requests each reported, not the whole fleet evenly: a key used through one Envoy of many gets
// the whole rule, and a client whose traffic reaches the Envoys unevenly gets a share
// on each that follows its traffic, as a gateway's lease follows its demand
// (RATIONALE.md §2). Portions of the Envoys using a key sum to one, so their shares sum
// to at most the rule; what other paths (Wasm gateways, RLS, other replicas) take of
// the same bucket shows in what remains, which caps bursts and denies (burstOf).
// RATIONALE.md "Envoy's rate_limit_quota filter" states the bounds.
//
// Envoy 1.40 computes the fill rate as tokens_per_fill / (whole seconds of
// fill_interval), so the interval is whole seconds, at least 1: a window under a second
// is refilled once a second with a second's worth of permits; a share under one permit
// per window stretches the interval instead (1 permit every ceil(window/(limit·q))
// seconds). max_tokens is at least 1: a token bucket of 0 refuses everything, which is
// the deny this path sends as a blanket rule when the bucket is spent.
func shareOf(p algo.Params, q, burst portion) share {
	q = q.normalized()
	winUs := max(p.WindowUs, 1)
	fill := max(1, (winUs+999_999)/1_000_000) // seconds
	// permits per fill interval for the whole fleet, then this node's share
	per := q.of(perFill(p.Limit, fill, winUs))
	// Rounding tokens_per_fill down loses up to a permit per interval: a light Envoy's
	// 0.187 permits a second of a rule of 20 per 10 s was 1 per 10 s, half of it, and
	// refused a client within its share. A longer interval of the same rate (Envoy
	// refills continuously at tokens_per_fill / fill_interval) keeps the loss under 1 %,
	// up to an interval of an hour or the window.
	rate := float64(p.Limit) * 1e6 / float64(winUs) * float64(q.w) / float64(q.total) // permits a second
	if maxFill := max(fill, 3600); float64(per) < 0.99*rate*float64(fill) && fill < maxFill {
		fill = int64(min(max(math.Ceil(100/rate), float64(fill)), float64(maxFill)))
		per = q.of(perFill(p.Limit, fill, winUs))
	}
	if per < 1 {
		// Fewer than one permit per interval: stretch the interval to one permit.
		perSec := max(q.of(p.Limit*1_000_000), 1) // the share's permits per window, ×10⁶
		fill = max(1, (winUs+perSec-1)/perSec)
		per = 1
	}
	capShare := max(1, burst.of(p.Capacity()))
	return share{MaxTokens: u32(capShare), TokensPerFill: u32(per), FillSec: fill}
}

// perFill is limit per winUs over fillSec seconds, rounded down, in 128 bits (a limit
// of 2³¹ over an hour does not fit in 64).
func perFill(limit, fillSec, winUs int64) int64 {
	hi, lo := bits.Mul64(uint64(max(limit, 0)), uint64(fillSec)*1_000_000)
	if hi >= uint64(winUs) {
		return 1<<63 - 1
	}
	v, _ := bits.Div64(hi, lo, uint64(winUs))
	return int64(min(v, 1<<63-1))
}

// tightest is the most restrictive of shares (lowest rate, then smallest burst): a
// bucket several windows select is held to all of them only approximately, by the one
// that admits least over time.
func tightest(shares []share) (share, bool) {
	if len(shares) == 0 {
		return share{}, false
	}
	best := shares[0]
	for _, s := range shares[1:] {
		if s.rate() < best.rate() || (s.rate() == best.rate() && s.MaxTokens < best.MaxTokens) {
			best = s
		}
	}
	return best, true
}

func u32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }

// burstOf is one node's portion of what a global bucket holds unreserved (remaining,
// from the store's answer to a report): the most an Envoy's token bucket may hold.
// Envoy 1.40 starts a first token bucket (or one after a blanket rule) full and a
// changed one at the fill ratio of the one it replaces, so a bucket holds at most its
// max_tokens just after an assignment: capping max_tokens at the node's portion of
// remaining keeps what a fleet can admit at once within what the bucket holds, however
// often the shares change. A portion under one permit is raised to one while the bucket
// holds a permit for each of the n Envoys on the key: denying an Envoy whose share of a
// bucket that still holds 17 of 20 rounds down to nothing refused a client at 90 % of
// its limit on its lightly used Envoys (the fleet can then hold up to n − 1 permits
// more than remaining, once per full bucket: RATIONALE.md "Envoy's rate_limit_quota
// filter"). 0: the bucket is spent for this node (the Envoy is denied until it holds n
// permits again).
func burstOf(remaining int64, q portion, n int64) int64 {
	b := q.of(max(0, remaining))
	if b == 0 && remaining >= max(n, 1) {
		return 1
	}
	return b
}
