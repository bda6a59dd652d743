package rule

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// parseKeySource parses {"source": ..., ...}; depth counts composite parts and
// fallbacks so a config cannot make extraction recurse without bound.
func parseKeySource(path string, v gjson.Result, depth int) (KeySource, error) {
	var k KeySource
	if depth > maxKeyDepth {
		return k, fieldError(path, "key sources nested deeper than "+itoa(maxKeyDepth)+" levels")
	}
	o, err := parseObject(path, v, "source", "name", "claim", "header", "trusted_hops", "parts", "fallback",
		"namespace", "path", "strip_prefix", "lowercase")
	if err != nil {
		return k, err
	}
	if !o.has("source") {
		return k, fieldError(o.at("source"), "required ("+keySourceNames+")")
	}
	src, err := parseString(o.at("source"), o.get("source"))
	if err != nil {
		return k, err
	}
	var allowed []string
	switch src {
	case "header":
		k.Kind, allowed = KeyHeader, []string{"name"}
	case "jwt":
		k.Kind, allowed = KeyJWTClaim, []string{"claim", "header"}
	case "ip":
		k.Kind, allowed = KeyIP, []string{"trusted_hops"}
	case "route":
		k.Kind = KeyRoute
	case "composite":
		k.Kind, allowed = KeyComposite, []string{"parts"}
	case "query":
		k.Kind, allowed = KeyQuery, []string{"name", "strip_prefix", "lowercase"}
	case "metadata":
		k.Kind, allowed = KeyProperty, []string{"namespace", "path", "strip_prefix", "lowercase"}
	case "filter_state":
		k.Kind, allowed = KeyProperty, []string{"name", "strip_prefix", "lowercase"}
	default:
		return k, fieldError(o.at("source"), "unknown key source "+quoteShort(src)+" (want "+keySourceNames+")")
	}
	if src == "header" {
		allowed = append(allowed, "strip_prefix", "lowercase")
	}
	// Fields of another source are errors in document order, like unknown fields.
	var bad string
	v.ForEach(func(key, _ gjson.Result) bool {
		name := key.String()
		if name != "source" && name != "fallback" && !contains(allowed, name) && o.has(name) {
			bad = name
			return false
		}
		return true
	})
	if bad != "" {
		return k, fieldError(o.at(bad), "unknown field for source "+strconv.Quote(src))
	}
	switch k.Kind {
	case KeyHeader:
		if !o.has("name") {
			return k, fieldError(o.at("name"), "required for source \"header\"")
		}
		if k.Header, err = parseHeaderName(o.at("name"), o.get("name")); err != nil {
			return k, err
		}
	case KeyQuery, KeyProperty:
		if err := parseValueSource(o, src, &k); err != nil {
			return k, err
		}
	case KeyJWTClaim:
		if !o.has("claim") {
			return k, fieldError(o.at("claim"), "required for source \"jwt\"")
		}
		if k.Claim, err = parseClaim(o.at("claim"), o.get("claim")); err != nil {
			return k, err
		}
		k.Header = "authorization"
		if hv := o.get("header"); hv.Exists() {
			if k.Header, err = parseHeaderName(o.at("header"), hv); err != nil {
				return k, err
			}
		}
	case KeyIP:
		if hv := o.get("trusted_hops"); hv.Exists() {
			n, err := parseInt(o.at("trusted_hops"), hv, 0, maxTrustedHops)
			if err != nil {
				return k, err
			}
			k.TrustedHops = int(n)
		}
	case KeyComposite:
		if !o.has("parts") {
			return k, fieldError(o.at("parts"), "required for source \"composite\"")
		}
		elems, err := parseArray(o.at("parts"), o.get("parts"), maxParts)
		if err != nil {
			return k, err
		}
		if len(elems) < 2 {
			return k, fieldError(o.at("parts"), "needs at least 2 parts, got "+itoa(len(elems)))
		}
		k.Parts = make([]KeySource, len(elems))
		for i, e := range elems {
			if k.Parts[i], err = parseKeySource(indexPath(o.at("parts"), i), e, depth+1); err != nil {
				return k, err
			}
		}
	}
	if err := parseTransforms(o, &k); err != nil {
		return k, err
	}
	if fv := o.get("fallback"); fv.Exists() {
		fb, err := parseKeySource(o.at("fallback"), fv, depth+1)
		if err != nil {
			return k, err
		}
		k.Fallback = &fb
	}
	return k, nil
}

// parseClaim accepts a gjson path of plain names ("sub", "org.id", "https://x\.io/tenant"
// with "\." for a literal dot). Query, wildcard and modifier syntax is refused: a key
// must be one value, and modifiers would let a config run arbitrary gjson machinery
// on every request.
func parseClaim(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	ok := s != "" && len(s) <= 256 && s[0] != '.' && s[len(s)-1] != '.' && !strings.Contains(s, "..")
	for i := 0; ok && i < len(s); i++ {
		b := s[i]
		ok = b > ' ' && b < 0x7f && strings.IndexByte(`@#|*?()!=<>%,[]{}"`, b) < 0
	}
	if !ok {
		return "", fieldError(path, "invalid claim path "+quoteShort(s)+": want names separated by \".\" (no wildcards, queries or modifiers)")
	}
	return s, nil
}
