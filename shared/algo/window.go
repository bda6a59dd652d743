package algo

// FixedWindow and SlidingWindowCounter count permits per window; windows are aligned
// to multiples of the window length since the epoch of the caller's clock, so every
// node and the service agree on where a window starts.
//
// Both forget at the window boundary: a count above Limit (debt from Take) is repaid by
// the window rolling over (FixedWindow) or by the previous window's weight sliding out
// (SlidingWindowCounter). A state that claims a window more than one window ahead of
// now, or a start that is not aligned (the window length changed), is treated as fresh;
// one window ahead is kept, so a clock stepping back at a boundary (Redis failover)
// does not hand out a fresh window.

const (
	fwLen  = 13 // tag, start int64, count uint32
	swcLen = 17 // tag, start int64, curr uint32, prev uint32
)

// fwAlgo is FixedWindow's algorithm, swcAlgo SlidingWindowCounter's (kind.go).
type (
	fwAlgo  struct{}
	swcAlgo struct{}
)

func (*fwAlgo) available(p Params, s State, now int64) int64 {
	n := p.norm()
	return n.lim - fwLoad(n, s, now).count
}

func (*fwAlgo) resetAt(p Params, s State, now int64) int64 {
	n := p.norm()
	return fwLoad(n, s, now).start + n.win
}

func (*fwAlgo) retryAfter(p Params, s State, now, cost int64) int64 {
	n := p.norm()
	return fwRetryAfter(n, fwLoad(n, s, now), now, cost)
}

func (*fwAlgo) maxStateLen(Params) int { return MaxStateSize }

func (*swcAlgo) available(p Params, s State, now int64) int64 {
	n := p.norm()
	return swcAvailable(n, swcLoad(n, s, now), now)
}

func (*swcAlgo) resetAt(p Params, s State, now int64) int64 {
	n := p.norm()
	return swcResetAt(n, swcLoad(n, s, now), now)
}

func (*swcAlgo) retryAfter(p Params, s State, now, cost int64) int64 {
	n := p.norm()
	return swcRetryAfter(n, swcLoad(n, s, now), now, cost)
}

func (*swcAlgo) maxStateLen(Params) int { return MaxStateSize }

type fwState struct {
	start, count int64
	moved        bool // differs from what was decoded (rolled over, or fresh)
}

// loadStart decodes and checks the window start at s[1:9]; ok is false for a state to
// be treated as fresh.
func loadStart(n norm, s State, size int, cur int64) (int64, bool) {
	if len(s) != size || s[0] != stateTag(n.kind) {
		return 0, false
	}
	st := int64(le.Uint64(s[1:]))
	if !validTime(st) || st-floorDiv(st, n.win)*n.win != 0 || st-cur > n.win {
		return 0, false
	}
	return st, true
}

func fwLoad(n norm, s State, now int64) fwState {
	cur := floorDiv(now, n.win) * n.win
	st, ok := loadStart(n, s, fwLen, cur)
	if !ok || st < cur {
		return fwState{start: cur, moved: true}
	}
	return fwState{start: st, count: int64(le.Uint32(s[9:]))}
}

func fwEncode(dst State, k Kind, st fwState) State {
	b := sized(dst, fwLen)
	b[0] = stateTag(k)
	le.PutUint64(b[1:], uint64(st.start))
	le.PutUint32(b[9:], uint32(st.count))
	return b
}

func (*fwAlgo) take(dst State, p Params, s State, now, k int64) State {
	n := p.norm()
	st := fwLoad(n, s, now)
	st.count = min(st.count+min(k, MaxCount), MaxCount)
	return fwEncode(dst, n.kind, st)
}

func (*fwAlgo) refund(p Params, s State, now, k int64) State {
	n := p.norm()
	st := fwLoad(n, s, now)
	st.count = max(st.count-min(k, MaxCount), 0)
	return fwEncode(nil, n.kind, st)
}

func fwRetryAfter(n norm, st fwState, now, cost int64) int64 {
	end := st.start + n.win
	switch {
	case cost <= n.lim-st.count:
		return 0
	case cost <= n.lim:
		return end - now
	default:
		return max(end-now, n.win)
	}
}

func (*fwAlgo) decide(dst State, p Params, s State, now, cost int64) Result {
	n := p.norm()
	st := fwLoad(n, s, now)
	avail := n.lim - st.count
	if cost > avail {
		r := Result{
			State:        s,
			Remaining:    max(avail, 0),
			ResetUs:      st.start + n.win,
			RetryAfterUs: fwRetryAfter(n, st, now, cost),
		}
		if st.moved {
			r.State = fwEncode(dst, n.kind, st)
		}
		return r
	}
	st.count += cost
	return Result{
		Allowed:   true,
		State:     fwEncode(dst, n.kind, st),
		Remaining: avail - cost,
		ResetUs:   st.start + n.win,
	}
}

// SlidingWindowCounter estimates the permits taken in the last W as
//
//	E = curr + ceil(prev · (W - e) / W)
//
// where curr counts the current aligned window, prev the one before and e = now - start
// is how far into the current window now is. It admits cost iff E + cost ≤ Limit.
//
// Error bound. Let X be the exact number of permits taken in (now - W, now] and p_in
// the part of prev that falls in it (0 ≤ p_in ≤ prev). Then X = curr + p_in, so
//
//	ceil(prev·(W-e)/W) - prev  ≤  E - X  ≤  ceil(prev·(W-e)/W)
//
// i.e. |E - X| ≤ prev ≤ Limit (plus debt) in the worst case, and E = X within one permit
// when the previous window's permits were spread evenly. Consequently (without debt) any
// interval of length W admits at most 2·Limit - 1 permits — the previous window's
// permits bunched at its end — and a request is rejected while the exact log would admit
// it only if the previous window's permits bunched at its start. property_test.go checks
// both bounds against an exact log.
type swcState struct {
	start, curr, prev int64
	moved             bool
}

func swcLoad(n norm, s State, now int64) swcState {
	cur := floorDiv(now, n.win) * n.win
	st, ok := loadStart(n, s, swcLen, cur)
	if !ok {
		return swcState{start: cur, moved: true}
	}
	curr := int64(le.Uint32(s[9:]))
	prev := int64(le.Uint32(s[13:]))
	switch {
	case st >= cur:
		return swcState{start: st, curr: curr, prev: prev}
	case st+n.win == cur:
		return swcState{start: cur, prev: curr, moved: true}
	default:
		return swcState{start: cur, moved: true}
	}
}

func swcEncode(dst State, k Kind, st swcState) State {
	b := sized(dst, swcLen)
	b[0] = stateTag(k)
	le.PutUint64(b[1:], uint64(st.start))
	le.PutUint32(b[9:], uint32(st.curr))
	le.PutUint32(b[13:], uint32(st.prev))
	return b
}

// swcWeighted is ceil(prev · (W - e) / W), the previous window's share.
func swcWeighted(n norm, st swcState, now int64) int64 {
	e := clamp(now-st.start, 0, n.win)
	q, r := mulDivRem(st.prev, n.win-e, n.win)
	if r > 0 {
		q++
	}
	return q
}

func swcAvailable(n norm, st swcState, now int64) int64 {
	return n.lim - st.curr - swcWeighted(n, st, now)
}

func (*swcAlgo) take(dst State, p Params, s State, now, k int64) State {
	n := p.norm()
	st := swcLoad(n, s, now)
	st.curr = min(st.curr+min(k, MaxCount), MaxCount)
	return swcEncode(dst, n.kind, st)
}

// swcRefund gives permits back to the current window first, then to the previous one.
func (*swcAlgo) refund(p Params, s State, now, k int64) State {
	n := p.norm()
	st := swcLoad(n, s, now)
	k = min(k, MaxCount)
	r := min(k, st.curr)
	st.curr -= r
	st.prev = max(st.prev-(k-r), 0)
	return swcEncode(nil, n.kind, st)
}

func swcResetAt(n norm, st swcState, now int64) int64 {
	switch {
	case st.curr > 0:
		return st.start + 2*n.win
	case st.prev > 0:
		return st.start + n.win
	default:
		return now
	}
}

// swcRetryAfter finds the first instant the estimate leaves room for cost, assuming
// nothing else is taken: within this window once the previous window's weight has slid
// far enough, else within the next one (where curr becomes prev).
func swcRetryAfter(n norm, st swcState, now, cost int64) int64 {
	if cost <= swcAvailable(n, st, now) {
		return 0
	}
	if cost > n.lim {
		return max(swcResetAt(n, st, now)-now, n.win)
	}
	// Here the weighted share exceeds m (so m < prev and m·W/prev < W): cost fits once
	// prev·(start+W-t) ≤ m·W.
	if m := n.lim - st.curr - cost; m >= 0 {
		return st.start + n.win - mulDiv(m, n.win, st.prev) - now
	}
	next := st.start + n.win
	m := n.lim - cost
	if m >= st.curr {
		return next - now
	}
	return next + n.win - mulDiv(m, n.win, st.curr) - now
}

func (*swcAlgo) decide(dst State, p Params, s State, now, cost int64) Result {
	n := p.norm()
	st := swcLoad(n, s, now)
	avail := swcAvailable(n, st, now)
	if cost > avail {
		r := Result{
			State:        s,
			Remaining:    max(avail, 0),
			ResetUs:      swcResetAt(n, st, now),
			RetryAfterUs: swcRetryAfter(n, st, now, cost),
		}
		if st.moved {
			r.State = swcEncode(dst, n.kind, st)
		}
		return r
	}
	st.curr += cost
	return Result{
		Allowed:   true,
		State:     swcEncode(dst, n.kind, st),
		Remaining: avail - cost,
		ResetUs:   swcResetAt(n, st, now),
	}
}
