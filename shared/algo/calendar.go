package algo

// Calendar counts permits per calendar period — a day, an ISO week (Monday 00:00 to
// Monday 00:00) or a month — in UTC or at a fixed UTC offset, and resets the count
// exactly at the period boundary: a fixed window whose boundaries are those of a
// calendar rather than multiples of a length since the epoch. Months are 28 to 31 days
// long, so no fixed window can stand for one.
//
// The period and the offset travel in Params.Burst, which the window algorithms do not
// use, so the sync protocol needs no new field (old gateways never send the kind; an
// old service refuses it by name):
//
//	Burst = period·10000 + offset_minutes + 1440
//
// with period 1 (day), 2 (week) or 3 (month) and offset_minutes in [-840, 840] (UTC-14:00
// to UTC+14:00, the offsets in use). A month at UTC is 31440, a day at UTC-08:00 is
// 10960. WindowUs is the longest period length (1, 7 or 31 days): the bound that lease
// epochs, report bounds and headers that need one length work with. CalendarParams
// builds such Params; Validate refuses any other encoding.
//
// The arithmetic is integer day counting (Howard Hinnant's days_from_civil and its
// inverse), which the Lua twin (ratelimit/store/scripts/algo_common.lua) repeats step
// for step: no time zone database, no time library, the same answer in both.

// Period is a calendar period of a Calendar window.
type Period uint8

const (
	Day   Period = 1
	Week  Period = 2
	Month Period = 3
)

var periodNames = [...]string{Day: "day", Week: "week", Month: "month"}

// String returns the name used in configuration ("day", "week", "month").
func (p Period) String() string {
	if p >= Day && p <= Month {
		return periodNames[p]
	}
	return "period(" + itoa(int64(p)) + ")"
}

// ParsePeriod is the inverse of Period.String.
func ParsePeriod(name string) (Period, bool) {
	for p := Day; p <= Month; p++ {
		if periodNames[p] == name {
			return p, true
		}
	}
	return 0, false
}

const (
	// DayUs is one day in µs.
	DayUs = 86_400_000_000
	// MaxOffsetMinutes bounds a calendar's UTC offset: ±14:00, the range of offsets in
	// use.
	MaxOffsetMinutes = 14 * 60
	calOffsetBias    = 1440 // added to the offset so the encoded field is positive
	calPeriodScale   = 10000
)

// PeriodUs is the longest length of period p (the WindowUs of its Params): 1, 7 or 31
// days.
func PeriodUs(p Period) int64 {
	switch p {
	case Day:
		return DayUs
	case Week:
		return 7 * DayUs
	default:
		return 31 * DayUs
	}
}

// shortestUs is the shortest length of period p: a month can be 28 days.
func shortestUs(p Period) int64 {
	if p == Month {
		return 28 * DayUs
	}
	return PeriodUs(p)
}

// CalendarParams returns the Params of a Calendar window of limit permits per period,
// aligned to the period's boundaries at UTC+offsetMinutes.
func CalendarParams(limit int64, period Period, offsetMinutes int64) Params {
	return Params{Kind: Calendar, Limit: limit, WindowUs: PeriodUs(period),
		Burst: int64(period)*calPeriodScale + offsetMinutes + calOffsetBias}
}

// Calendar returns the period and UTC offset (minutes) of Calendar params; ok is false
// for other kinds and for an encoding Validate refuses.
func (p Params) Calendar() (period Period, offsetMinutes int64, ok bool) {
	if !p.Kind.CalendarPeriods() {
		return 0, 0, false
	}
	q, r := floorDiv(p.Burst, calPeriodScale), p.Burst-floorDiv(p.Burst, calPeriodScale)*calPeriodScale
	off := r - calOffsetBias
	if q < int64(Day) || q > int64(Month) || off < -MaxOffsetMinutes || off > MaxOffsetMinutes {
		return 0, 0, false
	}
	return Period(q), off, true
}

// FormatOffset writes a UTC offset in minutes as "+05:30" / "-08:00".
func FormatOffset(minutes int64) string {
	sign := byte('+')
	if minutes < 0 {
		sign, minutes = '-', -minutes
	}
	h, m := minutes/60, minutes%60
	return string([]byte{sign, byte('0' + h/10), byte('0' + h%10), ':', byte('0' + m/10), byte('0' + m%10)})
}

// calNorm decodes (clamping, like every bound) the period and the offset (µs) of a
// Calendar norm from the encoded field. The field is first clamped to the encodings of
// a day at -14:00 and a month at +14:00 (so the Lua twin, algo__cal_norm, works on a
// small exact integer whatever it was sent), then the period to [Day, Month] and the
// offset to ±14:00.
func calNorm(code int64) (Period, int64) {
	c := clamp(code, calPeriodScale+calOffsetBias-MaxOffsetMinutes, 3*calPeriodScale+calOffsetBias+MaxOffsetMinutes)
	q := c / calPeriodScale
	off := clamp(c-q*calPeriodScale-calOffsetBias, -MaxOffsetMinutes, MaxOffsetMinutes)
	return Period(q), off * 60_000_000
}

// daysFromCivil is the number of days from 1970-01-01 to y-m-d of the proleptic
// Gregorian calendar (Hinnant's days_from_civil). Within an era every value is a small
// non-negative integer, computed in uint32: a division by a constant is far shorter in
// WebAssembly on 32 bits than on signed 64.
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := uint32(y - era*400) // [0, 399]
	mp := uint32(m + 9)        // March = 0 ... February = 11
	if m > 2 {
		mp = uint32(m - 3)
	}
	doy := (153*mp+2)/5 + uint32(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + int64(doe) - 719468
}

// civilFromDays is the inverse of daysFromCivil (Hinnant's civil_from_days).
func civilFromDays(z int64) (y, m, d int64) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := uint32(z - era*146097) // [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int64(doy - (153*mp+2)/5 + 1)
	m = int64(mp + 3)
	if mp >= 10 {
		m = int64(mp - 9)
	}
	y = int64(yoe) + era*400
	if m <= 2 {
		y++
	}
	return y, m, d
}

// calWindow is the calendar period containing now: its index (days, weeks or months
// since 1970-01 at the offset, increasing by one from one period to the next), its
// start and its end (µs). The local time is now + offset; a week starts on Monday, and
// 1970-01-01 was a Thursday (day 0, so Monday is day -3).
func calWindow(per Period, off, now int64) (idx, start, end int64) {
	day := floorDiv(now+off, DayUs)
	var s, e int64 // in days
	switch per {
	case Day:
		idx, s, e = day, day, day+1
	case Week:
		idx = floorDiv(day+3, 7)
		s = idx*7 - 3
		e = s + 7
	default:
		y, m, d := civilFromDays(day)
		idx = y*12 + m - 1
		s = day - d + 1
		if m == 12 {
			e = daysFromCivil(y+1, 1, 1)
		} else {
			e = daysFromCivil(y, m+1, 1)
		}
	}
	return idx, s*DayUs - off, e*DayUs - off
}

// CalendarWindow is the calendar period of Calendar params p containing now: its index
// (consecutive periods have consecutive indexes), start and end in µs. For any other
// kind it is the aligned window of p's length containing now (index now/W).
func CalendarWindow(p Params, now int64) (index, start, end int64) {
	n := p.norm()
	if !n.kind.CalendarPeriods() {
		i := floorDiv(now, n.win)
		return i, i * n.win, (i + 1) * n.win
	}
	return calWindow(n.per, n.off, now)
}

// ShortestWindowUs is the shortest a window of p can be: a Calendar month's is 28
// days, any other window's is WindowUs. Bounds on what a rule can admit over a span of
// time count windows of this length.
func (p Params) ShortestWindowUs() int64 {
	if !p.Kind.CalendarPeriods() {
		return p.WindowUs
	}
	return shortestUs(p.norm().per)
}

// calAlgo is Calendar's algorithm (kind.go).
type calAlgo struct{}

func (*calAlgo) available(p Params, s State, now int64) int64 {
	n := p.norm()
	return n.lim - calLoad(n, s, now).count
}

func (*calAlgo) resetAt(p Params, s State, now int64) int64 {
	n := p.norm()
	return calLoad(n, s, now).end
}

func (*calAlgo) retryAfter(p Params, s State, now, cost int64) int64 {
	n := p.norm()
	return calRetryAfter(n, calLoad(n, s, now), now, cost)
}

func (*calAlgo) maxStateLen(Params) int { return MaxStateSize }

// The Calendar state is fixed_window's layout with its own tag (0x15): the start of
// the current period and the permits taken in it (ENCODING.md).
type calState struct {
	start, end, count int64
	moved             bool
}

// calLoad decodes s and brings it to now. A start that is not a period start (the
// period or the offset changed) or lies beyond the end of the current period is
// malformed; one period ahead is kept (a clock stepping back at a boundary).
func calLoad(n norm, s State, now int64) calState {
	_, cur, end := calWindow(n.per, n.off, now)
	fresh := calState{start: cur, end: end, moved: true}
	if len(s) != fwLen || s[0] != stateTag(n.kind) {
		return fresh
	}
	// The only period starts in [cur, end] are cur and end (the next period).
	st := int64(le.Uint64(s[1:]))
	if !validTime(st) {
		return fresh
	}
	switch st {
	case cur:
		return calState{start: st, end: end, count: int64(le.Uint32(s[9:]))}
	case end:
		_, _, next := calWindow(n.per, n.off, end)
		return calState{start: st, end: next, count: int64(le.Uint32(s[9:]))}
	}
	return fresh
}

func calEncode(dst State, st calState) State {
	return fwEncode(dst, Calendar, fwState{start: st.start, count: st.count})
}

func (*calAlgo) take(dst State, p Params, s State, now, k int64) State {
	n := p.norm()
	st := calLoad(n, s, now)
	st.count = min(st.count+min(k, MaxCount), MaxCount)
	return calEncode(dst, st)
}

func (*calAlgo) refund(p Params, s State, now, k int64) State {
	n := p.norm()
	st := calLoad(n, s, now)
	st.count = max(st.count-min(k, MaxCount), 0)
	return calEncode(nil, st)
}

// calRetryAfter is fixed_window's: the end of the period, and for a cost above the
// limit at least one period (its length, as it is this period's).
func calRetryAfter(n norm, st calState, now, cost int64) int64 {
	switch {
	case cost <= n.lim-st.count:
		return 0
	case cost <= n.lim:
		return st.end - now
	default:
		return max(st.end-now, st.end-st.start)
	}
}

func (*calAlgo) decide(dst State, p Params, s State, now, cost int64) Result {
	n := p.norm()
	st := calLoad(n, s, now)
	avail := n.lim - st.count
	if cost > avail {
		r := Result{
			State:        s,
			Remaining:    max(avail, 0),
			ResetUs:      st.end,
			RetryAfterUs: calRetryAfter(n, st, now, cost),
		}
		if st.moved {
			r.State = calEncode(dst, st)
		}
		return r
	}
	st.count += cost
	return Result{
		Allowed:   true,
		State:     calEncode(dst, st),
		Remaining: avail - cost,
		ResetUs:   st.end,
	}
}
