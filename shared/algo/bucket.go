package algo

// TokenBucket and GCRA share one exact implementation: a token bucket of capacity C
// refilled at L per W is the generic cell rate algorithm with emission interval T = W/L
// and tolerance C·T (tokens = C - (tat - now)/T). Keeping the theoretical arrival time
// (tat) instead of a token count means the state changes only when permits are taken,
// and is what go-redis/redis_rate stores, whose decisions GCRA reproduces (gcra_test.go).
// The two stay separate Kinds so a rule says what its author meant and the state of one
// is never read as the other (the tag byte differs).
//
// Intended differences from redis_rate (whose float seconds this replaces with exact
// integers): retry-after and reset are rounded up to the µs (never early; redis_rate's
// are exact reals); a rejection reports the permits left instead of 0; there is no
// AllowAtMost; and Take/Refund (debt, returned leases) have no redis_rate counterpart.
//
// T is rarely a whole number of µs, so tat is kept as tat + frac/L µs with frac in
// [0, L): exact rational arithmetic with no drift however many single permits are taken.

const tatLen = 13 // tag, tat int64, frac uint32

// tatAlgo is TokenBucket's and GCRA's algorithm (kind.go).
type tatAlgo struct{}

func (*tatAlgo) available(p Params, s State, now int64) int64 {
	n := p.norm()
	return n.capa - tatUsed(n, tatLoad(n, s, now), now)
}

func (*tatAlgo) resetAt(p Params, s State, now int64) int64 {
	n := p.norm()
	return tatResetAt(tatLoad(n, s, now))
}

func (*tatAlgo) retryAfter(p Params, s State, now, cost int64) int64 {
	n := p.norm()
	return tatRetryAfter(n, tatLoad(n, s, now), now, cost)
}

func (*tatAlgo) maxStateLen(Params) int { return MaxStateSize }

type tatState struct {
	tat  int64 // whole µs of the theoretical arrival time
	frac int64 // plus frac/L µs
}

func stateTag(k Kind) byte { return 0x10 + byte(k) }

// tatLoad decodes s and brings it to now: a tat in the past means a full bucket (tat =
// now), debt is capped at MaxAheadUs. A malformed or short state (wrong length, wrong
// tag, a time the Lua twin could not hold exactly) is treated as fresh, so a corrupt
// record costs at most one bucket's worth of permits and never a crash.
func tatLoad(n norm, s State, now int64) tatState {
	st := tatState{tat: now}
	if len(s) == tatLen && s[0] == stateTag(n.kind) {
		t := int64(le.Uint64(s[1:]))
		f := int64(le.Uint32(s[9:]))
		if validTime(t) {
			// frac ≥ L when the limit was lowered since the state was written: carry it.
			st = tatState{tat: t + f/n.lim, frac: f % n.lim}
		}
	}
	if st.tat < now {
		return tatState{tat: now}
	}
	if st.tat-now >= MaxAheadUs {
		return tatState{tat: now + MaxAheadUs}
	}
	return st
}

func tatEncode(dst State, k Kind, st tatState) State {
	b := sized(dst, tatLen)
	b[0] = stateTag(k)
	le.PutUint64(b[1:], uint64(st.tat))
	le.PutUint32(b[9:], uint32(st.frac))
	return b
}

// tatUsed is how many permits are out of the bucket: ceil((tat - now)/T).
func tatUsed(n norm, st tatState, now int64) int64 {
	q, r := mulDivRem(st.tat-now, n.lim, n.win)
	t := r + st.frac // < W + L ≤ 2W
	return q + (t+n.win-1)/n.win
}

// tatMaxN is how many permits span MaxAheadUs; larger amounts are clamped to it before
// they are multiplied by T, which keeps the products below 2^53.
func tatMaxN(n norm) int64 { return mulDiv(MaxAheadUs, n.lim, n.win) + 1 }

func tatAdd(n norm, st tatState, now, k int64) tatState {
	q, r := mulDivRem(min(k, tatMaxN(n)), n.win, n.lim)
	st.frac += r
	if st.frac >= n.lim {
		st.frac -= n.lim
		q++
	}
	st.tat += q
	if st.tat-now >= MaxAheadUs {
		return tatState{tat: now + MaxAheadUs}
	}
	return st
}

func (*tatAlgo) take(dst State, p Params, s State, now, k int64) State {
	n := p.norm()
	return tatEncode(dst, n.kind, tatAdd(n, tatLoad(n, s, now), now, k))
}

func (*tatAlgo) refund(p Params, s State, now, k int64) State {
	n := p.norm()
	st := tatLoad(n, s, now)
	q, r := mulDivRem(min(k, tatMaxN(n)), n.win, n.lim)
	st.frac -= r
	if st.frac < 0 {
		st.frac += n.lim
		q++
	}
	st.tat -= q
	if st.tat < now {
		st = tatState{tat: now}
	}
	return tatEncode(nil, n.kind, st)
}

// tatResetAt is when the bucket is full: tat rounded up to the µs.
func tatResetAt(st tatState) int64 {
	if st.frac > 0 {
		return st.tat + 1
	}
	return st.tat
}

// tatRetryAfter: cost fits once tat - (C - cost)·T ≤ now, so the answer is that
// instant rounded up to the µs. For cost > C the same formula gives redis_rate's
// tat + (cost - C)·T.
func tatRetryAfter(n norm, st tatState, now, cost int64) int64 {
	m := n.capa - cost
	var at int64
	if m >= 0 {
		q, r := mulDivRem(m, n.win, n.lim)
		at = st.tat - q
		if st.frac > r {
			at++
		}
	} else {
		q, r := mulDivRem(min(-m, tatMaxN(n)), n.win, n.lim)
		at = st.tat + q + (st.frac+r+n.lim-1)/n.lim
	}
	return max(at-now, 0)
}

func (*tatAlgo) decide(dst State, p Params, s State, now, cost int64) Result {
	n := p.norm()
	st := tatLoad(n, s, now)
	avail := n.capa - tatUsed(n, st, now)
	if cost > avail {
		// Nothing to record: the refill up to now is implicit in tat.
		return Result{
			State:        s,
			Remaining:    max(avail, 0),
			ResetUs:      tatResetAt(st),
			RetryAfterUs: tatRetryAfter(n, st, now, cost),
		}
	}
	st = tatAdd(n, st, now, cost)
	return Result{
		Allowed:   true,
		State:     tatEncode(dst, n.kind, st),
		Remaining: avail - cost,
		ResetUs:   tatResetAt(st),
	}
}
