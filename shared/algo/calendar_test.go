package algo

import (
	"math/rand"
	"testing"
	"time"
)

// us is the instant of a wall-clock reading at UTC+offMin, in µs since the epoch.
func us(offMin int, y int, m time.Month, d, hh, mm int) int64 {
	return time.Date(y, m, d, hh, mm, 0, 0, time.FixedZone("", offMin*60)).UnixMicro()
}

func TestCalendarBoundaries(t *testing.T) {
	tests := []struct {
		name       string
		per        Period
		off        int // minutes
		now        int64
		start, end int64
	}{
		{"jan31_to_feb1", Month, 0, us(0, 2026, 1, 31, 23, 59), us(0, 2026, 1, 1, 0, 0), us(0, 2026, 2, 1, 0, 0)},
		{"feb1_starts_feb", Month, 0, us(0, 2026, 2, 1, 0, 0), us(0, 2026, 2, 1, 0, 0), us(0, 2026, 3, 1, 0, 0)},
		{"feb28_non_leap_to_mar1", Month, 0, us(0, 2026, 2, 28, 23, 59), us(0, 2026, 2, 1, 0, 0), us(0, 2026, 3, 1, 0, 0)},
		{"feb29_leap_to_mar1", Month, 0, us(0, 2028, 2, 29, 12, 0), us(0, 2028, 2, 1, 0, 0), us(0, 2028, 3, 1, 0, 0)},
		{"feb28_leap_is_not_the_end", Month, 0, us(0, 2028, 2, 28, 23, 59), us(0, 2028, 2, 1, 0, 0), us(0, 2028, 3, 1, 0, 0)},
		{"feb_century_non_leap_2100", Month, 0, us(0, 2100, 2, 28, 0, 0), us(0, 2100, 2, 1, 0, 0), us(0, 2100, 3, 1, 0, 0)},
		{"feb_400_leap_2000", Month, 0, us(0, 2000, 2, 29, 0, 0), us(0, 2000, 2, 1, 0, 0), us(0, 2000, 3, 1, 0, 0)},
		{"dec31_to_jan1", Month, 0, us(0, 2026, 12, 31, 23, 59), us(0, 2026, 12, 1, 0, 0), us(0, 2027, 1, 1, 0, 0)},
		{"month_plus_0530", Month, 330, us(330, 2026, 1, 31, 23, 59), us(330, 2026, 1, 1, 0, 0), us(330, 2026, 2, 1, 0, 0)},
		{"month_plus_0530_utc_jan31_is_local_feb1", Month, 330, us(0, 2026, 1, 31, 20, 0), us(330, 2026, 2, 1, 0, 0), us(330, 2026, 3, 1, 0, 0)},
		{"month_minus_0800_utc_jan1_is_local_dec", Month, -480, us(0, 2027, 1, 1, 5, 0), us(-480, 2026, 12, 1, 0, 0), us(-480, 2027, 1, 1, 0, 0)},
		{"day_utc", Day, 0, us(0, 2026, 3, 1, 0, 0), us(0, 2026, 3, 1, 0, 0), us(0, 2026, 3, 2, 0, 0)},
		{"day_minus_0800", Day, -480, us(-480, 2026, 2, 28, 23, 59), us(-480, 2026, 2, 28, 0, 0), us(-480, 2026, 3, 1, 0, 0)},
		{"week_monday_starts", Week, 0, us(0, 2026, 11, 23, 0, 0), us(0, 2026, 11, 23, 0, 0), us(0, 2026, 11, 30, 0, 0)},
		{"week_sunday_ends", Week, 0, us(0, 2026, 11, 29, 23, 59), us(0, 2026, 11, 23, 0, 0), us(0, 2026, 11, 30, 0, 0)},
		{"week_across_year_end", Week, 0, us(0, 2027, 1, 1, 12, 0), us(0, 2026, 12, 28, 0, 0), us(0, 2027, 1, 4, 0, 0)},
		{"week_plus_14", Week, 840, us(840, 2026, 11, 30, 0, 0), us(840, 2026, 11, 30, 0, 0), us(840, 2026, 12, 7, 0, 0)},
		{"week_before_epoch", Week, 0, us(0, 1969, 12, 31, 0, 0), us(0, 1969, 12, 29, 0, 0), us(0, 1970, 1, 5, 0, 0)},
		{"month_before_epoch", Month, -60, us(-60, 1969, 2, 10, 0, 0), us(-60, 1969, 2, 1, 0, 0), us(-60, 1969, 3, 1, 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := CalendarParams(10, tt.per, int64(tt.off))
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			_, s, e := CalendarWindow(p, tt.now)
			if s != tt.start || e != tt.end {
				t.Fatalf("window at %s = [%s, %s), want [%s, %s)", tm(tt.now), tm(s), tm(e), tm(tt.start), tm(tt.end))
			}
			if got := ResetAt(p, nil, tt.now); got != tt.end {
				t.Errorf("ResetAt = %s, want %s", tm(got), tm(tt.end))
			}
			// Spend the period just before its end: refused until exactly the boundary.
			st := Take(p, nil, tt.end-1, 10)
			r := Decide(p, st, tt.end-1, 1)
			if r.Allowed || r.ResetUs != tt.end || r.RetryAfterUs != 1 {
				t.Errorf("1 µs before the boundary: %+v, want refused, reset at the boundary, retry in 1 µs", r)
			}
			if r := Decide(p, st, tt.end, 1); !r.Allowed || r.Remaining != 9 {
				t.Errorf("at the boundary: %+v, want admitted with 9 remaining", r)
			}
			if got := RetryAfter(p, st, tt.end-1, 11); got != tt.end-tt.start {
				t.Errorf("RetryAfter(cost above limit) = %d, want one period %d", got, tt.end-tt.start)
			}
		})
	}
}

func tm(v int64) string { return time.UnixMicro(v).UTC().Format(time.RFC3339Nano) }

// TestCalendarMatchesTimePackage checks the integer day counting against Go's time
// package at random instants over four centuries and every period, at random offsets.
func TestCalendarMatchesTimePackage(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	lo, hi := us(0, 1900, 1, 1, 0, 0), us(0, 2111, 12, 31, 0, 0)
	for i := 0; i < 200_000; i++ {
		now := lo + rng.Int63n(hi-lo)
		off := rng.Int63n(2*MaxOffsetMinutes+1) - MaxOffsetMinutes
		per := Period(1 + rng.Intn(3))
		_, s, e := calWindow(per, off*60_000_000, now)
		loc := time.UnixMicro(now).In(time.FixedZone("", int(off)*60))
		y, m, d := loc.Date()
		var ws, we time.Time
		switch per {
		case Day:
			ws = time.Date(y, m, d, 0, 0, 0, 0, loc.Location())
			we = ws.AddDate(0, 0, 1)
		case Week:
			back := (int(loc.Weekday()) + 6) % 7 // days since Monday
			ws = time.Date(y, m, d-back, 0, 0, 0, 0, loc.Location())
			we = ws.AddDate(0, 0, 7)
		case Month:
			ws = time.Date(y, m, 1, 0, 0, 0, 0, loc.Location())
			we = ws.AddDate(0, 1, 0)
		}
		if s != ws.UnixMicro() || e != we.UnixMicro() {
			t.Fatalf("%s at %s, %s: [%s, %s), want [%s, %s)", per, FormatOffset(off), tm(now), tm(s), tm(e), ws, we)
		}
		if e-s > PeriodUs(per) || e-s < shortestUs(per) {
			t.Fatalf("%s: length %d outside [%d, %d]", per, e-s, shortestUs(per), PeriodUs(per))
		}
	}
}

// TestCalendarIndexConsecutive: the lease epochs count on period indexes that grow by
// exactly one from one period to the next.
func TestCalendarIndexConsecutive(t *testing.T) {
	for per := Day; per <= Month; per++ {
		for _, off := range []int64{-840, -480, 0, 330, 840} {
			p := CalendarParams(1, per, off)
			now := us(0, 1999, 6, 15, 0, 0)
			i0, _, e := CalendarWindow(p, now)
			for n := 0; n < 400; n++ {
				i, s, e2 := CalendarWindow(p, e)
				if i != i0+1 || s != e {
					t.Fatalf("%s %s: after index %d ending %s comes %d starting %s", per, FormatOffset(off), i0, tm(e), i, tm(s))
				}
				i0, e = i, e2
			}
		}
	}
}

func TestCalendarParamsRoundTrip(t *testing.T) {
	for per := Day; per <= Month; per++ {
		for _, off := range []int64{-MaxOffsetMinutes, -1, 0, 1, 330, MaxOffsetMinutes} {
			p := CalendarParams(5, per, off)
			gp, goff, ok := p.Calendar()
			if !ok || gp != per || goff != off {
				t.Errorf("CalendarParams(%s, %d).Calendar() = %s, %d, %v", per, off, gp, goff, ok)
			}
			if name, ok := ParsePeriod(per.String()); !ok || name != per {
				t.Errorf("ParsePeriod(%q) = %v, %v", per.String(), name, ok)
			}
		}
	}
	for _, tt := range []struct {
		min  int64
		want string
	}{{0, "+00:00"}, {330, "+05:30"}, {-480, "-08:00"}, {-30, "-00:30"}, {840, "+14:00"}} {
		if got := FormatOffset(tt.min); got != tt.want {
			t.Errorf("FormatOffset(%d) = %q, want %q", tt.min, got, tt.want)
		}
	}
}

// TestCalendarState: a state written under another period or offset (its start is not a
// period start) is fresh; one period ahead is kept (the clock stepped back at the
// boundary); a fixed_window state is not read as a calendar one.
func TestCalendarState(t *testing.T) {
	month := CalendarParams(10, Month, 0)
	feb := us(0, 2026, 2, 1, 0, 0)
	spent := Take(month, nil, feb+5, 10)
	tests := []struct {
		name  string
		p     Params
		s     State
		now   int64
		avail int64
	}{
		{"same_period", month, spent, feb + 10, 0},
		{"next_period_fresh", month, spent, us(0, 2026, 3, 1, 0, 0), 10},
		{"clock_stepped_back_keeps_next_period", month, spent, feb - 1, 0},
		{"offset_changed_is_fresh", CalendarParams(10, Month, 60), spent, feb + 10, 10},
		{"day_start_read_as_month_is_fresh", month, Take(CalendarParams(10, Day, 0), nil, feb+DayUs, 10), feb + DayUs + 1, 10},
		{"fixed_window_state_is_fresh", month, Take(Params{Kind: FixedWindow, Limit: 10, WindowUs: DayUs}, nil, feb, 10), feb + 1, 10},
		{"two_periods_ahead_is_fresh", month, spent, us(0, 2025, 12, 31, 0, 0), 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Available(tt.p, tt.s, tt.now); got != tt.avail {
				t.Errorf("Available = %d, want %d", got, tt.avail)
			}
		})
	}
}

// TestCalendarAllocations: a calendar decision allocates nothing (the filter's hot path).
func TestCalendarAllocations(t *testing.T) {
	p := CalendarParams(100, Month, 330)
	s := Take(p, nil, 10, 100)
	buf := make(State, 0, MaxStateSize)
	if n := testing.AllocsPerRun(100, func() {
		Available(p, s, 20)
		RetryAfter(p, s, 20, 1)
		ResetAt(p, s, 20)
		Decide(p, s, 20, 1)
		DecideTo(buf, p, nil, 20, 1)
		TakeTo(buf, p, nil, 20, 1)
	}); n != 0 {
		t.Errorf("%v allocations per call set, want 0", n)
	}
}
