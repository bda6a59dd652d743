package rule

import (
	"regexp"
	"regexp/syntax"
	"strings"

	"github.com/tidwall/gjson"
)

// parseHost validates a host glob: lower-cased, no port (ports are stripped from the
// request's host before matching, so a pattern with one could never match), a trailing
// dot dropped and IPv6 brackets removed, like the request's host.
func parseHost(path string, v gjson.Result) (string, error) {
	s, err := parseGlob(path, v)
	if err != nil {
		return "", err
	}
	h := strings.TrimSuffix(strings.ToLower(s), ".")
	v6 := len(h) > 2 && h[0] == '[' && h[len(h)-1] == ']'
	if v6 {
		h = h[1 : len(h)-1]
	}
	for i := 0; i < len(h); i++ {
		b := h[i]
		switch {
		case b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '.' || b == '_' || b == '*' || b == '?':
		case b == ':' && v6:
		case b == ':':
			return "", fieldError(path, "host "+quoteShort(s)+" must not include a port (write IPv6 addresses in brackets)")
		default:
			return "", fieldError(path, "invalid host "+quoteShort(s))
		}
	}
	if h == "" {
		return "", fieldError(path, "invalid host "+quoteShort(s))
	}
	return h, nil
}

func parseRegex(path string, v gjson.Result) (*regexp.Regexp, error) {
	s, err := parseString(path, v)
	if err != nil {
		return nil, err
	}
	if s == "" {
		return nil, fieldError(path, "must not be empty")
	}
	if len(s) > maxRegexLen {
		return nil, fieldError(path, "must be at most "+itoa(maxRegexLen)+" bytes, got "+itoa(len(s)))
	}
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, &FieldError{Field: path, Msg: "invalid regex " + quoteShort(s) + ": " + err.Error(), Err: err}
	}
	// A short pattern can still compile to a large program ("(a{100}){10}" is a
	// thousand instructions), and a program's size is what every request pays for.
	if n := regexProgSize(s); n > maxRegexProg {
		return nil, fieldError(path, "regex "+quoteShort(s)+" is too large: its program has "+itoa(n)+" instructions, at most "+itoa(maxRegexProg))
	}
	return re, nil
}

// regexProgSize is the number of instructions of s's compiled program, the measure
// regexp's matchers run over (s is known to compile).
func regexProgSize(s string) int {
	re, err := syntax.Parse(s, syntax.Perl)
	if err != nil {
		return 0
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0
	}
	return len(prog.Inst)
}

// parsePrefix validates a path prefix and stores it normalised, so "/api/" and "/api"
// mean the same and match the normalised request path.
func parsePrefix(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(s, "/") {
		return "", fieldError(path, "must start with \"/\", got "+quoteShort(s))
	}
	if len(s) > 1024 {
		return "", fieldError(path, "must be at most 1024 bytes, got "+itoa(len(s)))
	}
	if strings.ContainsAny(s, "?#") {
		return "", fieldError(path, "must not contain a query or fragment, got "+quoteShort(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return "", fieldError(path, "invalid path "+quoteShort(s)+": use percent-encoding for spaces and non-ASCII")
		}
	}
	return NormalizePath(s), nil
}

func parseMatch(path string, v gjson.Result) (Match, error) {
	return parseMatchBlock(path, v, true)
}

// parseMatchBlock reads a match block; withNot allows a "not" block inside (one level:
// a negated block holds no "not" of its own).
func parseMatchBlock(path string, v gjson.Result, withNot bool) (Match, error) {
	var m Match
	if !v.Exists() {
		return m, nil
	}
	fields := []string{"prefix", "path", "regex", "methods", "hosts", "headers", "query"}
	if withNot {
		fields = append(fields, "not")
	}
	o, err := parseObject(path, v, fields...)
	if err != nil {
		return m, err
	}
	if err := parseConditions(o, &m); err != nil {
		return m, err
	}
	if pv := o.get("prefix"); pv.Exists() {
		if m.Prefix, err = parsePrefix(o.at("prefix"), pv); err != nil {
			return m, err
		}
	}
	if rv := o.get("regex"); rv.Exists() {
		if m.Regex, err = parseRegex(o.at("regex"), rv); err != nil {
			return m, err
		}
	}
	if mv := o.get("methods"); mv.Exists() {
		methods, err := parseStrings(o.at("methods"), mv, maxMethods)
		if err != nil {
			return m, err
		}
		for i, s := range methods {
			ok := s != "" && len(s) <= 32
			for j := 0; ok && j < len(s); j++ {
				ok = isTchar(s[j])
			}
			if !ok {
				return m, fieldError(indexPath(o.at("methods"), i), "invalid method "+quoteShort(s))
			}
			methods[i] = strings.ToUpper(s)
		}
		m.Methods = methods
	}
	if hv := o.get("hosts"); hv.Exists() {
		elems, err := parseArray(o.at("hosts"), hv, maxHosts)
		if err != nil {
			return m, err
		}
		m.Hosts = make([]string, len(elems))
		for i, e := range elems {
			if m.Hosts[i], err = parseHost(indexPath(o.at("hosts"), i), e); err != nil {
				return m, err
			}
		}
	}
	return m, nil
}
