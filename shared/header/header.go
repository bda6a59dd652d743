// Package header formats what Tollgate tells a client about its rate limits: the
// response headers on every answer (legacy X-RateLimit-*, the IETF RateLimit-Policy and
// RateLimit structured fields, Retry-After) and the JSON bodies of 429, 403 and 503.
//
// A limiter that does not say when to retry turns rejected clients into a retry storm,
// so every answer carries the limit, what is left and when it resets, and every refusal
// a jittered Retry-After that is never earlier than the bucket admits.
//
// It runs per request inside the Wasm filter, so it is pure (the caller injects time
// and randomness), uses no reflection, no fmt and no encoding/json, and allocates
// little: Append builds all its values in one buffer, the body formatters append to a
// caller's slice without allocating. The IETF fields follow
// draft-ietf-httpapi-ratelimit-headers-10
// (https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/10/),
// serialized as RFC 9651 (formerly 8941) structured-field Lists.
//
// Header names are lower-case: HTTP/2 requires it, Envoy lower-cases names anyway, and
// HTTP/1 clients match them case-insensitively.
package header

import (
	"math"
	"strconv"
	"strings"
)

// Header names.
const (
	XLimit      = "x-ratelimit-limit"
	XRemaining  = "x-ratelimit-remaining"
	XReset      = "x-ratelimit-reset" // UNIX seconds
	XPolicy     = "x-ratelimit-policy"
	XRule       = "x-ratelimit-rule"   // the rule that refused a request (429)
	XShadow     = "x-ratelimit-shadow" // a shadow rule that would have refused it
	Policy      = "ratelimit-policy"
	RateLimit   = "ratelimit"
	RetryAfter  = "retry-after"
	ContentType = "content-type"
)

// Header values with a fixed meaning.
const (
	// PolicyDegraded (in XPolicy) says the limiter answered from local state only:
	// the sync service is unreachable and the numbers may be stale.
	PolicyDegraded = "degraded"
	// PolicyBypass (in XPolicy) says the caller is allow-listed and was not counted.
	PolicyBypass = "bypass"
	// RemainingUnknown is XRemaining while degraded.
	RemainingUnknown = "-1"
	// ContentTypeJSON is the content type of the bodies this package formats.
	ContentTypeJSON = "application/json"
)

// Window is one window of one enforced rule as a response shows it. The filter builds
// one per window of every rule that applied to the request (shadow rules excluded: they
// do not limit, so they must not be advertised as limits).
type Window struct {
	// Policy is the IETF policy name, rule id + "-" + window label ("search-1m");
	// PolicyName computes it (do it once per rule, at config load).
	Policy        string
	Limit         int64 // permits per window (q)
	Remaining     int64 // permits left now; negative (debt) is shown as 0
	WindowSeconds int64 // window length (w), whole seconds >= 1; see WindowSeconds
	// ResetUnix is when the bucket is full again / the window ends, UNIX seconds
	// (x-ratelimit-reset).
	ResetUnix int64
	// ResetInSeconds is the same moment as a delay from now, rounded up (the t
	// parameter). AppendRefused caps it at Retry-After.
	ResetInSeconds int64
}

// MostRestrictive returns the index of the window closest to refusing: the lowest
// Remaining, then the one that takes longest to reset (it is the one that will still
// bind after the others refill), then the lowest Limit, then the first. It returns -1
// for no windows.
func MostRestrictive(views []Window) int {
	best := -1
	for i := range views {
		if best < 0 || moreRestrictive(&views[i], &views[best]) {
			best = i
		}
	}
	return best
}

func moreRestrictive(a, b *Window) bool {
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	if a.ResetInSeconds != b.ResetInSeconds {
		return a.ResetInSeconds > b.ResetInSeconds
	}
	return a.Limit < b.Limit
}

// Append appends the rate-limit headers every answer carries:
//
//	x-ratelimit-limit:     Limit of the most restrictive window (MostRestrictive)
//	x-ratelimit-remaining: its Remaining (>= 0), or -1 when degraded
//	x-ratelimit-reset:     its ResetUnix
//	x-ratelimit-policy:    degraded (only when degraded)
//	ratelimit-policy:      every window: "search-1m";q=100;w=60, "search-1s";q=10;w=1
//	ratelimit:             the most restrictive window: "search-1m";r=50;t=30
//
// When degraded the ratelimit field is left out: its r parameter must be a real
// non-negative count, and a degraded answer does not know one (the draft lets servers
// omit the field). With no windows Append adds only the degraded markers, if degraded.
//
// All values share one allocation.
func Append(dst [][2]string, views []Window, degraded bool) [][2]string {
	return appendHeaders(dst, views, degraded, math.MaxInt64)
}

// AppendRefused appends the headers of a refusal (a 429, or a fail-closed 503): those
// of Append, retry-after (seconds, at least 1; see RetryAfterSeconds) and, when ruleID
// is not empty, x-ratelimit-rule naming the rule that refused. The ratelimit field's t
// is capped at retryAfterSeconds, because the draft (section 6) says Retry-After SHOULD
// NOT point earlier than t, and a token bucket is full again long after it admits the
// next request.
func AppendRefused(dst [][2]string, views []Window, degraded bool, retryAfterSeconds int64, ruleID string) [][2]string {
	retryAfterSeconds = max(retryAfterSeconds, 1)
	dst = appendHeaders(dst, views, degraded, retryAfterSeconds)
	dst = AppendRetryAfter(dst, retryAfterSeconds)
	if ruleID != "" {
		dst = AppendRule(dst, ruleID)
	}
	return dst
}

func appendHeaders(dst [][2]string, views []Window, degraded bool, maxT int64) [][2]string {
	m := MostRestrictive(views)
	if m < 0 {
		if degraded {
			dst = append(dst, [2]string{XRemaining, RemainingUnknown}, [2]string{XPolicy, PolicyDegraded})
		}
		return dst
	}
	w := &views[m]

	// One buffer holds every value; size it for the worst case (each policy byte
	// escaped to 3, every number 20 digits) so it is allocated exactly once.
	size := 3*20 + 3*len(w.Policy) + 2 + 2*(3+20)
	for i := range views {
		size += 3*len(views[i].Policy) + 2 + 2*(3+20) + 2
	}
	var b strings.Builder
	b.Grow(size)
	var num [20]byte
	var ends [5]int
	b.Write(strconv.AppendInt(num[:0], w.Limit, 10))
	ends[0] = b.Len()
	b.Write(strconv.AppendInt(num[:0], max(w.Remaining, 0), 10))
	ends[1] = b.Len()
	b.Write(strconv.AppendInt(num[:0], w.ResetUnix, 10))
	ends[2] = b.Len()
	for i := range views {
		if i > 0 {
			b.WriteString(", ")
		}
		v := &views[i]
		writeSFString(&b, v.Policy)
		b.WriteString(";q=")
		b.Write(strconv.AppendInt(num[:0], max(v.Limit, 0), 10))
		b.WriteString(";w=")
		b.Write(strconv.AppendInt(num[:0], max(v.WindowSeconds, 1), 10))
	}
	ends[3] = b.Len()
	if !degraded {
		writeSFString(&b, w.Policy)
		b.WriteString(";r=")
		b.Write(strconv.AppendInt(num[:0], max(w.Remaining, 0), 10))
		b.WriteString(";t=")
		b.Write(strconv.AppendInt(num[:0], min(max(w.ResetInSeconds, 0), maxT), 10))
	}
	ends[4] = b.Len()
	s := b.String()

	remaining := s[ends[0]:ends[1]]
	if degraded {
		remaining = RemainingUnknown
	}
	dst = append(dst,
		[2]string{XLimit, s[:ends[0]]},
		[2]string{XRemaining, remaining},
		[2]string{XReset, s[ends[1]:ends[2]]},
	)
	if degraded {
		dst = append(dst, [2]string{XPolicy, PolicyDegraded})
	}
	dst = append(dst, [2]string{Policy, s[ends[2]:ends[3]]})
	if !degraded {
		dst = append(dst, [2]string{RateLimit, s[ends[3]:ends[4]]})
	}
	return dst
}

// AppendBypass appends x-ratelimit-policy: bypass, for allow-listed callers.
func AppendBypass(dst [][2]string) [][2]string {
	return append(dst, [2]string{XPolicy, PolicyBypass})
}

// AppendRetryAfter appends retry-after with a delay in whole seconds (see
// RetryAfterSeconds); values below 1 are sent as 1, since a refusal that says "retry
// now" invites exactly the storm Retry-After exists to prevent.
func AppendRetryAfter(dst [][2]string, seconds int64) [][2]string {
	return append(dst, [2]string{RetryAfter, strconv.FormatInt(max(seconds, 1), 10)})
}

// AppendRule appends x-ratelimit-rule naming the rule that refused the request.
func AppendRule(dst [][2]string, ruleID string) [][2]string {
	return append(dst, [2]string{XRule, FieldValue(ruleID)})
}

// AppendShadow appends x-ratelimit-shadow naming a shadow (dry-run) rule that would
// have refused the request. Call it once per such rule.
func AppendShadow(dst [][2]string, ruleID string) [][2]string {
	return append(dst, [2]string{XShadow, FieldValue(ruleID)})
}

// FieldValue returns s made safe as a plain header value: unchanged when it is all
// visible ASCII other than '%' (the usual rule id), otherwise with every byte outside
// '!'..'~' and every '%' percent-encoded, so a hostile or odd id can neither split a
// header (CR, LF) nor be trimmed (edge spaces) or rejected by the proxy (NUL, non-ASCII).
func FieldValue(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '%' {
			var b strings.Builder
			b.Grow(3 * len(s))
			for i := 0; i < len(s); i++ {
				if c := s[i]; c <= ' ' || c >= 0x7f || c == '%' {
					writePercent(&b, c)
				} else {
					b.WriteByte(c)
				}
			}
			return b.String()
		}
	}
	return s
}

func writePercent(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}
