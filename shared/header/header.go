// Package header formats what Tollgate tells a client about its rate limits in the
// response headers of every answer: legacy X-RateLimit-*, the IETF RateLimit-Policy and
// RateLimit structured fields, Retry-After. The body and gRPC status of a refusal are
// package refusal's.
//
// A limiter that does not say when to retry turns rejected clients into a retry storm,
// so every answer carries the limit, what is left and when it resets, and every refusal
// a jittered Retry-After that is never earlier than the bucket admits.
//
// It runs per request inside the Wasm filter, so it is pure (the caller injects time
// and randomness), uses no reflection, no fmt and no encoding/json, and allocates
// little: Append builds all its values in one buffer. The IETF fields follow
// draft-ietf-httpapi-ratelimit-headers-10
// (https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/10/),
// serialized as RFC 9651 (formerly 8941) structured-field Lists.
//
// Header names are lower-case: HTTP/2 requires it, Envoy lower-cases names anyway, and
// HTTP/1 clients match them case-insensitively.
package header

import (
	"strconv"
	"unsafe"
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
	// ContentTypeJSON is the content type of the refusal bodies (package refusal).
	ContentTypeJSON = "application/json"
)

// Window is one window of one enforced rule as a response shows it. The filter builds
// one per window of every rule that applied to the request (shadow rules excluded: they
// do not limit, so they must not be advertised as limits).
type Window struct {
	// Policy is the IETF policy name, rule id + "-" + window label ("search-1m");
	// PolicyName computes it (do it once per rule, at config load).
	Policy string
	// Fixed, when set, is Policy, Limit and WindowSeconds formatted already
	// (NewFixed), so the headers copy them instead of formatting them per request.
	Fixed         *Fixed
	Limit         int64 // the advertised quota (q, x-ratelimit-limit): see Quota
	Remaining     int64 // permits left now; negative (debt) is shown as 0
	WindowSeconds int64 // the quota's window (w), whole seconds >= 1; see Quota, WindowSeconds
	// ResetUnix is when the bucket is full again / the window ends, UNIX seconds
	// (x-ratelimit-reset).
	ResetUnix int64
	// ResetInSeconds is the same moment as a delay from now, rounded up (the t
	// parameter on an answer without Retry-After).
	ResetInSeconds int64
	// Refused marks the window that refused the request: a refusal's headers describe
	// it, whatever the others hold (see MostRestrictive).
	Refused bool
}

// MostRestrictive returns the index of the window closest to refusing: the one marked
// Refused, else the lowest Remaining, then the one that takes longest to reset (it is
// the one that will still bind after the others refill), then the lowest Limit, then
// the first. It returns -1 for no windows.
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
	if a.Refused != b.Refused {
		return a.Refused
	}
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
// The values share one string; a filter formatting every request's headers uses a
// Builder, which formats the same headers without allocating.
func Append(dst [][2]string, views []Window, degraded bool) [][2]string {
	var b Builder
	b.Limits(views, degraded)
	return b.appendOwned(dst)
}

// AppendRefused appends the headers of a refusal (a 429, or a fail-closed 503): those
// of Append, retry-after (seconds, at least 1; see RetryAfterSeconds) and, when ruleID
// is not empty, x-ratelimit-rule naming the rule that refused. The headers describe the
// window marked Refused (else the most restrictive). The ratelimit field's t is
// Retry-After's value: the draft (section 6, Server Behavior) says that when a response
// carries both, t SHOULD reference the same point in time as Retry-After, which takes
// precedence. On an answer without Retry-After, t is the window's reset (when it is
// full again, or its window ends), the moment x-ratelimit-reset names. A refusal's
// x-ratelimit-reset still names the window's reset: a token bucket is full again long
// after it admits the next request.
func AppendRefused(dst [][2]string, views []Window, degraded bool, retryAfterSeconds int64, ruleID string) [][2]string {
	var b Builder
	b.Refused(views, degraded, retryAfterSeconds, ruleID)
	return b.appendOwned(dst)
}

// Builder formats a response's rate-limit headers into buffers it keeps, so that a
// filter formatting the headers of every request allocates nothing once the buffers
// have grown. The values Pairs returns alias those buffers: they are valid until the
// next Reset, long enough for host calls that copy them (a proxy copies header values
// when they are added or sent in a local reply).
type Builder struct {
	buf   []byte
	spans []span
	pairs [][2]string
}

// span is one header: its value is fixed (a constant or a caller's string) or
// buf[from:to].
type span struct {
	name, fixed string
	from, to    int
}

// Reset forgets the headers built so far; values returned by Pairs before become
// invalid.
func (b *Builder) Reset() {
	b.buf, b.spans = b.buf[:0], b.spans[:0]
}

// Pairs returns the headers built since the last Reset, in order. The slice and the
// values are valid until the next Reset.
func (b *Builder) Pairs() [][2]string {
	b.pairs = b.pairs[:0]
	for _, s := range b.spans {
		v := s.fixed
		if s.to > s.from {
			v = unsafe.String(&b.buf[s.from], s.to-s.from)
		}
		b.pairs = append(b.pairs, [2]string{s.name, v})
	}
	return b.pairs
}

// appendOwned appends the headers to dst with values copied into one new string.
func (b *Builder) appendOwned(dst [][2]string) [][2]string {
	all := string(b.buf)
	for _, s := range b.spans {
		v := s.fixed
		if s.to > s.from {
			v = all[s.from:s.to]
		}
		dst = append(dst, [2]string{s.name, v})
	}
	return dst
}

func (b *Builder) fixed(name, value string) {
	b.spans = append(b.spans, span{name: name, fixed: value})
}

// open starts a header whose value is appended to buf; close ends it.
func (b *Builder) open(name string) {
	b.spans = append(b.spans, span{name: name, from: len(b.buf)})
}

func (b *Builder) close() {
	s := &b.spans[len(b.spans)-1]
	s.to = len(b.buf)
	if s.to == s.from {
		s.fixed = "" // an empty value (cannot alias an empty range)
	}
}

func (b *Builder) number(name string, v int64) {
	b.open(name)
	b.buf = strconv.AppendInt(b.buf, v, 10)
	b.close()
}

// Limits adds the headers of Append.
func (b *Builder) Limits(views []Window, degraded bool) {
	b.limits(views, degraded, -1)
}

// Refused adds the headers of AppendRefused.
func (b *Builder) Refused(views []Window, degraded bool, retryAfterSeconds int64, ruleID string) {
	retryAfterSeconds = max(retryAfterSeconds, 1)
	b.limits(views, degraded, retryAfterSeconds)
	b.RetryAfter(retryAfterSeconds)
	if ruleID != "" {
		b.Rule(XRule, ruleID)
	}
}

// Add adds a header of the caller's own; value must stay valid as long as Pairs'.
func (b *Builder) Add(name, value string) { b.fixed(name, value) }

// Bypass adds x-ratelimit-policy: bypass, for allow-listed callers.
func (b *Builder) Bypass() { b.fixed(XPolicy, PolicyBypass) }

// RetryAfter adds retry-after (see AppendRetryAfter).
func (b *Builder) RetryAfter(seconds int64) { b.number(RetryAfter, max(seconds, 1)) }

// Rule adds header name (XRule or XShadow) naming a rule, made safe as FieldValue does.
func (b *Builder) Rule(name, ruleID string) {
	if fieldSafe(ruleID) {
		b.fixed(name, ruleID)
		return
	}
	b.open(name)
	b.buf = appendFieldValue(b.buf, ruleID)
	b.close()
}

// limits adds the headers every answer carries; retryAfter is a refusal's Retry-After
// in seconds (-1: not a refusal), which the ratelimit field's t then gives.
func (b *Builder) limits(views []Window, degraded bool, retryAfter int64) {
	m := MostRestrictive(views)
	if m < 0 {
		if degraded {
			b.fixed(XRemaining, RemainingUnknown)
			b.fixed(XPolicy, PolicyDegraded)
		}
		return
	}
	w := &views[m]
	if w.Fixed != nil {
		b.fixed(XLimit, w.Fixed.limit)
	} else {
		b.number(XLimit, w.Limit)
	}
	if degraded {
		b.fixed(XRemaining, RemainingUnknown)
	} else {
		b.number(XRemaining, max(w.Remaining, 0))
	}
	b.number(XReset, w.ResetUnix)
	if degraded {
		b.fixed(XPolicy, PolicyDegraded)
	}
	if len(views) == 1 && w.Fixed != nil {
		b.fixed(Policy, w.Fixed.item)
	} else {
		b.open(Policy)
		for i := range views {
			if i > 0 {
				b.buf = append(b.buf, ", "...)
			}
			b.buf = views[i].appendItem(b.buf)
		}
		b.close()
	}
	if !degraded {
		b.open(RateLimit)
		if w.Fixed != nil {
			b.buf = append(b.buf, w.Fixed.policy...)
		} else {
			b.buf = appendSFString(b.buf, w.Policy)
		}
		b.buf = append(b.buf, ";r="...)
		b.buf = strconv.AppendInt(b.buf, max(w.Remaining, 0), 10)
		b.buf = append(b.buf, ";t="...)
		t := max(w.ResetInSeconds, 0)
		if retryAfter >= 0 {
			t = retryAfter
		}
		b.buf = strconv.AppendInt(b.buf, t, 10)
		b.close()
	}
}

// Fixed is the part of a window's headers that does not change between requests —
// its policy name as an sf-string, its RateLimit-Policy list member and its limit —
// formatted once, when the rules load (NewFixed).
type Fixed struct {
	policy string // "search-1m"
	item   string // "search-1m";q=100;w=60
	limit  string // 100
}

// NewFixed formats the fixed part of the headers of a window with this policy name,
// limit and window length in seconds (see Window).
func NewFixed(policy string, limit, windowSeconds int64) *Fixed {
	w := Window{Policy: policy, Limit: limit, WindowSeconds: windowSeconds}
	return &Fixed{
		policy: string(appendSFString(nil, policy)),
		item:   string(w.appendItem(nil)),
		limit:  strconv.FormatInt(limit, 10),
	}
}

// appendItem appends the window's RateLimit-Policy list member.
func (v *Window) appendItem(dst []byte) []byte {
	if v.Fixed != nil {
		return append(dst, v.Fixed.item...)
	}
	dst = appendSFString(dst, v.Policy)
	dst = append(dst, ";q="...)
	dst = strconv.AppendInt(dst, max(v.Limit, 0), 10)
	dst = append(dst, ";w="...)
	return strconv.AppendInt(dst, max(v.WindowSeconds, 1), 10)
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
	if fieldSafe(s) {
		return s
	}
	return string(appendFieldValue(make([]byte, 0, 3*len(s)), s))
}

func fieldSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '%' {
			return false
		}
	}
	return true
}

func appendFieldValue(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '%' {
			dst = appendPercent(dst, c)
		} else {
			dst = append(dst, c)
		}
	}
	return dst
}

func appendPercent(dst []byte, c byte) []byte {
	const hex = "0123456789ABCDEF"
	return append(dst, '%', hex[c>>4], hex[c&15])
}
