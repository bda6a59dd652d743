package rule

import (
	"errors"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// parseCalendarWindow reads a window whose length is a calendar period instead of a
// duration:
//
//	{"limit": 1000000, "calendar": {"period": "month", "utc_offset": "+05:30"}}
//
// "period" is required ("day", "week" — ISO, from Monday 00:00 — or "month");
// "utc_offset" is a fixed offset "+HH:MM" / "-HH:MM" within ±14:00, default "+00:00"
// (no time zones: a fixed offset is the same everywhere and every year). The count
// resets exactly at the period boundary, which is fixed-window counting: a calendar
// needs the rule's algorithm to be fixed_window (a token bucket or a sliding window
// has no boundary to align). "window" and "burst" do not go with it.
func parseCalendarWindow(o *object, kind algo.Kind, alt string) (algo.Params, error) {
	p := algo.Params{Kind: algo.Calendar}
	if kind != algo.FixedWindow {
		return p, fieldError(o.at("calendar"), "a calendar window counts permits per period and resets at its boundary: it needs \"algorithm\": \"fixed_window\", the rule's algorithm is "+AlgorithmName(kind))
	}
	if o.has("window") {
		return p, fieldError(o.at("window"), "cannot be combined with \"calendar\": the calendar period is the window")
	}
	if o.has("burst") {
		return p, fieldError(o.at("burst"), "only token_bucket and gcra use burst, the rule's algorithm is fixed_window")
	}
	if !o.has("limit") {
		return p, fieldError(o.at("limit"), "required"+alt)
	}
	limit, err := parseInt(o.at("limit"), o.get("limit"), 1, algo.MaxLimit)
	if err != nil {
		return p, err
	}
	co, err := parseObject(o.at("calendar"), o.get("calendar"), "period", "utc_offset")
	if err != nil {
		return p, err
	}
	if !co.has("period") {
		return p, fieldError(co.at("period"), "required (\"day\", \"week\" or \"month\")")
	}
	name, err := parseString(co.at("period"), co.get("period"))
	if err != nil {
		return p, err
	}
	per, ok := algo.ParsePeriod(name)
	if !ok {
		return p, fieldError(co.at("period"), "must be \"day\", \"week\" or \"month\", got "+quoteShort(name))
	}
	var off int64
	if ov := co.get("utc_offset"); ov.Exists() {
		s, err := parseString(co.at("utc_offset"), ov)
		if err != nil {
			return p, err
		}
		if off, ok = parseUTCOffset(s); !ok {
			return p, fieldError(co.at("utc_offset"), "must be \"+HH:MM\" or \"-HH:MM\" within ±14:00 (e.g. \"+05:30\", \"-08:00\"), got "+quoteShort(s))
		}
	}
	p = algo.CalendarParams(limit, per, off)
	if err := p.Validate(); err != nil {
		var pe *algo.ParamError
		if errors.As(err, &pe) {
			return p, &FieldError{Field: o.at(pe.Field), Msg: pe.Msg, Err: err}
		}
		return p, &FieldError{Field: o.path, Msg: err.Error(), Err: err}
	}
	return p, nil
}

// parseUTCOffset reads "+HH:MM" or "-HH:MM" (exactly that form) into minutes east of
// UTC, within ±algo.MaxOffsetMinutes.
func parseUTCOffset(s string) (int64, bool) {
	if len(s) != 6 || (s[0] != '+' && s[0] != '-') || s[3] != ':' {
		return 0, false
	}
	var d [4]int64
	for i, c := range []byte{s[1], s[2], s[4], s[5]} {
		if c < '0' || c > '9' {
			return 0, false
		}
		d[i] = int64(c - '0')
	}
	h, m := d[0]*10+d[1], d[2]*10+d[3]
	if m > 59 {
		return 0, false
	}
	off := h*60 + m
	if off > algo.MaxOffsetMinutes {
		return 0, false
	}
	if s[0] == '-' {
		off = -off
	}
	return off, true
}
