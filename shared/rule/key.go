package rule

import (
	"net/netip"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// maxTokenLen bounds the bearer token read for a JWT claim; real tokens are a few
// hundred bytes, and Envoy's default header limit is 60 KiB.
const maxTokenLen = 16 << 10

// Extract returns the caller key k yields for req, or "" when the request does not
// carry one (then Fallback, if any, is tried). Keys longer than MaxKeyLen are
// shortened to their first MaxKeyLen-17 bytes, "~" and 16 hex digits of their FNV-1a
// hash, so they fit the sync protocol and Redis keys while staying distinct. Keys from
// different sources share one namespace: an API key that equals some client's IP
// address shares that client's buckets (use a composite key to separate them).
func (k *KeySource) Extract(req *Request) string {
	return shortenKey(k.extract(req, 0))
}

func (k *KeySource) extract(req *Request, depth int) string {
	// Parse bounds nesting; the depth guard protects hand-built cyclic sources.
	if k == nil || req == nil || depth > 4*maxKeyDepth {
		return ""
	}
	var v string
	switch k.Kind {
	case KeyHeader:
		v = headerValue(req, k.Header)
	case KeyJWTClaim:
		h := k.Header
		if h == "" {
			h = "authorization"
		}
		v = jwtClaim(headerValue(req, h), k.Claim)
	case KeyIP:
		v = ClientIP(req, k.TrustedHops)
	case KeyRoute:
		v = NormalizePath(req.Path)
	case KeyComposite:
		v = k.composite(req, depth)
	case KeyQuery:
		if raw, ok := queryParam(requestQuery(req), k.Query); ok {
			v = strings.TrimSpace(queryUnescape(raw))
		}
	case KeyProperty:
		v = propertyValue(req, k.Property)
	}
	if v != "" && (k.StripPrefix != "" || k.Lower) {
		v = k.transform(req, v)
	}
	if v == "" && k.Fallback != nil {
		return k.Fallback.extract(req, depth+1)
	}
	return v
}

// composite joins the parts with ":"; any missing part makes the whole key missing,
// because a partial key would merge callers that the operator meant to separate.
func (k *KeySource) composite(req *Request, depth int) string {
	if len(k.Parts) == 0 || len(k.Parts) > maxParts {
		return ""
	}
	var parts [maxParts]string
	n := len(k.Parts) - 1
	for i := range k.Parts {
		parts[i] = k.Parts[i].extract(req, depth+1)
		if parts[i] == "" {
			return ""
		}
		n += len(parts[i])
	}
	if req.KeyBuf != nil {
		buf := *req.KeyBuf
		start := len(buf)
		for i := range k.Parts {
			if i > 0 {
				buf = append(buf, ':')
			}
			buf = append(buf, parts[i]...)
		}
		*req.KeyBuf = buf
		return unsafe.String(&buf[start], len(buf)-start)
	}
	var b strings.Builder
	b.Grow(n)
	for i := range k.Parts {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(parts[i])
	}
	return b.String()
}

func headerValue(req *Request, name string) string {
	if req == nil || req.Header == nil || name == "" {
		return ""
	}
	v, ok := req.Header(name)
	if !ok {
		return ""
	}
	return strings.TrimSpace(v)
}

func shortenKey(s string) string {
	if len(s) <= MaxKeyLen {
		return s
	}
	const hexDigits = "0123456789abcdef"
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	var b strings.Builder
	b.Grow(MaxKeyLen)
	b.WriteString(s[:MaxKeyLen-17])
	b.WriteByte('~')
	for shift := 60; shift >= 0; shift -= 4 {
		b.WriteByte(hexDigits[(h>>uint(shift))&0xf])
	}
	return b.String()
}

// ClientIP returns the client's address in canonical form ("203.0.113.7", "2001:db8::1";
// IPv4-mapped IPv6 is unmapped, ports and zones dropped), or "" when it cannot be
// parsed.
//
// With trustedHops N > 0 the address is the Nth entry from the right of
// x-forwarded-for: N=1 is the rightmost entry, the address the trusted edge proxy saw
// (each trusted proxy appends the peer it saw, so the entries further left were written
// by the client and can be forged). When x-forwarded-for is absent or has fewer than N
// entries, or N is 0, the peer address is used. An unparsable entry at the trusted
// position yields "" (not the peer address, which would be the proxy and would lump
// every client together), so the key source's fallback applies.
func ClientIP(req *Request, trustedHops int) string {
	if req == nil {
		return ""
	}
	if trustedHops > 0 {
		if xff := headerValue(req, "x-forwarded-for"); xff != "" {
			if e, ok := nthFromRight(xff, trustedHops); ok {
				return canonicalIP(e)
			}
		}
	}
	if req.PeerAddr == "" && req.Peer != nil {
		req.PeerAddr = req.Peer()
	}
	return canonicalIP(req.PeerAddr)
}

// ClientIP is the client address used for the allow/deny CIDRs (see Config.TrustedHops).
func (c *Config) ClientIP(req *Request) string {
	return ClientIP(req, c.TrustedHops)
}

// nthFromRight returns the nth (1-based) comma-separated entry of list counted from the
// right, trimmed, without allocating.
func nthFromRight(list string, n int) (string, bool) {
	end := len(list)
	for i := len(list) - 1; i >= -1; i-- {
		if i >= 0 && list[i] != ',' {
			continue
		}
		n--
		if n == 0 {
			return strings.TrimSpace(list[i+1 : end]), true
		}
		end = i
	}
	return "", false
}

// hostOnly strips a port ("host:port", "[v6]:port") and a trailing dot from a host.
// A bare IPv6 address (several colons, no brackets) is left whole.
func hostOnly(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[1:i]
		}
		return h
	}
	if i := strings.IndexByte(h, ':'); i >= 0 && strings.IndexByte(h[i+1:], ':') < 0 {
		h = h[:i]
	}
	return strings.TrimSuffix(h, ".")
}

func canonicalIP(s string) string {
	host := hostOnly(strings.TrimSpace(s))
	a, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	if a.Is4() {
		// netip refuses leading zeros, so a parsed dotted quad is already canonical.
		return host
	}
	a = a.WithZone("").Unmap()
	var buf [64]byte
	b := a.AppendTo(buf[:0])
	if string(b) == host {
		return host
	}
	return string(b)
}

// jwtClaim reads a claim from the payload of a JWT carried as "Bearer <jwt>" (or bare)
// in a header value. The signature is NOT verified: the gateway's authentication filter
// (Envoy jwt_authn, Istio RequestAuthentication) does that and must run before this
// filter; here the token only names the caller. Without that filter anyone can mint a
// token with any claim and so pick their own rate-limit key. String and number claims
// are keys; missing, empty, boolean, object and array claims yield "". Any malformed
// token yields "".
func jwtClaim(v, claim string) string {
	tok := strings.TrimSpace(v)
	if len(tok) >= 7 && strings.EqualFold(tok[:7], "bearer ") {
		tok = strings.TrimLeft(tok[7:], " ")
	}
	if tok == "" || len(tok) > maxTokenLen || claim == "" {
		return ""
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; !(isUnreserved(c) && c != '~' || c == '=') {
			return "" // not a compact JWS: another auth scheme, or garbage
		}
	}
	d1 := strings.IndexByte(tok, '.')
	if d1 <= 0 {
		return ""
	}
	rest := tok[d1+1:]
	d2 := strings.IndexByte(rest, '.')
	// Exactly three segments (JWS compact form); encrypted JWE tokens have five.
	if d2 < 0 || strings.IndexByte(rest[d2+1:], '.') >= 0 {
		return ""
	}
	payload, ok := decodeBase64URL(strings.TrimRight(rest[:d2], "="))
	if !ok || !gjson.Valid(payload) {
		return ""
	}
	if p := strings.TrimLeft(payload, " \t\r\n"); p == "" || p[0] != '{' {
		return ""
	}
	r := gjson.Get(payload, claim)
	switch r.Type {
	case gjson.String:
		return r.Str
	case gjson.Number:
		return r.Raw
	}
	return ""
}

// decodeBase64URL decodes unpadded base64url (RFC 7515 section 2) into a string with
// one allocation; encoding/base64 would need a []byte copy of the input and another of
// the output for gjson.
func decodeBase64URL(s string) (string, bool) {
	if s == "" || len(s)%4 == 1 {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(s) * 3 / 4)
	var acc uint32
	bits := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		var v byte
		switch {
		case c >= 'A' && c <= 'Z':
			v = c - 'A'
		case c >= 'a' && c <= 'z':
			v = c - 'a' + 26
		case c >= '0' && c <= '9':
			v = c - '0' + 52
		case c == '-':
			v = 62
		case c == '_':
			v = 63
		default:
			return "", false
		}
		acc = acc<<6 | uint32(v)
		bits += 6
		if bits >= 8 {
			bits -= 8
			b.WriteByte(byte(acc >> uint(bits)))
		}
	}
	return b.String(), true
}

// NormalizePath returns the canonical form of a request path, the form rules match
// against, so that "/search", "//search", "/./search", "/x/../search", "/search/" and
// "/%73earch" all count against the same rule:
//   - the query ("?...") and fragment ("#...") are dropped;
//   - percent-escapes of unreserved characters (A-Z a-z 0-9 - . _ ~) are decoded, other
//     escapes get upper-case hex ("%2f" -> "%2F", an encoded slash stays encoded), and
//     a "%" that starts no valid escape becomes "%25" (RFC 3986 section 6.2.2);
//   - empty segments ("//") and "." segments are removed, ".." removes the segment
//     before it (never above the root);
//   - the result starts with "/" and has no trailing "/" except the root "/" itself.
//
// A path that is already canonical is returned as is, without allocating.
func NormalizePath(p string) string {
	// A byte loop rather than strings.IndexAny, which builds a byte set on every call
	// (this runs on every request in the filter).
	for i := 0; i < len(p); i++ {
		if p[i] == '?' || p[i] == '#' {
			p = p[:i]
			break
		}
	}
	if isNormalPath(p) {
		return p
	}
	return normalizeSlow(p)
}

func isNormalPath(p string) bool {
	if p == "/" {
		return true
	}
	if len(p) < 2 || p[0] != '/' || p[len(p)-1] == '/' {
		return false
	}
	segStart := 1
	for i := 1; i <= len(p); i++ {
		if i < len(p) && p[i] != '/' {
			if p[i] == '%' && !keepEscape(p, i) {
				return false
			}
			continue
		}
		seg := p[segStart:i]
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		segStart = i + 1
	}
	return true
}

// keepEscape reports whether the "%" at p[i] starts an escape normalisation leaves
// untouched: valid, upper-case hex, not an unreserved character.
func keepEscape(p string, i int) bool {
	if i+2 >= len(p) {
		return false
	}
	hi, lo := p[i+1], p[i+2]
	if !isUpperHex(hi) || !isUpperHex(lo) {
		return false
	}
	return !isUnreserved(unhex(hi)<<4 | unhex(lo))
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F'
}

func isUpperHex(b byte) bool { return b >= '0' && b <= '9' || b >= 'A' && b <= 'F' }

func unhex(b byte) byte {
	switch {
	case b >= '0' && b <= '9':
		return b - '0'
	case b >= 'a' && b <= 'f':
		return b - 'a' + 10
	}
	return b - 'A' + 10
}

func isUnreserved(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '.' || b == '_' || b == '~'
}

func normalizeSlow(p string) string {
	const hexDigits = "0123456789ABCDEF"
	// Pass 1: escapes. Decoding first means "%2e%2e" is seen as a ".." segment below.
	dec := make([]byte, 0, len(p)+2)
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c != '%' {
			dec = append(dec, c)
			continue
		}
		if i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			b := unhex(p[i+1])<<4 | unhex(p[i+2])
			if isUnreserved(b) {
				dec = append(dec, b)
			} else {
				dec = append(dec, '%', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i += 2
			continue
		}
		dec = append(dec, '%', '2', '5')
	}
	// Pass 2: segments, resolved into out in place of a stack.
	out := make([]byte, 0, len(dec)+1)
	for i := 0; i < len(dec); {
		for i < len(dec) && dec[i] == '/' {
			i++
		}
		j := i
		for j < len(dec) && dec[j] != '/' {
			j++
		}
		seg := dec[i:j]
		i = j
		switch string(seg) {
		case "", ".":
		case "..":
			if k := lastSlash(out); k >= 0 {
				out = out[:k]
			}
		default:
			out = append(out, '/')
			out = append(out, seg...)
		}
	}
	if len(out) == 0 {
		return "/"
	}
	return string(out)
}

func lastSlash(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '/' {
			return i
		}
	}
	return -1
}
