// Package refusal formats how Tollgate answers a request it refuses, beyond the
// headers (package header): the JSON body of a 429, 403, 401 or 503 with its error
// code, and for a gRPC request the gRPC status and grpc-message that replace the HTTP
// status (a gRPC client never sees the HTTP one).
//
// It runs per refused request inside the Wasm filter, so like package header it is
// pure, uses no reflection, no fmt and no encoding/json, and the Append* formatters
// append to a caller's slice without allocating.
package refusal

import (
	"strconv"
	"unicode/utf8"
)

// Error codes of the JSON bodies.
const (
	CodeRateLimited = "RATE_LIMIT_EXCEEDED"      // 429
	CodeForbidden   = "FORBIDDEN"                // 403, deny list
	CodeUnavailable = "RATE_LIMITER_UNAVAILABLE" // 503, fail-closed rule while degraded
)

// Exceeded describes a 429 for its body: the window that refused the request.
type Exceeded struct {
	Limit             int64
	WindowSeconds     int64
	RetryAfterSeconds int64  // the value sent in Retry-After
	ResetUnix         int64  // when the window is full again, UNIX seconds
	Rule              string // rule id
	// Per, when set, names the window in the message instead of its length: a calendar
	// window's period ("month": "... requests per month exceeded").
	Per string
	// PenaltyLevel and PenaltySeconds describe a progressive-penalty cooldown; the
	// body carries them only when one applies (either is > 0).
	PenaltyLevel   int64
	PenaltySeconds int64
}

// AppendBody429 appends the 429 body:
//
//	{"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 100 requests per 60
//	seconds exceeded","details":{"limit":100,"window_seconds":60,"retry_after_seconds":36,
//	"reset_at":"2021-12-20T12:01:00Z","rule":"search"}}}
//
// with "penalty_level" and "penalty_seconds" added to details while a penalty applies.
func AppendBody429(dst []byte, e *Exceeded) []byte {
	dst = append(dst, `{"error":{"code":"`+CodeRateLimited+`","message":"Rate limit of `...)
	dst = strconv.AppendInt(dst, e.Limit, 10)
	if e.Limit == 1 {
		dst = append(dst, " request per "...)
	} else {
		dst = append(dst, " requests per "...)
	}
	switch {
	case e.Per != "":
		dst = append(dst, e.Per...)
	case e.WindowSeconds == 1:
		dst = append(dst, "second"...)
	default:
		dst = strconv.AppendInt(dst, e.WindowSeconds, 10)
		dst = append(dst, " seconds"...)
	}
	dst = append(dst, ` exceeded","details":{"limit":`...)
	dst = strconv.AppendInt(dst, e.Limit, 10)
	dst = append(dst, `,"window_seconds":`...)
	dst = strconv.AppendInt(dst, e.WindowSeconds, 10)
	dst = append(dst, `,"retry_after_seconds":`...)
	dst = strconv.AppendInt(dst, e.RetryAfterSeconds, 10)
	dst = append(dst, `,"reset_at":"`...)
	dst = AppendRFC3339(dst, e.ResetUnix)
	dst = append(dst, `","rule":`...)
	dst = appendJSONString(dst, e.Rule)
	if e.PenaltyLevel > 0 || e.PenaltySeconds > 0 {
		dst = append(dst, `,"penalty_level":`...)
		dst = strconv.AppendInt(dst, e.PenaltyLevel, 10)
		dst = append(dst, `,"penalty_seconds":`...)
		dst = strconv.AppendInt(dst, e.PenaltySeconds, 10)
	}
	return append(dst, "}}}"...)
}

// Body429 returns the 429 body in a new slice.
func Body429(e *Exceeded) []byte {
	return AppendBody429(make([]byte, 0, 256+len(e.Rule)), e)
}

// AppendBody403 appends the deny-list body:
//
//	{"error":{"code":"FORBIDDEN","message":"API key is not allowed","details":{"matched":"sk_revoked_*"}}}
//
// matched is the deny-list entry (a glob or CIDR from the config), never the caller's
// key, which is a secret. byAddress says the entry matched the client address, not the
// key, and changes the message to "Client address is not allowed".
func AppendBody403(dst []byte, matched string, byAddress bool) []byte {
	dst = append(dst, `{"error":{"code":"`+CodeForbidden+`","message":"`...)
	if byAddress {
		dst = append(dst, "Client address is not allowed"...)
	} else {
		dst = append(dst, "API key is not allowed"...)
	}
	dst = append(dst, `","details":{"matched":`...)
	dst = appendJSONString(dst, matched)
	return append(dst, "}}}"...)
}

// Body403 returns the 403 body in a new slice.
func Body403(matched string, byAddress bool) []byte {
	return AppendBody403(make([]byte, 0, 128+len(matched)), matched, byAddress)
}

// AppendBody503 appends the body of a fail-closed refusal while the limiter is degraded:
//
//	{"error":{"code":"RATE_LIMITER_UNAVAILABLE","message":"Rate limiter is temporarily
//	unavailable","details":{"retry_after_seconds":5,"rule":"payments"}}}
func AppendBody503(dst []byte, retryAfterSeconds int64, rule string) []byte {
	dst = append(dst, `{"error":{"code":"`+CodeUnavailable+
		`","message":"Rate limiter is temporarily unavailable","details":{"retry_after_seconds":`...)
	dst = strconv.AppendInt(dst, retryAfterSeconds, 10)
	dst = append(dst, `,"rule":`...)
	dst = appendJSONString(dst, rule)
	return append(dst, "}}}"...)
}

// Body503 returns the 503 body in a new slice.
func Body503(retryAfterSeconds int64, rule string) []byte {
	return AppendBody503(make([]byte, 0, 160+len(rule)), retryAfterSeconds, rule)
}

// appendJSONString appends s as a JSON string: '"', '\' and control characters are
// escaped, invalid UTF-8 becomes U+FFFD (one per bad byte), and U+2028/U+2029 are
// escaped so the body is also safe inside JavaScript.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&15])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendRFC3339 appends UNIX time sec as an RFC 3339 UTC timestamp
// ("2021-12-20T12:01:00Z") without the time package's formatting machinery. Values
// outside 1970-01-01T00:00:00Z .. 9999-12-31T23:59:59Z are clamped to that range, which
// keeps the year at four digits.
func AppendRFC3339(dst []byte, sec int64) []byte {
	const maxSec = 253402300799 // 9999-12-31T23:59:59Z
	sec = min(max(sec, 0), maxSec)
	days, rem := sec/86400, sec%86400
	y, m, d := civilFromDays(days)
	dst = append4(dst, y)
	dst = append(dst, '-')
	dst = append2(dst, m)
	dst = append(dst, '-')
	dst = append2(dst, d)
	dst = append(dst, 'T')
	dst = append2(dst, rem/3600)
	dst = append(dst, ':')
	dst = append2(dst, rem/60%60)
	dst = append(dst, ':')
	dst = append2(dst, rem%60)
	return append(dst, 'Z')
}

// civilFromDays converts days since 1970-01-01 to a proleptic Gregorian date
// (Howard Hinnant's days_from_civil inverse, valid here for days >= 0).
func civilFromDays(z int64) (year, month, day int64) {
	z += 719468
	era := z / 146097
	doe := z - era*146097                                  // [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // [0, 399]
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // [0, 365]
	mp := (5*doy + 2) / 153                                // [0, 11], March-based
	day = doy - (153*mp+2)/5 + 1
	month = mp + 3
	if month > 12 {
		month -= 12
	}
	year = yoe + era*400
	if month <= 2 {
		year++
	}
	return year, month, day
}

func append2(dst []byte, v int64) []byte {
	return append(dst, byte('0'+v/10), byte('0'+v%10))
}

func append4(dst []byte, v int64) []byte {
	return append(dst, byte('0'+v/1000), byte('0'+v/100%10), byte('0'+v/10%10), byte('0'+v%10))
}
