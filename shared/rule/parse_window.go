package rule

import (
	"fmt"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// parseDuration reads a Go duration string ("1m", "500ms") or an integer number of
// milliseconds, whole milliseconds only: the sync protocol carries windows in ms, and
// a window the filter and the service round differently would be two different limits.
func parseDuration(path string, v gjson.Result, lo, hi time.Duration) (time.Duration, error) {
	var d time.Duration
	switch v.Type {
	case gjson.Number:
		ms, err := parseInt(path, v, lo.Milliseconds(), hi.Milliseconds())
		if err != nil {
			return 0, err
		}
		return time.Duration(ms) * time.Millisecond, nil
	case gjson.String:
		var err error
		d, err = time.ParseDuration(v.Str)
		if err != nil {
			return 0, &FieldError{Field: path, Msg: fmt.Sprintf("invalid duration %s (want e.g. \"1s\", \"1m\", \"500ms\" or integer milliseconds)", quoteShort(v.Str)), Err: err}
		}
	default:
		return 0, typeError(path, "a duration string or integer milliseconds", v)
	}
	if d < lo {
		return 0, fieldErrorf(path, "must be >= %s, got %s", lo, quoteShort(v.Str))
	}
	if d > hi {
		return 0, fieldErrorf(path, "must be <= %s, got %s", hi, quoteShort(v.Str))
	}
	if d%time.Millisecond != 0 {
		return 0, fieldErrorf(path, "must be a whole number of milliseconds, got %s", quoteShort(v.Str))
	}
	return d, nil
}

// parseLimits reads the limit/window/burst shorthand or the windows list of o (a rule,
// a rule's tier entry or an override): exactly one of the two forms.
func parseLimits(o *object, kind algo.Kind) ([]algo.Params, error) {
	short := o.has("limit") || o.has("window") || o.has("burst")
	if o.has("windows") {
		if short {
			return nil, fieldErrorf(o.at("windows"), "cannot be combined with \"limit\", \"window\" or \"burst\"; put every window in \"windows\"")
		}
		elems, err := parseArray(o.at("windows"), o.get("windows"), MaxWindows)
		if err != nil {
			return nil, err
		}
		if len(elems) == 0 {
			return nil, fieldErrorf(o.at("windows"), "must have at least one window")
		}
		out := make([]algo.Params, len(elems))
		for i, e := range elems {
			wo, err := parseObject(indexPath(o.at("windows"), i), e, "limit", "window", "burst")
			if err != nil {
				return nil, err
			}
			if out[i], err = parseWindow(wo, kind, ""); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	w, err := parseWindow(o, kind, " (or \"windows\")")
	if err != nil {
		return nil, err
	}
	return []algo.Params{w}, nil
}

func parseWindow(o *object, kind algo.Kind, alt string) (algo.Params, error) {
	p := algo.Params{Kind: kind}
	if !o.has("limit") {
		return p, fieldErrorf(o.at("limit"), "required%s", alt)
	}
	if !o.has("window") {
		return p, fieldErrorf(o.at("window"), "required%s", alt)
	}
	var err error
	if p.Limit, err = parseInt(o.at("limit"), o.get("limit"), 1, MaxLimit); err != nil {
		return p, err
	}
	if kind == algo.SlidingWindowLog && p.Limit > MaxLogLimit {
		return p, fieldErrorf(o.at("limit"), "must be <= %d for sliding_window_log (its state grows with the limit), got %d", MaxLogLimit, p.Limit)
	}
	d, err := parseDuration(o.at("window"), o.get("window"), MinWindow, MaxWindow)
	if err != nil {
		return p, err
	}
	p.WindowUs = d.Microseconds()
	if bv := o.get("burst"); bv.Exists() {
		if p.Burst, err = parseInt(o.at("burst"), bv, 0, MaxLimit); err != nil {
			return p, err
		}
		// The window algorithms ignore burst; accepting it would let an operator believe
		// a capacity is configured that nothing enforces.
		if p.Burst != 0 && kind != algo.TokenBucket && kind != algo.GCRA {
			return p, fieldErrorf(o.at("burst"), "only token_bucket and gcra use burst, the rule's algorithm is %s", AlgorithmName(kind))
		}
	}
	return p, nil
}
