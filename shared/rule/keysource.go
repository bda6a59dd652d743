package rule

import (
	"strings"
	"unsafe"
)

// maxPropertyLen bounds a property value taken as a key; longer ones are shortened like
// every key (see KeySource.Extract), this only refuses absurd ones outright.
const maxPropertyLen = 4096

// propertyValue reads a proxy property as a key. Envoy returns a string value (a JWT
// claim jwt_authn put in dynamic metadata, a filter-state string) as its raw bytes, and
// other values binary-encoded: numbers as 8-byte doubles or integers, booleans as one
// byte, structs and lists as serialised pairs. Only text is a key: a value with control
// bytes yields none (so the key source's fallback applies) rather than a key made of
// binary.
func propertyValue(req *Request, path []string) string {
	if req.Property == nil || len(path) == 0 {
		return ""
	}
	v, ok := req.Property(path)
	if !ok || len(v) > maxPropertyLen {
		return ""
	}
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] == 0x7f {
			return ""
		}
	}
	return strings.TrimSpace(v)
}

// transform applies StripPrefix and Lower. Stripping never allocates; lower-casing a
// value with upper-case letters writes into req.KeyBuf, or allocates without one. Both
// are ASCII byte loops: the strings package's Unicode-aware versions would cost the
// module tens of kilobytes for nothing a header or claim value needs.
func (k *KeySource) transform(req *Request, v string) string {
	if p := k.StripPrefix; p != "" && len(v) >= len(p) {
		i := 0
		for i < len(p) && lower(v[i]) == lower(p[i]) {
			i++
		}
		if i == len(p) {
			for i < len(v) && v[i] == ' ' {
				i++
			}
			v = v[i:]
		}
	}
	if !k.Lower {
		return v
	}
	i := 0
	for i < len(v) && !(v[i] >= 'A' && v[i] <= 'Z') {
		i++
	}
	if i == len(v) {
		return v
	}
	var buf []byte
	if req.KeyBuf != nil {
		buf = *req.KeyBuf
	}
	start := len(buf)
	for j := 0; j < len(v); j++ {
		buf = append(buf, lower(v[j]))
	}
	if req.KeyBuf == nil {
		return string(buf)
	}
	*req.KeyBuf = buf
	return unsafe.String(&buf[start], len(v))
}
