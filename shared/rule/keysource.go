package rule

import "strings"

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

// transform applies StripPrefix and Lower. Stripping never allocates; lower-casing
// allocates only for a value that has upper-case letters.
func (k *KeySource) transform(v string) string {
	if p := k.StripPrefix; p != "" && len(v) >= len(p) && strings.EqualFold(v[:len(p)], p) {
		v = strings.TrimLeft(v[len(p):], " ")
	}
	if k.Lower {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c >= 'A' && c <= 'Z' {
				return strings.ToLower(v)
			}
		}
	}
	return v
}
