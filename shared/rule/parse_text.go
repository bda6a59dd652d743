package rule

import (
	"strings"

	"github.com/tidwall/gjson"
)

func isIDByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '-' || b == '.'
}

// validID checks [A-Za-z0-9_.-]{1,64}: ids end up in Redis keys
// ("tg:{key}:<id>:<window>"), metrics labels and headers, so ":" and spaces are out.
func validID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isIDByte(s[i]) {
			return false
		}
	}
	return true
}

func parseID(path string, v gjson.Result, what string) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if !validID(s) {
		return "", fieldError(path, "invalid "+what+" "+quoteShort(s)+": must match [A-Za-z0-9_.-]{1,"+itoa(MaxIDLen)+"}")
	}
	return s, nil
}

// isTchar reports an RFC 9110 token character (header names, methods).
func isTchar(b byte) bool {
	if b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}

// parseHeaderName returns a lower-case header name; a leading ":" is allowed for
// Envoy's pseudo-headers (":authority").
func parseHeaderName(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	name := strings.TrimPrefix(s, ":")
	ok := name != "" && len(s) <= 128
	for i := 0; ok && i < len(name); i++ {
		ok = isTchar(name[i])
	}
	if !ok {
		return "", fieldError(path, "invalid header name "+quoteShort(s))
	}
	return strings.ToLower(s), nil
}

// printable reports whether s is non-empty, visible ASCII without spaces: safe in a
// header value and a log line.
func printable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func parseToken(path string, v gjson.Result, max int) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", nil
	}
	if len(s) > max {
		return "", fieldError(path, "must be at most "+itoa(max)+" bytes, got "+itoa(len(s)))
	}
	if !printable(s) {
		return "", fieldError(path, "must be visible ASCII without spaces, got "+quoteShort(s))
	}
	return s, nil
}
