package algo

import (
	"errors"
	"math/rand"
	"testing"
)

const (
	second = int64(1_000_000)
	minute = 60 * second
	hour   = 60 * minute
)

// allKinds are the algorithms whose Params are a limit per window length; the property
// tests add Calendar (whose Params come from CalendarParams).
var allKinds = []Kind{TokenBucket, GCRA, SlidingWindowLog, SlidingWindowCounter, FixedWindow}

func TestKindNames(t *testing.T) {
	tests := []struct {
		kind Kind
		name string
	}{
		{TokenBucket, "token_bucket"},
		{GCRA, "gcra"},
		{SlidingWindowLog, "sliding_window_log"},
		{SlidingWindowCounter, "sliding_window_counter"},
		{FixedWindow, "fixed_window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.kind.String(); got != tt.name {
				t.Errorf("String() = %q, want %q", got, tt.name)
			}
			k, ok := ParseKind(tt.name)
			if !ok || k != tt.kind {
				t.Errorf("ParseKind(%q) = %v, %v", tt.name, k, ok)
			}
		})
	}
	for _, bad := range []string{"", "Token_Bucket", "token-bucket", "leaky_bucket", "gcra "} {
		if k, ok := ParseKind(bad); ok {
			t.Errorf("ParseKind(%q) = %v, want not ok", bad, k)
		}
	}
	if got := Kind(9).String(); got != "kind(9)" {
		t.Errorf("Kind(9).String() = %q", got)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		p    Params
		// field is the ParamError's Field, "" for valid params.
		field string
	}{
		{"default_token_bucket", Params{Limit: 100, WindowUs: minute}, ""},
		{"gcra_with_burst", Params{Kind: GCRA, Limit: 10, WindowUs: second, Burst: 50}, ""},
		{"million_per_second", Params{Kind: FixedWindow, Limit: 1_000_000, WindowUs: second}, ""},
		{"max_limit_per_second", Params{Kind: FixedWindow, Limit: MaxLimit, WindowUs: second}, "limit"},
		{"max_limit_at_one_per_us", Params{Kind: GCRA, Limit: MaxLimit, WindowUs: MaxLimit}, ""},
		{"max_limit_per_day", Params{Kind: SlidingWindowCounter, Limit: MaxLimit, WindowUs: 24 * hour}, ""},
		{"max_limit_per_month", Params{Kind: FixedWindow, Limit: MaxLimit, WindowUs: MaxWindowUs}, ""},
		{"max_bucket_per_month", Params{Kind: TokenBucket, Limit: MaxLimit, WindowUs: MaxWindowUs, Burst: MaxBurst}, ""},
		{"five_million_per_day", Params{Kind: TokenBucket, Limit: 5_000_000, WindowUs: 24 * hour}, ""},
		{"max_log_limit", Params{Kind: SlidingWindowLog, Limit: MaxLogLimit, WindowUs: MaxWindowUs}, ""},
		{"log_limit_too_large", Params{Kind: SlidingWindowLog, Limit: MaxLogLimit + 1, WindowUs: MaxWindowUs}, "limit"},
		{"zero_limit", Params{Limit: 0, WindowUs: minute}, "limit"},
		{"negative_limit", Params{Limit: -1, WindowUs: minute}, "limit"},
		{"limit_too_large", Params{Limit: MaxLimit + 1, WindowUs: hour}, "limit"},
		{"window_too_short", Params{Limit: 1, WindowUs: 999}, "window"},
		{"window_too_long", Params{Limit: 1, WindowUs: MaxWindowUs + 1}, "window"},
		{"more_than_one_permit_per_us", Params{Limit: 5000, WindowUs: 4000}, "limit"},
		{"negative_burst", Params{Limit: 1, WindowUs: second, Burst: -1}, "burst"},
		{"burst_too_large", Params{Limit: 1, WindowUs: second, Burst: MaxBurst + 1}, "burst"},
		{"burst_refill_too_slow", Params{Limit: 1, WindowUs: MaxWindowUs, Burst: 300}, "burst"},
		{"burst_refill_at_bound", Params{Limit: 1, WindowUs: MaxWindowUs, Burst: MaxRefillUs / MaxWindowUs}, ""},
		{"burst_ignored_by_windows", Params{Kind: FixedWindow, Limit: 1, WindowUs: MaxWindowUs, Burst: 10_000}, ""},
		{"unknown_kind", Params{Kind: Calendar + 1, Limit: 1, WindowUs: second}, "algorithm"},
		{"calendar_month_utc", CalendarParams(MaxLimit, Month, 0), ""},
		{"calendar_week_minus_8", CalendarParams(1, Week, -8*60), ""},
		{"calendar_day_plus_14", CalendarParams(100, Day, MaxOffsetMinutes), ""},
		{"calendar_bad_period", Params{Kind: Calendar, Limit: 1, WindowUs: DayUs, Burst: 41440}, "calendar"},
		{"calendar_bad_offset", Params{Kind: Calendar, Limit: 1, WindowUs: DayUs, Burst: 10000 + 1440 + 841}, "calendar"},
		{"calendar_no_encoding", Params{Kind: Calendar, Limit: 1, WindowUs: DayUs}, "calendar"},
		{"calendar_window_not_period", Params{Kind: Calendar, Limit: 1, WindowUs: 31 * DayUs, Burst: 11440}, "window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if (err == nil) != (tt.field == "") {
				t.Fatalf("Validate() = %v, want field %q", err, tt.field)
			}
			if err == nil {
				if n := tt.p.norm(); n != literal(tt.p) {
					t.Errorf("valid params %+v are changed by clamping: %+v", tt.p, n)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tt.field || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v: want a ParamError on %q wrapping ErrInvalid", err, tt.field)
			}
		})
	}
}

// literal is what p means as written, before any clamping.
func literal(p Params) norm {
	c := p.Limit
	if (p.Kind == TokenBucket || p.Kind == GCRA) && p.Burst > 0 {
		c = p.Burst
	}
	n := norm{kind: p.Kind, lim: p.Limit, win: p.WindowUs, capa: c}
	if per, off, ok := p.Calendar(); ok {
		n.per, n.off = per, off*60_000_000
	}
	return n
}

// TestValidateMatchesNorm: on parameters drawn at and around every bound, Validate
// accepts exactly the parameters the functions use unchanged (norm clamps nothing), so
// a rule that passes is enforced as written and one that would be clamped is refused.
func TestValidateMatchesNorm(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	near := func(bound int64) int64 { return bound + rng.Int63n(3) - 1 }
	pick := func(vals ...int64) int64 { return vals[rng.Intn(len(vals))] }
	for i := range 200_000 {
		k := Kind(rng.Intn(NumKinds))
		p := Params{Kind: k}
		p.Limit = pick(near(1), near(MaxLimit), near(MaxLogLimit), 1+rng.Int63n(MaxLimit+10), near(1_000_000))
		p.WindowUs = pick(near(MinWindowUs), near(MaxWindowUs), near(p.Limit), MinWindowUs+rng.Int63n(MaxWindowUs), near(24*hour))
		p.Burst = pick(0, near(MaxBurst), rng.Int63n(MaxBurst+2), near(p.Limit))
		if p.WindowUs > 0 && p.Limit > 0 {
			// Near the refill bound: the largest capacity that refills within MaxRefillUs.
			p.Burst = pick(p.Burst, near(mulDiv(MaxRefillUs, p.Limit, p.WindowUs)))
		}
		valid := p.Validate() == nil
		unchanged := p.norm() == literal(p)
		if valid && !unchanged {
			t.Fatalf("case %d: valid %+v is clamped to %+v", i, p, p.norm())
		}
		if !valid && unchanged && p.Burst >= 0 && p.Burst <= MaxBurst {
			t.Fatalf("case %d: %+v refused (%v) though nothing is clamped", i, p, p.Validate())
		}
	}
}

func TestCapacity(t *testing.T) {
	tests := []struct {
		name string
		p    Params
		want int64
	}{
		{"token_bucket_default", Params{Limit: 100, WindowUs: minute}, 100},
		{"token_bucket_burst", Params{Limit: 100, WindowUs: minute, Burst: 20}, 20},
		{"gcra_burst", Params{Kind: GCRA, Limit: 100, WindowUs: minute, Burst: 500}, 500},
		{"fixed_window_ignores_burst", Params{Kind: FixedWindow, Limit: 100, WindowUs: minute, Burst: 500}, 100},
		{"log_ignores_burst", Params{Kind: SlidingWindowLog, Limit: 7, WindowUs: minute, Burst: 500}, 7},
		{"clamped_refill", Params{Limit: 1, WindowUs: MaxWindowUs, Burst: MaxBurst}, MaxRefillUs / MaxWindowUs},
		{"clamped_limit", Params{Kind: FixedWindow, Limit: 0, WindowUs: 0}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Capacity(); got != tt.want {
				t.Errorf("Capacity() = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestTradingBot is DESIGN scenario 1 for every algorithm: 500 requests in one second
// against 100/min admit the 100 of the burst (plus, for the buckets, the one permit that
// refills within that second), and every rejection says when to come back.
func TestTradingBot(t *testing.T) {
	const start = 1_700_000_000_000_000 // a real Unix time in µs, aligned to the minute
	for _, k := range allKinds {
		t.Run(k.String(), func(t *testing.T) {
			p := Params{Kind: k, Limit: 100, WindowUs: minute}
			var s State
			admitted := 0
			for i := range int64(500) {
				now := start + i*2000
				r := Decide(p, s, now, 1)
				s = r.State
				if r.Allowed {
					admitted++
					if r.RetryAfterUs != 0 {
						t.Fatalf("request %d allowed with retry-after %d", i, r.RetryAfterUs)
					}
					continue
				}
				if r.RetryAfterUs <= 0 || r.Remaining != 0 {
					t.Fatalf("request %d rejected with retry-after %d remaining %d", i, r.RetryAfterUs, r.Remaining)
				}
			}
			want := 100
			if k == TokenBucket || k == GCRA {
				want = 101 // one permit refills every 600 ms
			}
			if admitted != want {
				t.Fatalf("admitted %d of 500, want %d", admitted, want)
			}
		})
	}
}

func TestTokenBucketRefill(t *testing.T) {
	p := Params{Limit: 3, WindowUs: second} // T = 333,333⅓ µs: not a whole number of µs
	var s State
	for range 3 {
		r := Decide(p, s, 0, 1)
		if !r.Allowed {
			t.Fatal("fresh bucket rejected")
		}
		s = r.State
	}
	tests := []struct {
		name  string
		now   int64
		avail int64
	}{
		{"empty", 0, 0},
		{"just_before_one_permit", 333_333, 0},
		{"one_permit", 333_334, 1},
		{"just_before_two_permits", 666_666, 1},
		{"two_permits", 666_667, 2},
		{"full", second, 3},
		{"never_above_full", hour, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Available(p, s, tt.now); got != tt.avail {
				t.Errorf("Available at %d = %d, want %d", tt.now, got, tt.avail)
			}
		})
	}
	if got := RetryAfter(p, s, 0, 2); got != 666_667 {
		t.Errorf("RetryAfter(2) = %d, want 666667", got)
	}
	if got := ResetAt(p, s, 0); got != second {
		t.Errorf("ResetAt = %d, want %d", got, second)
	}
	// A thousand single permits a third of a second apart never drift.
	for i := range int64(1000) {
		now := second + i*second/3 + 1
		r := Decide(p, s, now, 1)
		if !r.Allowed {
			t.Fatalf("steady request %d at the exact rate rejected", i)
		}
		s = r.State
	}
}

// TestFixedWindowBoundaryBurst documents the fixed window's known weakness: Limit at the
// end of one window and Limit at the start of the next admit 2×Limit within 2 µs.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	p := Params{Kind: FixedWindow, Limit: 100, WindowUs: minute}
	var s State
	admitted := 0
	for _, now := range []int64{minute - 1, minute} {
		for range 150 {
			r := Decide(p, s, now, 1)
			s = r.State
			if r.Allowed {
				admitted++
			}
		}
	}
	if admitted != 200 {
		t.Fatalf("admitted %d across the boundary, want 2×100", admitted)
	}
	// The sliding window log admits no more than Limit across the same boundary.
	p.Kind = SlidingWindowLog
	s = nil
	admitted = 0
	for _, now := range []int64{minute - 1, minute} {
		for range 150 {
			r := Decide(p, s, now, 1)
			s = r.State
			if r.Allowed {
				admitted++
			}
		}
	}
	if admitted != 100 {
		t.Fatalf("sliding log admitted %d across the boundary, want 100", admitted)
	}
}

func TestFixedWindowAlignment(t *testing.T) {
	p := Params{Kind: FixedWindow, Limit: 1, WindowUs: minute}
	tests := []struct {
		name  string
		now   int64
		reset int64
	}{
		{"epoch", 0, minute},
		{"inside", minute + 5, 2 * minute},
		{"last_us", 2*minute - 1, 2 * minute},
		{"before_epoch", -1, 0},
		{"before_epoch_window_start", -minute, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Decide(p, nil, tt.now, 1)
			if !r.Allowed || r.ResetUs != tt.reset {
				t.Fatalf("Decide at %d = %+v, want allowed with reset %d", tt.now, r, tt.reset)
			}
			if got := RetryAfter(p, r.State, tt.now, 1); got != tt.reset-tt.now {
				t.Errorf("RetryAfter = %d, want %d", got, tt.reset-tt.now)
			}
		})
	}
}

func TestDebt(t *testing.T) {
	for _, k := range allKinds {
		t.Run(k.String(), func(t *testing.T) {
			p := Params{Kind: k, Limit: 10, WindowUs: second}
			s := Take(p, nil, 0, 25)
			if got := Available(p, s, 0); got != -15 {
				t.Fatalf("Available after taking 25 of 10 = %d, want -15", got)
			}
			r := Decide(p, s, 0, 1)
			if r.Allowed || r.Remaining != 0 || r.RetryAfterUs <= 0 {
				t.Fatalf("Decide in debt = %+v", r)
			}
			// Debt is repaid: the bucket is full again within three windows.
			if got := Available(p, s, 3*second); got != 10 {
				t.Fatalf("Available three windows later = %d, want 10", got)
			}
		})
	}
}

func TestCostAboveCapacity(t *testing.T) {
	for _, k := range allKinds {
		t.Run(k.String(), func(t *testing.T) {
			p := Params{Kind: k, Limit: 10, WindowUs: second}
			r := Decide(p, nil, 0, 11)
			if r.Allowed {
				t.Fatal("cost above capacity admitted")
			}
			if r.RetryAfterUs <= 0 || r.Remaining != 10 {
				t.Fatalf("Decide(11) on a full bucket = %+v, want a positive retry and 10 remaining", r)
			}
		})
	}
	// GCRA answers as redis_rate: when a larger bucket would have had the permits.
	p := Params{Kind: GCRA, Limit: 10, WindowUs: second}
	if got := RetryAfter(p, nil, 0, 12); got != 200_000 {
		t.Errorf("GCRA RetryAfter(12) on a full bucket of 10 = %d, want 200000", got)
	}
}

func TestStateKindMismatchIsFresh(t *testing.T) {
	for _, from := range allKinds {
		for _, to := range allKinds {
			if from == to {
				continue
			}
			t.Run(from.String()+"_to_"+to.String(), func(t *testing.T) {
				s := Take(Params{Kind: from, Limit: 10, WindowUs: second}, nil, 0, 10)
				if got := Available(Params{Kind: to, Limit: 10, WindowUs: second}, s, 0); got != 10 {
					t.Errorf("state of %v read as %v: Available = %d, want fresh 10", from, to, got)
				}
			})
		}
	}
}

// randParams returns valid Params of kind k, biased toward small limits so that
// sequences exercise empty, full and in-between buckets.
func randParams(rng *rand.Rand, k Kind) Params {
	limits := []int64{1, 2, 3, 7, 10, 64, 100, 999, 1000, 12_345}
	windows := []int64{MinWindowUs, 1_001, 7_919, 100_000, second, 3 * second, minute, hour, MaxWindowUs}
	if k == Calendar {
		offsets := []int64{0, 330, -480, MaxOffsetMinutes, -MaxOffsetMinutes}
		return CalendarParams(limits[rng.Intn(len(limits))], Period(1+rng.Intn(3)), offsets[rng.Intn(len(offsets))])
	}
	for {
		p := Params{Kind: k, Limit: limits[rng.Intn(len(limits))], WindowUs: windows[rng.Intn(len(windows))]}
		if rng.Intn(4) == 0 {
			p.WindowUs = MinWindowUs + rng.Int63n(10*second)
		}
		if (k == TokenBucket || k == GCRA) && rng.Intn(2) == 0 {
			p.Burst = 1 + rng.Int63n(3*p.Limit)
		}
		if p.Validate() == nil {
			return p
		}
	}
}

// randStep is a time step mixing "same µs", short, rate-scale, window-scale and long gaps.
func randStep(rng *rand.Rand, p Params) int64 {
	switch rng.Intn(8) {
	case 0:
		return 0
	case 1:
		return rng.Int63n(3)
	case 2, 3:
		return rng.Int63n(2*p.WindowUs/p.Limit + 1)
	case 4, 5:
		return rng.Int63n(p.WindowUs/4 + 1)
	case 6:
		return rng.Int63n(2*p.WindowUs + 1)
	default:
		return rng.Int63n(10 * p.WindowUs)
	}
}

func randCost(rng *rand.Rand, p Params) int64 {
	c := p.Capacity()
	switch rng.Intn(6) {
	case 0:
		return 0
	case 1:
		return 1 + rng.Int63n(c+2)
	default:
		return 1 + rng.Int63n(min(c, 3))
	}
}
