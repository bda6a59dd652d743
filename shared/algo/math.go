package algo

import (
	"encoding/binary"
	"math/bits"
)

// maxExact is 2^53: every value the Lua twins hold must stay strictly below it in
// magnitude, and decoded times at or beyond it mark a state as malformed.
const maxExact = 1 << 53

var le = binary.LittleEndian

// norm is Params clamped into the supported range. Every function works on a norm, so
// out-of-range Params degrade (the closest supported rule) instead of overflowing.
// The Lua fragments clamp identically (algo_norm).
type norm struct {
	kind Kind
	lim  int64  // permits per window
	win  int64  // window, µs
	capa int64  // capacity
	per  Period // Calendar: the period
	off  int64  // Calendar: the UTC offset, µs
}

func (p Params) norm() norm {
	k := p.Kind
	if !k.Valid() {
		k = TokenBucket
	}
	info := &kinds[k]
	l := clamp(p.Limit, 1, info.maxLimit)
	if info.calendarPeriods {
		// the window is the period's, whatever WindowUs says
		per, off := calNorm(p.Burst)
		return norm{kind: k, lim: l, win: PeriodUs(per), capa: l, per: per, off: off}
	}
	w := clamp(p.WindowUs, MinWindowUs, MaxWindowUs)
	w = max(w, l)
	c := l
	if info.burst {
		if p.Burst > 0 {
			c = min(p.Burst, MaxBurst)
		}
		// The refill bound can only bind a capacity above the limit: w is at most
		// MaxWindowUs (or l, below it) < MaxRefillUs, so MaxRefillUs·l/w ≥ l (and the
		// division is spared on every decision of a rule without a burst).
		if c > l {
			c = min(c, mulDiv(MaxRefillUs, l, w))
		}
	}
	return norm{kind: k, lim: l, win: w, capa: c}
}

// The refill bound above relies on it: a compile error if a window could exceed it.
const _ = uint64(MaxRefillUs - max(MaxWindowUs, MaxLimit))

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }

// mulDivRem returns floor(a·b/c) and a·b mod c for a, b ≥ 0 and c > 0 without
// overflowing the product. Callers keep the quotient below 2^53 and c below 2^42, which
// is what the Lua twin (algo__muldivrem, long division in base 2^10) needs to be exact
// too.
func mulDivRem(a, b, c int64) (q, r int64) {
	if a <= 0 || b <= 0 || c <= 0 {
		return 0, 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi == 0 {
		// The product fits 64 bits, as in most calls: one machine division. Compiled to
		// wasm, bits.Div64 is a long division in software.
		return int64(lo / uint64(c)), int64(lo % uint64(c))
	}
	if hi >= uint64(c) {
		// The quotient would not fit 64 bits (bits.Div64 would panic); unreachable
		// under the documented bounds, saturate rather than trap the VM.
		return maxExact, 0
	}
	uq, ur := bits.Div64(hi, lo, uint64(c))
	return int64(uq), int64(ur)
}

func mulDiv(a, b, c int64) int64 {
	q, _ := mulDivRem(a, b, c)
	return q
}

// floorDiv rounds toward minus infinity (window starts for clocks before the epoch).
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// validTime reports whether a decoded time is one the Lua twin holds exactly.
func validTime(t int64) bool { return t > -maxExact && t < maxExact }
