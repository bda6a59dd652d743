package wazerohost

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultAccessLogFormat is the access-log line envoy.yaml configures: Envoy's default
// format's first fields and the filter's decision (the filter state the Tollgate filter
// sets, "wasm.tollgate").
const DefaultAccessLogFormat = `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% "%DOWNSTREAM_REMOTE_ADDRESS%" tollgate="%FILTER_STATE(wasm.tollgate:PLAIN)%"` + "\n"

// AccessLogFormat formats AccessEntries the way Envoy's file access log formats a
// stream with a text format string, for the subset of command operators listed in
// ParseAccessLogFormat. A value that is missing prints "-", as in Envoy.
type AccessLogFormat struct {
	parts []func(b []byte, e *AccessEntry, now time.Time) []byte
}

// ParseAccessLogFormat compiles an Envoy format string. Supported operators:
// %START_TIME%, %REQ(NAME)% and %REQ(NAME?ALT)% (request headers and :method, :path,
// :authority), %PROTOCOL%, %RESPONSE_CODE%, %RESPONSE_CODE_DETAILS%,
// %DOWNSTREAM_REMOTE_ADDRESS%, %FILTER_STATE(KEY)% and %FILTER_STATE(KEY:PLAIN)%
// (the string a filter set; Envoy's PLAIN form of a Wasm property). Anything else is an
// error naming the operator.
func ParseAccessLogFormat(format string) (*AccessLogFormat, error) {
	f := &AccessLogFormat{}
	for len(format) > 0 {
		i := strings.IndexByte(format, '%')
		if i < 0 {
			lit := format
			f.parts = append(f.parts, func(b []byte, _ *AccessEntry, _ time.Time) []byte { return append(b, lit...) })
			break
		}
		if i > 0 {
			lit := format[:i]
			f.parts = append(f.parts, func(b []byte, _ *AccessEntry, _ time.Time) []byte { return append(b, lit...) })
		}
		format = format[i+1:]
		j := strings.IndexByte(format, '%')
		if j < 0 {
			return nil, fmt.Errorf("access log format: unterminated operator %q", "%"+format)
		}
		op := format[:j]
		format = format[j+1:]
		part, err := operator(op)
		if err != nil {
			return nil, err
		}
		f.parts = append(f.parts, part)
	}
	return f, nil
}

func operator(op string) (func(b []byte, e *AccessEntry, now time.Time) []byte, error) {
	name, arg, hasArg := strings.Cut(op, "(")
	if hasArg {
		if !strings.HasSuffix(arg, ")") {
			return nil, fmt.Errorf("access log format: operator %q: missing ')'", op)
		}
		arg = strings.TrimSuffix(arg, ")")
	}
	dash := func(b []byte, s string) []byte {
		if s == "" {
			return append(b, '-')
		}
		return append(b, s...)
	}
	switch {
	case name == "" && !hasArg:
		return func(b []byte, _ *AccessEntry, _ time.Time) []byte { return append(b, '%') }, nil
	case name == "START_TIME" && !hasArg:
		return func(b []byte, _ *AccessEntry, now time.Time) []byte {
			return now.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
		}, nil
	case name == "PROTOCOL" && !hasArg:
		return func(b []byte, e *AccessEntry, _ time.Time) []byte { return append(b, e.Request.protocol()...) }, nil
	case name == "RESPONSE_CODE" && !hasArg:
		return func(b []byte, e *AccessEntry, _ time.Time) []byte { return strconv.AppendInt(b, int64(e.Status), 10) }, nil
	case name == "RESPONSE_CODE_DETAILS" && !hasArg:
		return func(b []byte, e *AccessEntry, _ time.Time) []byte { return dash(b, e.Details) }, nil
	case name == "DOWNSTREAM_REMOTE_ADDRESS" && !hasArg:
		return func(b []byte, e *AccessEntry, _ time.Time) []byte { return dash(b, e.Request.RemoteAddr) }, nil
	case name == "REQ" && hasArg && arg != "":
		names := strings.Split(strings.ToLower(arg), "?")
		return func(b []byte, e *AccessEntry, _ time.Time) []byte {
			for _, n := range names {
				if v := requestField(e.Request, n); v != "" {
					return append(b, v...)
				}
			}
			return append(b, '-')
		}, nil
	case name == "FILTER_STATE" && hasArg && arg != "":
		key, form, _ := strings.Cut(arg, ":")
		if form != "" && form != "PLAIN" {
			return nil, fmt.Errorf("access log format: %%FILTER_STATE(%s)%%: only the PLAIN form is supported", arg)
		}
		return func(b []byte, e *AccessEntry, _ time.Time) []byte { return dash(b, e.FilterState[key]) }, nil
	}
	return nil, fmt.Errorf("access log format: unsupported operator %%%s%%", op)
}

// requestField is a request header by lower-case name, or a pseudo-header.
func requestField(r *Request, name string) string {
	switch name {
	case ":method":
		return r.Method
	case ":path":
		return r.Path
	case ":authority", "host":
		return r.Authority
	}
	return getPair(r.Header, name)
}

// Append formats e, finished at now, onto b.
func (f *AccessLogFormat) Append(b []byte, e *AccessEntry, now time.Time) []byte {
	for _, p := range f.parts {
		b = p(b, e, now)
	}
	return b
}
