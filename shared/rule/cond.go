package rule

import (
	"regexp"
	"strings"
)

// ValueKind says how a ValueMatch compares a header or query parameter.
type ValueKind uint8

const (
	ValuePresent ValueKind = iota // the header or parameter is there (any value)
	ValueExact                    // its value equals Value
	ValuePrefix                   // its value starts with Value (headers only)
	ValueRegex                    // Regex matches its value (headers only)
)

// ValueMatch is one header or query-parameter condition of a Match. Only the first
// header (Envoy's proxy-wasm header read) or first parameter of the name is looked at;
// Not inverts the outcome, so {"name": "x", "not": true} holds when x is absent.
type ValueMatch struct {
	// _ makes the type incomparable, so the compiler emits no equality function for it
	// into the module (nothing compares conditions).
	_     [0]func()
	Name  string // header names lower-case; parameter names as decoded
	Kind  ValueKind
	Value string
	Regex *regexp.Regexp
	Not   bool
}

// MissingAction is a rule's answer to a request whose key cannot be found.
type MissingAction uint8

const (
	MissingSkip     MissingAction = iota // the rule does not apply (unlimited by it)
	MissingDeny                          // refuse with Status (401 or 403)
	MissingFallback                      // limit under the Key source's key instead
)

// MissingKey is a rule's missing-key policy.
type MissingKey struct {
	_      [0]func() // incomparable, like ValueMatch
	Action MissingAction
	Status int        // MissingDeny: 401 (default) or 403
	Key    *KeySource // MissingFallback
}

func (m *Match) matches(req *Request, host, path string) bool {
	if m.Prefix != "" && !hasPathPrefix(path, m.Prefix) {
		return false
	}
	if m.Path != "" && path != m.Path {
		return false
	}
	if len(m.Methods) > 0 {
		ok := false
		for _, x := range m.Methods {
			if strings.EqualFold(x, req.Method) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(m.Hosts) > 0 {
		ok := false
		for _, h := range m.Hosts {
			if globMatch(h, host, true) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for i := range m.Headers {
		if !m.Headers[i].header(req) {
			return false
		}
	}
	if len(m.Query) > 0 {
		q := requestQuery(req)
		for i := range m.Query {
			if !m.Query[i].query(q) {
				return false
			}
		}
	}
	if m.Regex != nil && !m.Regex.MatchString(path) {
		return false
	}
	return m.Not == nil || !m.Not.matches(req, host, path)
}

func (c *ValueMatch) header(req *Request) bool {
	var v string
	ok := false
	if req.Header != nil {
		v, ok = req.Header(c.Name)
	}
	if ok {
		switch c.Kind {
		case ValueExact:
			ok = strings.TrimSpace(v) == c.Value
		case ValuePrefix:
			ok = strings.HasPrefix(strings.TrimSpace(v), c.Value)
		case ValueRegex:
			ok = c.Regex.MatchString(strings.TrimSpace(v))
		}
	}
	return ok != c.Not
}

func (c *ValueMatch) query(q string) bool {
	raw, ok := queryParam(q, c.Name)
	if ok && c.Kind == ValueExact {
		ok = queryEqual(raw, c.Value)
	}
	return ok != c.Not
}

// requestQuery is the request's raw query string: Request.Query, else what follows "?"
// in Path (up to a fragment).
func requestQuery(req *Request) string {
	if req.Query != "" {
		return req.Query
	}
	p := req.Path
	i := strings.IndexByte(p, '?')
	if i < 0 {
		return ""
	}
	q := p[i+1:]
	if j := strings.IndexByte(q, '#'); j >= 0 {
		q = q[:j]
	}
	return q
}

// queryParam returns the raw (still encoded) value of the first parameter of q whose
// decoded name is name. It allocates nothing.
func queryParam(q, name string) (string, bool) {
	for q != "" {
		kv := q
		if i := strings.IndexByte(q, '&'); i >= 0 {
			kv, q = q[:i], q[i+1:]
		} else {
			q = ""
		}
		k, v := kv, ""
		if i := strings.IndexByte(kv, '='); i >= 0 {
			k, v = kv[:i], kv[i+1:]
		}
		if k != "" && queryEqual(k, name) {
			return v, true
		}
	}
	return "", false
}

// queryEqual reports whether the form-encoded raw ("+" for space, %XX escapes) decodes
// to want, without decoding into a buffer: a client cannot dodge a condition by
// encoding a name or value differently.
func queryEqual(raw, want string) bool {
	j := 0
	for i := 0; i < len(raw); {
		var c byte
		c, i = queryByte(raw, i)
		if j >= len(want) || want[j] != c {
			return false
		}
		j++
	}
	return j == len(want)
}

// queryByte decodes the form-encoded byte at raw[i] ("+" is a space, a valid %XX its
// byte; anything else stands for itself) and returns it with the index after it.
func queryByte(raw string, i int) (byte, int) {
	switch c := raw[i]; {
	case c == '+':
		return ' ', i + 1
	case c == '%' && i+2 < len(raw) && isHex(raw[i+1]) && isHex(raw[i+2]):
		return unhex(raw[i+1])<<4 | unhex(raw[i+2]), i + 3
	default:
		return c, i + 1
	}
}

// queryUnescape decodes a form-encoded value; one without escapes is returned as is.
func queryUnescape(raw string) string {
	if strings.IndexByte(raw, '%') < 0 && strings.IndexByte(raw, '+') < 0 {
		return raw
	}
	b := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		var c byte
		c, i = queryByte(raw, i)
		b = append(b, c)
	}
	return string(b)
}
