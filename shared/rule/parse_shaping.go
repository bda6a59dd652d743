package rule

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// MaxDelayUs bounds max_delay: a request held longer than a minute is better told to
// come back (Retry-After) than kept open by the proxy.
const MaxDelayUs = 60_000_000

// parseMaxDelay reads a rule's max_delay: a duration ("500ms", "2s") or integer
// milliseconds, 1 ms to 1 minute. Only token_bucket and gcra rules can delay: their state
// can hold a permit taken ahead of time (debt the refill repays), a window's count cannot
// hold one of the next window.
func parseMaxDelay(o *object, r *Rule, algoOK bool) error {
	v := o.get("max_delay")
	if !v.Exists() {
		return nil
	}
	path := o.at("max_delay")
	var us int64
	switch v.Type {
	case gjson.Number:
		ms, err := parseInt(path, v, 1, MaxDelayUs/1000)
		if err != nil {
			return err
		}
		us = ms * 1000
	case gjson.String:
		ns, ok := parseDuration(v.Str)
		switch {
		case !ok:
			return fieldError(path, "invalid duration "+quoteShort(v.Str)+" (want e.g. \"500ms\", \"2s\" or integer milliseconds)")
		case ns < 1_000_000:
			return fieldError(path, "must be >= 1ms, got "+quoteShort(v.Str))
		case ns > MaxDelayUs*1000:
			return fieldError(path, "must be <= 1m0s, got "+quoteShort(v.Str))
		}
		us = ns / 1000
	default:
		return typeError(path, "a duration string or integer milliseconds", v)
	}
	switch {
	case algoOK && !r.Algo.CanShape():
		return fieldError(path, "only "+algorithmNames(algo.Kind.CanShape, "and")+" can delay requests, the rule's algorithm is "+AlgorithmName(r.Algo))
	case r.Strict:
		return fieldError(path, "cannot be combined with \"strict\"")
	}
	r.MaxDelayUs = us
	return nil
}
