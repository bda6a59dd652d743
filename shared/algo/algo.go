// Package algo holds Tollgate's five rate-limiting algorithms as pure functions of
// (params, state, now, cost). Nothing here reads a clock, allocates per call on the hot
// path, or touches a host: the filter, the sync service's Go twin of its Lua scripts
// and the fleet simulation all run exactly this code.
//
// Each algorithm is one row of the table in kind.go: its name, its operations and the
// properties the rest of Tollgate asks about (Kind.Refills, Kind.Windowed, ...), so no
// caller compares kinds by name. A new algorithm is a constant, a row and its code here,
// and its Lua twin in ratelimit/store/scripts (whose lease.lua still tests some of these
// properties by kind number).
//
// Time is int64 microseconds on whatever clock the caller injects. Microseconds keep every
// intermediate value below 2^53, so the Redis Lua scripts (which compute in doubles) can
// reproduce each step bit for bit; see ENCODING.md beside this file.
package algo

import (
	"errors"
	"strconv"
)

// Params configures one window of one rule.
type Params struct {
	Kind Kind
	// Limit is the number of permits per Window (the steady rate is Limit/Window).
	Limit int64
	// WindowUs is the window length in microseconds, MinWindowUs to MaxWindowUs.
	WindowUs int64
	// Burst is the capacity for TokenBucket and GCRA (permits that may be taken at once);
	// 0 means Limit. Ignored by the other window algorithms; Calendar keeps its period
	// and UTC offset here (see CalendarParams).
	Burst int64
}

// MaxStateSize is the largest encoded State of the fixed-size algorithms (all but
// SlidingWindowLog, whose exact log is O(Limit) by nature; see ENCODING.md).
const MaxStateSize = 24

// State is an algorithm's encoded state. The zero-length State is a fresh (full) bucket.
type State []byte

// Result is the outcome of one decision.
type Result struct {
	Allowed bool
	// State is the new state (when !Allowed, the state is unchanged except for
	// bookkeeping the algorithm needs, e.g. window roll-over).
	State State
	// Remaining is how many permits could still be taken right after this decision,
	// floored at 0 for headers (Available reports debt as a negative number). Unlike
	// go-redis/redis_rate, a rejection reports what is left, not 0: a request costing 5
	// may be rejected with 3 remaining.
	Remaining int64
	// ResetUs is the absolute time at which the bucket is back to full (FixedWindow: the
	// end of the current window; see ResetAt).
	ResetUs int64
	// RetryAfterUs is, when !Allowed, how long from now until `cost` permits are
	// available (never earlier than the algorithm would admit); 0 when Allowed.
	RetryAfterUs int64
}

// Bounds. Params outside them are rejected by Validate and clamped by every function
// (so no input can overflow the arithmetic or divide by zero). Together they keep every
// intermediate value of the Lua twins an exact integer below 2^53; ENCODING.md derives
// each bound. The Lua copies (ratelimit/store/scripts/algo_common.lua) are checked
// against these by the differential tests.
const (
	// MaxLimit bounds the permits per window: a 1,000,000,000-token monthly budget fits,
	// and so do the wire's uint32 counts.
	MaxLimit = 1_000_000_000
	// MaxLogLimit bounds SlidingWindowLog's limit: its exact log is O(Limit) bytes (up
	// to 12 a run) and every decision decodes all of it, in Redis too.
	MaxLogLimit = 10_000
	// MaxBurst bounds TokenBucket/GCRA capacity (and MaxRefillUs bounds it further).
	MaxBurst = 1_000_000_000
	// MaxCost bounds the permits one request may take.
	MaxCost = 1_000_000
	// MinWindowUs is 1 ms: the wire protocol carries windows in milliseconds. A window
	// must also be at least Limit µs long (at most one permit per µs, 10^6/s per key).
	MinWindowUs = 1_000
	// MaxWindowUs is 31 days, the longest calendar month (below 2^42 µs, which the Lua
	// long division needs).
	MaxWindowUs = 31 * 86_400_000_000
	// MaxRefillUs bounds how long an empty TokenBucket/GCRA takes to refill
	// (Capacity × Window / Limit, about 17.8 years).
	MaxRefillUs = 1 << 49
	// MaxAheadUs bounds TokenBucket/GCRA debt: the theoretical arrival time never runs
	// more than this ahead of now (about 35.7 years); debt beyond it is forgiven.
	MaxAheadUs = 1 << 50
	// MaxCount bounds a window count (and one log run); debt beyond it is forgiven.
	MaxCount = 1<<32 - 1
	// MaxTimeUs bounds |now|: 2^52 µs after the epoch is the year 2112.
	MaxTimeUs = 1 << 52
	// LogSlack is how many runs a SlidingWindowLog may hold beyond Limit before its
	// oldest runs are merged (see ENCODING.md).
	LogSlack = 64
)

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid rate-limit parameters")

// ParamError is the error Validate returns: which parameter is out of bounds and why, so
// a configuration loader can name the field in its own terms (a JSON path).
type ParamError struct {
	Field string // "algorithm", "limit", "window" or "burst"
	Msg   string
}

func (e *ParamError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *ParamError) Unwrap() error { return ErrInvalid }

func paramErr(field, msg string) error { return &ParamError{Field: field, Msg: msg} }

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// Capacity is how many permits a full bucket holds: Burst (default Limit) for
// TokenBucket and GCRA, Limit for the window algorithms. It is the capacity every
// function here works with, so for out-of-range Params it is the clamped value.
func (p Params) Capacity() int64 { return p.norm().capa }

// Validate reports whether p is within the bounds above. Every function in this package
// accepts any Params (clamping them), but a rule that needs clamping is a rule that does
// not mean what its author wrote, so configuration loaders reject it.
func (p Params) Validate() error {
	if !p.Kind.Valid() {
		return paramErr("algorithm", "unknown algorithm "+itoa(int64(p.Kind)))
	}
	maxLimit := p.Kind.MaxLimit()
	if p.Limit < 1 || p.Limit > maxLimit {
		return paramErr("limit", "must be in [1, "+itoa(maxLimit)+"], got "+itoa(p.Limit))
	}
	if p.WindowUs < MinWindowUs || p.WindowUs > MaxWindowUs {
		return paramErr("window", "must be in ["+itoa(MinWindowUs)+", "+itoa(MaxWindowUs)+"] µs, got "+itoa(p.WindowUs))
	}
	if p.WindowUs < p.Limit {
		return paramErr("limit", itoa(p.Limit)+" per "+itoa(p.WindowUs)+" µs is more than one permit per µs")
	}
	if p.Kind.CalendarPeriods() {
		// CalendarParams is the one encoding (calendar.go)
		if per, _, ok := p.Calendar(); !ok {
			return paramErr("calendar", "bad period/offset encoding "+itoa(p.Burst))
		} else if p.WindowUs != PeriodUs(per) {
			return paramErr("window", "must be the calendar period's longest length, got "+itoa(p.WindowUs)+" µs")
		}
		return nil
	}
	if p.Burst < 0 || p.Burst > MaxBurst {
		return paramErr("burst", "must be in [0, "+itoa(MaxBurst)+"], got "+itoa(p.Burst))
	}
	if p.Kind.HasBurst() {
		c := p.Limit
		if p.Burst > 0 {
			c = p.Burst
		}
		if m := mulDiv(MaxRefillUs, p.Limit, p.WindowUs); c > m {
			return paramErr("burst", "capacity "+itoa(c)+" at "+itoa(p.Limit)+" per "+itoa(p.WindowUs)+" µs takes longer than "+itoa(MaxRefillUs)+" µs to refill")
		}
	}
	return nil
}

// Decide admits cost permits iff all of them fit now (cost < 0 counts as 0).
func Decide(p Params, s State, now, cost int64) Result {
	return p.Kind.ops().decide(nil, p, s, now, max(cost, 0))
}

// DecideTo is Decide writing a new state of the fixed-size algorithms into dst's array
// when it has the capacity (MaxStateSize suffices), so a caller that keeps one buffer
// per bucket decides without allocating. dst must not overlap s; Result.State may be
// dst, s itself (nothing to record), or a new slice (SlidingWindowLog).
func DecideTo(dst State, p Params, s State, now, cost int64) Result {
	return p.Kind.ops().decide(dst, p, s, now, max(cost, 0))
}

// Available is how many permits could be taken now. It is negative while the bucket is
// in debt (Take consumed more than it held).
func Available(p Params, s State, now int64) int64 {
	return p.Kind.ops().available(p, s, now)
}

// Take consumes n permits unconditionally, going into debt if the bucket holds fewer;
// refill (or the window moving on) pays the debt back. It is how reported consumption is
// merged into a bucket: the permits were already admitted somewhere. n < 0 counts as 0.
func Take(p Params, s State, now, n int64) State {
	return p.Kind.ops().take(nil, p, s, now, max(n, 0))
}

// TakeTo is Take writing the new state into dst's array when it has the capacity (see
// DecideTo); dst must not overlap s.
func TakeTo(dst State, p Params, s State, now, n int64) State {
	return p.Kind.ops().take(dst, p, s, now, max(n, 0))
}

// Refund gives n unused permits back (an unused lease); the bucket never ends up above
// full. n < 0 counts as 0.
func Refund(p Params, s State, now, n int64) State {
	return p.Kind.ops().refund(p, s, now, max(n, 0))
}

// ResetAt is the absolute time at which the bucket is full again: now for a full
// TokenBucket/GCRA, the end of the current window for FixedWindow (the next period
// boundary for Calendar), and the moment the last counted permit leaves the window for
// the sliding algorithms.
func ResetAt(p Params, s State, now int64) int64 {
	return p.Kind.ops().resetAt(p, s, now)
}

// RetryAfter is how many µs from now until cost permits fit (0: they fit now). It is
// exact: Decide admits cost at now+RetryAfter (if nothing else happens meanwhile) and
// would not one µs earlier.
//
// A cost above Capacity never fits. Then TokenBucket and GCRA answer as go-redis/redis_rate
// does (when a bucket that large would have cost permits: tat + (cost-Capacity)·T) and the
// window algorithms answer the time until the bucket is full but at least one window,
// so a client that ignores the status still backs off.
func RetryAfter(p Params, s State, now, cost int64) int64 {
	return p.Kind.ops().retryAfter(p, s, now, max(cost, 0))
}

// MaxStateLen is the largest State p's algorithm can encode: MaxStateSize for all but
// SlidingWindowLog, whose log of at most Limit+LogSlack runs takes up to 12 bytes a run.
func (p Params) MaxStateLen() int {
	return p.Kind.ops().maxStateLen(p)
}

// sized returns dst resized to n bytes when its capacity allows, else a new slice.
func sized(dst State, n int) State {
	if cap(dst) < n {
		return make(State, n)
	}
	return dst[:n]
}
