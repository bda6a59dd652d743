package algo

import "strconv"

// Kind names an algorithm. The zero value is TokenBucket, the default.
//
// The values are part of the formats: the wire protocol and the Redis lease script
// carry a kind as this number (ratelimit/store/scripts/lease.lua tests some by value)
// and a state's tag byte is 0x10+Kind (ENCODING.md). A new algorithm takes the next
// value; existing ones never move.
type Kind uint8

const (
	TokenBucket Kind = iota
	GCRA
	SlidingWindowLog
	SlidingWindowCounter
	FixedWindow
	// Calendar is a fixed window aligned to calendar days, ISO weeks or months at a
	// fixed UTC offset (calendar.go); its period and offset are encoded in Burst.
	Calendar
)

// kindInfo is what Tollgate knows of an algorithm: its name, its operations and the
// properties callers ask about. Every question about a kind is answered from its row
// (the methods below), never by comparing kinds by name, so a new algorithm is a new
// constant, a row here and its implementation.
type kindInfo struct {
	name string
	ops  algorithm
	// maxLimit is the largest limit (Validate, norm).
	maxLimit int64
	// burst: Burst is a capacity above the limit (0: the limit).
	burst bool
	// refills: permits come back one at a time at the steady rate Limit/Window,
	// rather than all at once when a window ends.
	refills bool
	// windowed: the count is kept per aligned window, so what was granted in one
	// window means nothing in the next.
	windowed bool
	// resetsAtBoundary: the whole count starts afresh at a window boundary of absolute
	// time (the end of the window is when everything comes back).
	resetsAtBoundary bool
	// calendarPeriods: the windows are calendar periods of varying length
	// (CalendarWindow); Burst holds the period and offset.
	calendarPeriods bool
	// fixedState: the encoded state is at most MaxStateSize bytes whatever the limit.
	fixedState bool
	// configuredAs is the algorithm a rule names to get this one (itself, or the
	// algorithm of which it is a variant).
	configuredAs Kind
}

var kinds = [...]kindInfo{
	TokenBucket: {name: "token_bucket", ops: &tatAlgo{}, maxLimit: MaxLimit,
		burst: true, refills: true, fixedState: true, configuredAs: TokenBucket},
	GCRA: {name: "gcra", ops: &tatAlgo{}, maxLimit: MaxLimit,
		burst: true, refills: true, fixedState: true, configuredAs: GCRA},
	SlidingWindowLog: {name: "sliding_window_log", ops: &logAlgo{}, maxLimit: MaxLogLimit,
		configuredAs: SlidingWindowLog},
	SlidingWindowCounter: {name: "sliding_window_counter", ops: &swcAlgo{}, maxLimit: MaxLimit,
		windowed: true, fixedState: true, configuredAs: SlidingWindowCounter},
	FixedWindow: {name: "fixed_window", ops: &fwAlgo{}, maxLimit: MaxLimit,
		windowed: true, resetsAtBoundary: true, fixedState: true, configuredAs: FixedWindow},
	// A calendar window is configured as a fixed_window with a "calendar" period.
	Calendar: {name: "calendar", ops: &calAlgo{}, maxLimit: MaxLimit,
		windowed: true, resetsAtBoundary: true, calendarPeriods: true, fixedState: true, configuredAs: FixedWindow},
}

// NumKinds is the number of algorithms: the kinds are 0 to NumKinds-1.
const NumKinds = len(kinds)

// Kinds returns every algorithm, in value order.
func Kinds() []Kind {
	out := make([]Kind, NumKinds)
	for i := range out {
		out[i] = Kind(i)
	}
	return out
}

// algorithm is one algorithm's operations on a norm of its kind: the functions of
// algo.go dispatch once, through the row, instead of each switching over the kinds.
// The implementations are pointers to empty structs with pointer receivers, so a call
// neither allocates nor goes through a wrapper that copies the arguments again. Escape
// analysis cannot see through the call, so the State arguments count as escaping: a
// caller that passed a slice of a stack array would see it moved to the heap (none
// does; states live in records and shared data).
type algorithm interface {
	decide(dst State, p Params, s State, now, cost int64) Result
	available(p Params, s State, now int64) int64
	take(dst State, p Params, s State, now, k int64) State
	refund(p Params, s State, now, k int64) State
	resetAt(p Params, s State, now int64) int64
	retryAfter(p Params, s State, now, cost int64) int64
	maxStateLen(p Params) int
}

// noKind is the row of an unknown kind: no property holds.
var noKind kindInfo

// info is k's row.
func (k Kind) info() *kindInfo {
	if int(k) < len(kinds) {
		return &kinds[k]
	}
	return &noKind
}

// opsOf is every Kind value's algorithm, from kinds: an unknown kind is run as
// TokenBucket, as norm clamps it. Indexed by the whole uint8, it needs no bounds check,
// which keeps Decide and the others small enough to inline into their callers.
var opsOf = func() (a [256]algorithm) {
	for k := range a {
		a[k] = kinds[TokenBucket].ops
		if k < len(kinds) {
			a[k] = kinds[k].ops
		}
	}
	return a
}()

// ops is k's algorithm.
func (k Kind) ops() algorithm { return opsOf[k] }

// Valid reports whether k is a known algorithm.
func (k Kind) Valid() bool { return int(k) < len(kinds) }

// String returns the name used in configuration ("token_bucket", "gcra", ...).
func (k Kind) String() string {
	if k.Valid() {
		return kinds[k].name
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// ParseKind is the inverse of Kind.String; names are matched exactly.
func ParseKind(name string) (Kind, bool) {
	for k := range kinds {
		if kinds[k].name == name {
			return Kind(k), true
		}
	}
	return 0, false
}

// MaxLimit is the largest limit of kind k that Validate accepts: MaxLogLimit where the
// state grows with the limit, MaxLimit otherwise (and for an unknown kind).
func (k Kind) MaxLimit() int64 {
	if !k.Valid() {
		return MaxLimit
	}
	return kinds[k].maxLimit
}

// HasBurst reports whether Params.Burst is a capacity for k (token_bucket, gcra); the
// other algorithms hold Limit, and a calendar keeps its period in the field.
func (k Kind) HasBurst() bool { return k.info().burst }

// Refills reports whether k gives permits back one at a time at its steady rate
// (Limit per Window) rather than all at once when a window moves on: a rate lease, a
// hold of a spent bucket until an interval's refill, or a refill-based reset estimate
// only mean something there.
func (k Kind) Refills() bool { return k.info().refills }

// CanShape reports whether a request refused under k may instead wait (a rule's
// max_delay) for its permits: only where permits come back one at a time, so the wait
// is a fraction of a window and not until its end.
func (k Kind) CanShape() bool { return k.info().refills }

// Windowed reports whether k counts per aligned window, so that a lease granted in one
// window means nothing in the next (fixed_window, sliding_window_counter, calendar).
func (k Kind) Windowed() bool { return k.info().windowed }

// ResetsAtBoundary reports whether k's whole count starts afresh at a window boundary
// of absolute time (fixed_window and calendar windows): nothing refused waits past the
// end of the current window, and consumption counted in an earlier window is not
// charged to the current one.
func (k Kind) ResetsAtBoundary() bool { return k.info().resetsAtBoundary }

// CalendarPeriods reports whether k's windows are calendar periods (days, weeks or
// months at a UTC offset, see CalendarWindow) whose lengths vary, rather than fixed
// multiples of WindowUs since the epoch.
func (k Kind) CalendarPeriods() bool { return k.info().calendarPeriods }

// FixedSizeState reports whether k's state is at most MaxStateSize bytes whatever the
// limit (all but sliding_window_log, whose exact log grows with it).
func (k Kind) FixedSizeState() bool { return k.info().fixedState }

// ConfiguredAs is the algorithm a rule names to get k: k itself, or for a variant
// configured through another algorithm's options (calendar: a fixed_window with a
// "calendar") that algorithm. An unknown kind is returned as is.
func (k Kind) ConfiguredAs() Kind {
	if !k.Valid() {
		return k
	}
	return kinds[k].configuredAs
}
