package header

import (
	"math"
	"math/bits"
	"strconv"
)

// Window-length units for labels, largest first.
var units = [...]struct {
	us     int64
	suffix string
}{
	{86_400_000_000, "d"},
	{3_600_000_000, "h"},
	{60_000_000, "m"},
	{1_000_000, "s"},
	{1_000, "ms"},
	{1, "us"},
}

// PolicyName is the IETF policy name of one window of a rule: the rule id, '-', and
// the window length in the largest unit that divides it exactly ("search-1m",
// "search-90s", "burst-250ms"). Rules are static per config, so compute it once per
// window at config load rather than per request.
func PolicyName(ruleID string, windowUs int64) string {
	return ruleID + "-" + string(AppendWindowLabel(make([]byte, 0, 24), windowUs))
}

// AppendWindowLabel appends the label PolicyName uses for a window length ("1m").
func AppendWindowLabel(dst []byte, windowUs int64) []byte {
	if windowUs <= 0 {
		return append(dst, "0s"...)
	}
	for _, u := range units {
		if windowUs%u.us == 0 {
			dst = strconv.AppendInt(dst, windowUs/u.us, 10)
			return append(dst, u.suffix...)
		}
	}
	return dst // unreachable: the last unit divides everything
}

// WindowSeconds is a window length as the w parameter needs it: whole seconds, rounded
// up, at least 1 (the draft has no sub-second windows; rounding up never advertises a
// faster rate than the one enforced).
func WindowSeconds(windowUs int64) int64 {
	if windowUs <= 1_000_000 {
		return 1
	}
	return (windowUs-1)/1_000_000 + 1
}

// Quota is what a window advertises as its quota — x-ratelimit-limit, and q and w in
// ratelimit-policy — for a bucket that holds capacity permits and refills limit of them
// per windowUs (a token bucket or GCRA with a burst; capacity is limit otherwise).
//
// A burst above the limit is shown as the capacity over the time the bucket takes to
// refill it: limit 100 per minute with burst 120 is q=120;w=72 and x-ratelimit-limit 120.
// So x-ratelimit-remaining (at most the capacity) is never above the advertised limit, a
// client reading the policy learns both how much it may send at once and the steady
// rate (120/72 s = 100/min), and w rounded up never advertises a faster rate than the
// one enforced. A burst below the limit changes nothing: q is the limit, and what
// remains is at most the burst.
func Quota(limit, capacity, windowUs int64) (q, windowSeconds int64) {
	if capacity <= limit || limit <= 0 || windowUs <= 0 {
		return limit, WindowSeconds(windowUs)
	}
	// windowUs × capacity / limit, rounded up; saturated (a refill longer than int64 µs
	// is no window a rule can have, but a header must not wrap).
	hi, lo := bits.Mul64(uint64(windowUs), uint64(capacity))
	if hi >= uint64(limit) {
		return capacity, WindowSeconds(math.MaxInt64)
	}
	quo, rem := bits.Div64(hi, lo, uint64(limit))
	if rem != 0 {
		quo++
	}
	if quo > math.MaxInt64 {
		quo = math.MaxInt64
	}
	return capacity, WindowSeconds(int64(quo))
}

// appendSFString appends s as an RFC 9651 sf-string. An sf-string holds only printable
// ASCII, with '"' and '\' escaped; every other byte, and '%', is percent-encoded (as
// FieldValue does) so the field stays valid and unambiguous for any rule id. Rule ids
// are usually [A-Za-z0-9_.-], which pass through unchanged.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e || c == '%':
			dst = appendPercent(dst, c)
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
