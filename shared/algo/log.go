package algo

// SlidingWindowLog keeps the exact log of permits taken in the last window, as runs of
// (time, count): a permit taken at t counts while t > now - W. Permits taken at the same
// µs share a run, so a bulk Take costs one run, not one entry per permit.
//
// The log is exact as long as it holds at most Limit+LogSlack runs, which admissions
// alone never exceed (each admitted run holds at least one of at most Limit permits);
// beyond that (many small Takes inside one window) the oldest runs are merged into the
// newest of them, which only makes permits count for longer than they should, never
// shorter.

const (
	logHeaderLen = 9  // tag, time of the first run (int64)
	logMaxRunLen = 12 // uvarint delta (< 2W < 2^43: 7 bytes) + uvarint count (≤ 5 bytes)
	logVarintMax = 8  // longest uvarint accepted (56 bits; anything ≥ 2^53 is malformed)
)

type logRun struct{ ts, n int64 }

// uvarint reads a little-endian base-128 varint of at most logVarintMax bytes.
func uvarint(s []byte, i int) (v int64, next int, ok bool) {
	var shift uint
	for range logVarintMax {
		if i >= len(s) {
			return 0, i, false
		}
		b := s[i]
		i++
		v |= int64(b&0x7f) << shift
		if b < 0x80 {
			return v, i, true
		}
		shift += 7
	}
	return 0, i, false
}

func putUvarint(b []byte, v int64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// logDecode appends the runs of s to runs. ok is false for a malformed log: wrong tag,
// a header without runs, a truncated or over-long varint, a zero or oversized count, or
// a time the Lua twin could not hold exactly.
func logDecode(s State, runs []logRun) ([]logRun, bool) {
	if len(s) == 0 {
		return runs, true
	}
	if len(s) <= logHeaderLen || s[0] != stateTag(SlidingWindowLog) {
		return runs, false
	}
	ts := int64(le.Uint64(s[1:]))
	if !validTime(ts) {
		return runs, false
	}
	for i := logHeaderLen; i < len(s); {
		d, j, ok := uvarint(s, i)
		if !ok || d >= maxExact {
			return runs, false
		}
		c, j, ok := uvarint(s, j)
		if !ok || c < 1 || c > MaxCount {
			return runs, false
		}
		ts += d
		if ts >= maxExact {
			return runs, false
		}
		runs = append(runs, logRun{ts: ts, n: c})
		i = j
	}
	return runs, true
}

// logLoad decodes s into buf and drops the runs that have left the window. A malformed
// log, or one whose newest run is more than a window ahead of now, is treated as fresh
// (empty). moved reports whether the result differs from s.
func logLoad(n norm, s State, now int64, buf []logRun) (runs []logRun, moved bool) {
	runs, ok := logDecode(s, buf[:0])
	if !ok || (len(runs) > 0 && runs[len(runs)-1].ts-now > n.win) {
		return buf[:0], len(s) > 0
	}
	i := 0
	for i < len(runs) && runs[i].ts <= now-n.win {
		i++
	}
	return runs[i:], i > 0
}

func logEncode(n norm, runs []logRun) State {
	runs = logCap(n, runs)
	if len(runs) == 0 {
		return State{}
	}
	b := make(State, logHeaderLen, logHeaderLen+len(runs)*logMaxRunLen)
	b[0] = stateTag(SlidingWindowLog)
	le.PutUint64(b[1:], uint64(runs[0].ts))
	prev := runs[0].ts
	for _, r := range runs {
		b = putUvarint(b, r.ts-prev)
		b = putUvarint(b, r.n)
		prev = r.ts
	}
	return b
}

// logCap merges the oldest runs into one (at the newest of their times) until at most
// Limit+LogSlack remain.
func logCap(n norm, runs []logRun) []logRun {
	k := len(runs) - int(n.lim+LogSlack)
	if k <= 0 {
		return runs
	}
	var sum int64
	for _, r := range runs[:k+1] {
		sum = min(sum+r.n, MaxCount)
	}
	runs[k].n = sum
	return runs[k:]
}

func logSum(runs []logRun) int64 {
	var sum int64
	for _, r := range runs {
		sum += r.n
	}
	return sum
}

// logAppend records k permits at now (or at the newest run's time if the clock stepped
// back, so the log stays ordered).
func logAppend(runs []logRun, now, k int64) []logRun {
	if k <= 0 {
		return runs
	}
	if l := len(runs); l > 0 && runs[l-1].ts >= now {
		runs[l-1].n = min(runs[l-1].n+k, MaxCount)
		return runs
	}
	return append(runs, logRun{ts: now, n: k})
}

// logAlgo is SlidingWindowLog's algorithm (kind.go). Its states are new slices: the
// log's length varies, so the dst buffer of DecideTo and TakeTo is not used.
type logAlgo struct{}

// maxStateLen is the log of at most Limit+LogSlack runs of up to logMaxRunLen bytes.
func (*logAlgo) maxStateLen(p Params) int {
	n := p.norm()
	return logHeaderLen + int(n.lim+LogSlack)*logMaxRunLen
}

func (*logAlgo) available(p Params, s State, now int64) int64 {
	n := p.norm()
	var buf [16]logRun
	runs, _ := logLoad(n, s, now, buf[:])
	return n.lim - logSum(runs)
}

func (*logAlgo) take(_ State, p Params, s State, now, k int64) State {
	n := p.norm()
	var buf [16]logRun
	runs, _ := logLoad(n, s, now, buf[:])
	return logEncode(n, logAppend(runs, now, min(k, MaxCount)))
}

// refund removes the k newest permits: a returned lease is the most recent grant.
func (*logAlgo) refund(p Params, s State, now, k int64) State {
	n := p.norm()
	var buf [16]logRun
	runs, _ := logLoad(n, s, now, buf[:])
	keep := max(logSum(runs)-k, 0)
	out := runs[:0]
	for _, r := range runs {
		if keep <= 0 {
			break
		}
		c := min(r.n, keep)
		out = append(out, logRun{ts: r.ts, n: c})
		keep -= c
	}
	return logEncode(n, out)
}

func logReset(n norm, runs []logRun, now int64) int64 {
	if len(runs) == 0 {
		return now
	}
	return runs[len(runs)-1].ts + n.win
}

func (*logAlgo) resetAt(p Params, s State, now int64) int64 {
	n := p.norm()
	var buf [16]logRun
	runs, _ := logLoad(n, s, now, buf[:])
	return logReset(n, runs, now)
}

func logRetry(n norm, runs []logRun, now, cost int64) int64 {
	used := logSum(runs)
	if cost <= n.lim-used {
		return 0
	}
	if cost > n.lim {
		return max(logReset(n, runs, now)-now, n.win)
	}
	need := used - (n.lim - cost)
	for _, r := range runs {
		need -= r.n
		if need <= 0 {
			return r.ts + n.win - now
		}
	}
	return logReset(n, runs, now) - now // unreachable: the runs sum to used ≥ need
}

func (*logAlgo) retryAfter(p Params, s State, now, cost int64) int64 {
	n := p.norm()
	var buf [16]logRun
	runs, _ := logLoad(n, s, now, buf[:])
	return logRetry(n, runs, now, cost)
}

func (*logAlgo) decide(_ State, p Params, s State, now, cost int64) Result {
	n := p.norm()
	var buf [16]logRun
	runs, moved := logLoad(n, s, now, buf[:])
	avail := n.lim - logSum(runs)
	if cost > avail {
		r := Result{
			State:        s,
			Remaining:    max(avail, 0),
			ResetUs:      logReset(n, runs, now),
			RetryAfterUs: logRetry(n, runs, now, cost),
		}
		if moved {
			r.State = logEncode(n, runs)
		}
		return r
	}
	runs = logAppend(runs, now, cost)
	return Result{
		Allowed:   true,
		State:     logEncode(n, runs),
		Remaining: avail - cost,
		ResetUs:   logReset(n, runs, now),
	}
}
