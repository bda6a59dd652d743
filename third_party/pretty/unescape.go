package pretty

import (
	"unicode/utf16"
	"unicode/utf8"
)

// unquote decodes the JSON string literal s (quotes included) as encoding/json's
// Unmarshal into a string does: escapes decoded, unpaired surrogates and invalid UTF-8
// replaced by U+FFFD, nil for a malformed literal (Unmarshal leaves the string empty).
//
// Tollgate's fork: upstream parsestr called json.Unmarshal here, the package's only use
// of encoding/json. Through gjson's @pretty modifier that put encoding/json, reflect,
// fmt and os into every program importing gjson, among them Tollgate's proxy-wasm
// filter, where they cost about a megabyte of module and made Go's runtime hand
// poll_oneoff to the host.
func unquote(s []byte) []byte {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return nil
	}
	s = s[1 : len(s)-1]
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c < ' ':
			return nil
		case c == '\\':
			if i+1 >= len(s) {
				return nil
			}
			i += 2
			switch s[i-1] {
			case '"', '\\', '/':
				out = append(out, s[i-1])
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := hex4(s[i:])
				if !ok {
					return nil
				}
				i += 4
				if utf16.IsSurrogate(r) {
					// A pair makes one rune; anything else is U+FFFD, as in Unmarshal.
					r2, ok := rune(-1), false
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						r2, ok = hex4(s[i+2:])
					}
					if d := utf16.DecodeRune(r, r2); ok && d != utf8.RuneError {
						r = d
						i += 6
					} else {
						r = utf8.RuneError
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return nil
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, n := utf8.DecodeRune(s[i:])
			out = utf8.AppendRune(out, r) // RuneError for invalid UTF-8, as Unmarshal
			i += n
		}
	}
	return out
}

// hex4 decodes the four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
