package rule

import (
	"strings"

	"github.com/tidwall/gjson"
)

// parseGlob validates a key glob: "*" and "?" are the only special characters.
func parseGlob(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fieldError(path, "must not be empty")
	}
	if len(s) > maxPatternLen {
		return "", fieldError(path, "must be at most "+itoa(maxPatternLen)+" bytes, got "+itoa(len(s)))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return "", fieldError(path, "invalid glob "+quoteShort(s)+": control character")
		}
	}
	return s, nil
}

func parseList(path string, v gjson.Result) ([]Pattern, error) {
	if !v.Exists() {
		return nil, nil
	}
	elems, err := parseArray(path, v, MaxListEntries)
	if err != nil {
		return nil, err
	}
	var errs errList
	out := make([]Pattern, 0, len(elems))
	for i, e := range elems {
		p, err := parsePattern(indexPath(path, i), e)
		if !errs.add(err) {
			out = append(out, p)
		}
	}
	return out, errs.err()
}

// parsePattern classifies an allow/deny entry. An entry that parses as an IP address
// is an IP; an entry that contains "/" and only the characters of an address
// (hex digits, ".", ":") must be a valid CIDR — so a typo such as "10.0.0.0/33" is an
// error, not a key glob that silently never matches; anything else is a key glob.
func parsePattern(path string, v gjson.Result) (Pattern, error) {
	s, err := parseGlob(path, v)
	if err != nil {
		return Pattern{}, err
	}
	p := Pattern{Raw: s}
	if looksLikeCIDR(s) {
		n, err := parseCIDR(s)
		if err != nil {
			return p, &FieldError{Field: path, Msg: "invalid CIDR " + quoteShort(s) + ": " + err.Error(), Err: err}
		}
		p.CIDR = n
		return p, nil
	}
	if n, err := parseIPNet(s); n != nil || err != nil {
		if err != nil {
			return p, &FieldError{Field: path, Msg: "invalid IP " + quoteShort(s) + ": " + err.Error(), Err: err}
		}
		p.CIDR = n
		return p, nil
	}
	p.Glob = s
	return p, nil
}

func looksLikeCIDR(s string) bool {
	slash := strings.IndexByte(s, '/')
	if slash < 0 {
		return false
	}
	sep := false
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b == '.' || b == ':':
			sep = true
		case b == '/' || b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F':
		default:
			return false
		}
	}
	return sep
}
