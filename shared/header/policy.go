package header

import "strconv"

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
