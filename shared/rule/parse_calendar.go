package rule

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// A window may be a calendar period instead of a duration:
//
//	{"limit": 1000000, "calendar": {"period": "month", "utc_offset": "+05:30"}}
//
// "period" is required ("day", "week" — ISO, from Monday 00:00 — or "month");
// "utc_offset" is a fixed offset "+HH:MM" / "-HH:MM" within ±14:00, default "+00:00"
// (no time zones: a fixed offset is the same everywhere and every year). The count
// resets exactly at the period boundary, which is fixed-window counting: a calendar
// needs the rule's algorithm to be fixed_window (a token bucket or a sliding window
// has no boundary to align). "window" and "burst" do not go with it. parseWindow reads
// the limit and checks the result with algo.Params.Validate.

// calendarMisplaced reports every reason a "calendar" has no meaning where it is: the
// rule's algorithm, and a "window" or "burst" beside it.
func calendarMisplaced(o *object, kind algo.Kind) error {
	var errs errList
	if kind != algo.Calendar.ConfiguredAs() {
		errs.add(fieldError(o.at("calendar"), "a calendar window counts permits per period and resets at its boundary: it needs \"algorithm\": \""+AlgorithmName(algo.Calendar)+"\", the rule's algorithm is "+AlgorithmName(kind)))
	}
	if o.has("window") {
		errs.add(fieldError(o.at("window"), "cannot be combined with \"calendar\": the calendar period is the window"))
	}
	if o.has("burst") {
		errs.add(fieldError(o.at("burst"), "only "+algorithmNames(algo.Kind.HasBurst, "and")+" use burst, not a calendar window"))
	}
	return errs.err()
}

// parseCalendar reads the "calendar" object of a window of limit permits, reporting
// every mistake in it.
func parseCalendar(path string, v gjson.Result, limit int64) (algo.Params, error) {
	p := algo.Params{Kind: algo.Calendar, Limit: limit}
	co, err := parseObject(path, v, "period", "utc_offset")
	var errs errList
	errs.add(err)
	if co == nil {
		return p, errs.err()
	}
	var per algo.Period
	if !co.has("period") {
		errs.add(fieldError(co.at("period"), "required (\"day\", \"week\" or \"month\")"))
	} else if name, err := parseString(co.at("period"), co.get("period")); !errs.add(err) {
		var ok bool
		if per, ok = algo.ParsePeriod(name); !ok {
			errs.add(fieldError(co.at("period"), "must be \"day\", \"week\" or \"month\", got "+quoteShort(name)))
		}
	}
	var off int64
	if ov := co.get("utc_offset"); ov.Exists() {
		if s, err := parseString(co.at("utc_offset"), ov); !errs.add(err) {
			var ok bool
			if off, ok = parseUTCOffset(s); !ok {
				errs.add(fieldError(co.at("utc_offset"), "must be \"+HH:MM\" or \"-HH:MM\" within ±14:00 (e.g. \"+05:30\", \"-08:00\"), got "+quoteShort(s)))
			}
		}
	}
	if err := errs.err(); err != nil {
		return p, err
	}
	return algo.CalendarParams(limit, per, off), nil
}

// parseUTCOffset reads "+HH:MM" or "-HH:MM" (exactly that form) into minutes east of
// UTC, within ±algo.MaxOffsetMinutes.
func parseUTCOffset(s string) (int64, bool) {
	if len(s) != 6 || (s[0] != '+' && s[0] != '-') || s[3] != ':' {
		return 0, false
	}
	var off int64
	for i, c := range []byte{s[1], s[2], s[4], s[5]} {
		if c < '0' || c > '9' || i == 2 && c > '5' {
			return 0, false
		}
		off = off*10 + int64(c-'0')
	}
	off = off/100*60 + off%100 // HHMM to minutes
	if off > algo.MaxOffsetMinutes {
		return 0, false
	}
	if s[0] == '-' {
		off = -off
	}
	return off, true
}
