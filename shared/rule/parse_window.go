package rule

import (
	"errors"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// The sync protocol carries limit, burst and window (in milliseconds) as uint32, and
// windows in whole milliseconds: these constants fail to compile if shared/algo's bounds
// ever outgrow what the wire can carry, so every window that parses can be reported.
const (
	_ uint32 = algo.MaxLimit
	_ uint32 = algo.MaxBurst
	_ uint32 = algo.MaxWindowUs / 1000
	_ uint   = -(algo.MinWindowUs % 1000) // whole milliseconds
	_ uint   = -(algo.MaxWindowUs % 1000)
)

// parseLimits reads the limit/window/burst shorthand or the windows list of o (a rule,
// a rule's tier entry or an override): exactly one of the two forms. Every window is
// checked on its own, and every field of a window, so one run reports each mistake.
func parseLimits(o *object, kind algo.Kind) ([]algo.Params, error) {
	short := o.has("limit") || o.has("window") || o.has("calendar") || o.has("burst")
	if o.has("windows") {
		if short {
			return nil, fieldError(o.at("windows"), "cannot be combined with \"limit\", \"window\", \"calendar\" or \"burst\"; put every window in \"windows\"")
		}
		elems, err := parseArray(o.at("windows"), o.get("windows"), MaxWindows)
		if err != nil {
			return nil, err
		}
		if len(elems) == 0 {
			return nil, fieldError(o.at("windows"), "must have at least one window")
		}
		var errs errList
		out := make([]algo.Params, len(elems))
		for i, e := range elems {
			// An unknown field is one mistake of the window; its known fields are
			// still checked.
			wo, err := parseObject(indexPath(o.at("windows"), i), e, "limit", "window", "calendar", "burst")
			errs.add(err)
			if wo == nil {
				continue
			}
			out[i], err = parseWindow(wo, kind, "")
			errs.add(err)
		}
		return out, errs.err()
	}
	w, err := parseWindow(o, kind, " (or \"windows\")")
	if err != nil {
		return nil, err
	}
	return []algo.Params{w}, nil
}

// parseWindow reads one window and checks it with algo.Params.Validate, so a window
// that parses is one every algorithm enforces as written. It reports every mistake of
// the window, each naming its field, in the order limit, window (or calendar), burst:
// each field is read on its own against algo's bounds (for a message in the
// configuration's own terms, "30d" rather than microseconds), and Validate, which
// names one field, runs once limit and window are both valid, for what holds between
// fields (one permit per µs at most, a burst that refills in time). The parser adds two
// checks of meaning, not of bounds: windows are whole milliseconds (what the sync
// protocol carries) and burst is refused where the algorithm ignores it.
func parseWindow(o *object, kind algo.Kind, alt string) (algo.Params, error) {
	p := algo.Params{Kind: kind}
	var errs errList
	cal := o.has("calendar") // a calendar period instead of "window" (parse_calendar.go)
	limitOK := false
	if !o.has("limit") {
		errs.add(fieldError(o.at("limit"), "required"+alt))
	} else {
		var err error
		if !kind.FixedSizeState() {
			p.Limit, err = parseIntWhy(o.at("limit"), o.get("limit"), 1, kind.MaxLimit(), " for "+AlgorithmName(kind)+" (its state grows with the limit)")
		} else {
			p.Limit, err = parseInt(o.at("limit"), o.get("limit"), 1, algo.MaxLimit)
		}
		limitOK = !errs.add(err)
	}
	windowOK := false
	switch {
	case cal:
		misplaced := calendarMisplaced(o, kind)
		errs.add(misplaced)
		c, err := parseCalendar(o.at("calendar"), o.get("calendar"), p.Limit)
		windowOK = !errs.add(err) && misplaced == nil
		if windowOK {
			p = c
		}
	case !o.has("window"):
		errs.add(fieldError(o.at("window"), "required"+alt))
	default:
		var err error
		p.WindowUs, err = parseWindowLength(o.at("window"), o.get("window"))
		windowOK = !errs.add(err)
	}
	if bv := o.get("burst"); bv.Exists() && !cal {
		b, err := parseInt(o.at("burst"), bv, 0, algo.MaxBurst)
		switch {
		case errs.add(err):
		case b != 0 && !kind.HasBurst():
			// The window algorithms ignore burst; accepting it would let an operator
			// believe a capacity is configured that nothing enforces.
			errs.add(fieldError(o.at("burst"), "only "+algorithmNames(algo.Kind.HasBurst, "and")+" use burst, the rule's algorithm is "+AlgorithmName(kind)))
		default:
			p.Burst = b
		}
	}
	if limitOK && windowOK {
		if err := p.Validate(); err != nil {
			var pe *algo.ParamError
			if errors.As(err, &pe) {
				errs.add(&FieldError{Field: o.at(pe.Field), Msg: pe.Msg, Err: err})
			} else {
				errs.add(&FieldError{Field: o.path, Msg: err.Error(), Err: err})
			}
		}
	}
	// Validate's error comes last but names the field it checks first: report in
	// field order, as Validate would meet them.
	rank := func(fe *FieldError) int {
		switch {
		case fe.Field == o.at("limit"):
			return 0
		case fe.Field == o.at("window") || strings.HasPrefix(fe.Field, o.at("calendar")):
			return 1
		case fe.Field == o.at("burst"):
			return 2
		}
		return 3
	}
	// Insertion sort, stable: a window has a handful of errors at most, and the slices
	// package's generic sort would add to the filter's module for nothing.
	l := errs.list
	for i := 1; i < len(l); i++ {
		for j := i; j > 0 && rank(l[j]) < rank(l[j-1]); j-- {
			l[j], l[j-1] = l[j-1], l[j]
		}
	}
	return p, errs.err()
}

// parseWindowLength reads a window in microseconds, between algo.MinWindowUs and
// algo.MaxWindowUs: a duration string ("1m", "500ms", "30d", "1d12h") or an integer
// number of milliseconds, whole milliseconds only: the sync protocol carries windows in
// ms, and a window the filter and the service round differently would be two different
// limits.
func parseWindowLength(path string, v gjson.Result) (int64, error) {
	switch v.Type {
	case gjson.Number:
		ms, err := parseInt(path, v, algo.MinWindowUs/1000, algo.MaxWindowUs/1000)
		return ms * 1000, err
	case gjson.String:
	default:
		return 0, typeError(path, "a duration string or integer milliseconds", v)
	}
	ns, ok := parseDuration(v.Str)
	if !ok {
		return 0, fieldError(path, "invalid duration "+quoteShort(v.Str)+" (want e.g. \"500ms\", \"1m\", \"1h30m\", \"30d\" or integer milliseconds)")
	}
	switch {
	case ns < algo.MinWindowUs*1000:
		return 0, fieldError(path, "must be >= "+formatUs(algo.MinWindowUs)+", got "+quoteShort(v.Str))
	case ns > algo.MaxWindowUs*1000:
		return 0, fieldError(path, "must be <= "+formatUs(algo.MaxWindowUs)+", got "+quoteShort(v.Str))
	case ns%1_000_000 != 0:
		return 0, fieldError(path, "must be a whole number of milliseconds, got "+quoteShort(v.Str))
	}
	return ns / 1000, nil
}

// durationUnits are the units parseDuration knows, in nanoseconds: Go's
// time.ParseDuration units plus "d" (24 h), since quotas run for days. Longer names
// first so "ms" is not read as "m".
var durationUnits = []struct {
	name string
	ns   int64
}{
	{"ns", 1}, {"us", 1e3}, {"µs", 1e3}, {"μs", 1e3}, {"ms", 1e6},
	{"s", 1e9}, {"m", 60e9}, {"h", 3600e9}, {"d", 86400e9},
}

// parseDuration reads a sequence of decimal numbers with units ("1d12h", "1.5h",
// "-1s"), as time.ParseDuration does with "d" added, into nanoseconds. A value beyond
// int64 nanoseconds (292 years) is reported as the largest int64, which every bound
// refuses as too long.
func parseDuration(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "0" {
		return 0, true
	}
	if s == "" {
		return 0, false
	}
	const maxNs = 1<<63 - 1
	var total int64
	for s != "" {
		// Integer part, then an optional fraction.
		i := 0
		var whole int64
		over := false
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			if whole > (maxNs-9)/10 {
				over = true
				continue
			}
			whole = whole*10 + int64(s[i]-'0')
		}
		digits := i
		fracStart := -1
		if i < len(s) && s[i] == '.' {
			i++
			fracStart = i
			for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			}
			digits += i - fracStart
		}
		if digits == 0 {
			return 0, false
		}
		frac := ""
		if fracStart >= 0 {
			frac = s[fracStart:i]
		}
		s = s[i:]
		unit := int64(0)
		for _, u := range durationUnits {
			if strings.HasPrefix(s, u.name) {
				unit, s = u.ns, s[len(u.name):]
				break
			}
		}
		if unit == 0 {
			return 0, false
		}
		if over || whole > maxNs/unit {
			total = maxNs
			continue
		}
		v := whole * unit
		for scale, j := unit, 0; j < len(frac) && scale > 1; j++ {
			scale /= 10
			v += int64(frac[j]-'0') * scale
		}
		if total > maxNs-v {
			total = maxNs
			continue
		}
		total += v
	}
	if neg {
		return -total, true
	}
	return total, true
}

// FormatWindow writes a window the way a rule file would ("31d", "1d12h", "1m30s",
// "1ms"), which parses back to the same window.
func FormatWindow(windowUs int64) string { return formatUs(windowUs) }

// formatUs writes a duration of whole microseconds the way a rule file would ("31d",
// "1d12h", "1m30s", "1ms"; "1500us" below a millisecond's precision).
func formatUs(us int64) string {
	if us == 0 {
		return "0s"
	}
	if us%1000 != 0 {
		return itoa(us) + "us"
	}
	var b strings.Builder
	ms := us / 1000
	if ms < 0 {
		b.WriteByte('-')
		ms = -ms
	}
	for _, u := range []struct {
		name string
		ms   int64
	}{{"d", 86_400_000}, {"h", 3_600_000}, {"m", 60_000}, {"s", 1000}, {"ms", 1}} {
		if n := ms / u.ms; n > 0 {
			b.WriteString(itoa(n))
			b.WriteString(u.name)
			ms -= n * u.ms
		}
	}
	return b.String()
}
