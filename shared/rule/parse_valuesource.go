package rule

import (
	"strings"

	"github.com/tidwall/gjson"
)

const (
	keySourceNames = "header, jwt, ip, route, composite, query, metadata or filter_state"
	// maxPropertyTokens bounds a metadata path (namespace and keys).
	maxPropertyTokens = 8
	maxTokenBytes     = 256
)

// parseValueSource reads the fields of the query, metadata and filter_state sources and
// builds a property source's path once, at configuration time:
//
//	{"source": "query", "name": "api_key"}
//	{"source": "metadata", "namespace": "envoy.filters.http.jwt_authn", "path": "my_payload.sub"}
//	{"source": "filter_state", "name": "tenant"}
//
// A metadata path is a dotted string or an array of keys (for keys with dots in them).
func parseValueSource(o *object, src string, k *KeySource) error {
	var err error
	switch src {
	case "query":
		if !o.has("name") {
			return fieldError(o.at("name"), "required for source \"query\"")
		}
		if k.Query, err = parsePathToken(o.at("name"), o.get("name")); err != nil {
			return err
		}
	case "filter_state":
		if !o.has("name") {
			return fieldError(o.at("name"), "required for source \"filter_state\"")
		}
		name, err := parsePathToken(o.at("name"), o.get("name"))
		if err != nil {
			return err
		}
		k.Property = []string{"filter_state", name}
	case "metadata":
		if !o.has("namespace") {
			return fieldError(o.at("namespace"), "required for source \"metadata\" (the filter's name, e.g. \"envoy.filters.http.jwt_authn\")")
		}
		ns, err := parsePathToken(o.at("namespace"), o.get("namespace"))
		if err != nil {
			return err
		}
		if !o.has("path") {
			return fieldError(o.at("path"), "required for source \"metadata\"")
		}
		keys, err := parseMetadataPath(o.at("path"), o.get("path"))
		if err != nil {
			return err
		}
		k.Property = append([]string{"metadata", "filter_metadata", ns}, keys...)
	}
	return nil
}

// parseToken reads one name of a property path or query parameter: 1..256 bytes
// without control characters (the property path is NUL-separated on the wire).
func parsePathToken(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if s == "" || len(s) > maxTokenBytes {
		return "", fieldError(path, "must be 1.."+itoa(maxTokenBytes)+" bytes, got "+itoa(len(s)))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return "", fieldError(path, "must not contain control characters, got "+quoteShort(s))
		}
	}
	return s, nil
}

func parseMetadataPath(path string, v gjson.Result) ([]string, error) {
	var keys []string
	switch {
	case v.Type == gjson.String:
		if v.Str == "" || strings.HasPrefix(v.Str, ".") || strings.HasSuffix(v.Str, ".") || strings.Contains(v.Str, "..") {
			return nil, fieldError(path, "invalid path "+quoteShort(v.Str)+": want keys separated by \".\" (or an array of keys)")
		}
		for rest := v.Str; rest != ""; {
			k := rest
			if i := strings.IndexByte(rest, '.'); i >= 0 {
				k, rest = rest[:i], rest[i+1:]
			} else {
				rest = ""
			}
			keys = append(keys, k)
		}
		for _, s := range keys {
			if _, err := parsePathToken(path, gjson.Result{Type: gjson.String, Str: s}); err != nil {
				return nil, err
			}
		}
	case v.IsArray():
		elems, err := parseArray(path, v, maxPropertyTokens)
		if err != nil {
			return nil, err
		}
		for i, e := range elems {
			s, err := parsePathToken(indexPath(path, i), e)
			if err != nil {
				return nil, err
			}
			keys = append(keys, s)
		}
	default:
		return nil, typeError(path, "a string or an array of keys", v)
	}
	if len(keys) == 0 || len(keys) > maxPropertyTokens-3 {
		return nil, fieldError(path, "must have 1.."+itoa(maxPropertyTokens-3)+" keys, got "+itoa(len(keys)))
	}
	return keys, nil
}

// parseTransforms reads "strip_prefix" and "lowercase" (parseKeySource has checked
// that the source takes them).
func parseTransforms(o *object, k *KeySource) error {
	var err error
	if sv := o.get("strip_prefix"); sv.Exists() {
		if k.StripPrefix, err = parseString(o.at("strip_prefix"), sv); err != nil {
			return err
		}
		if k.StripPrefix == "" || len(k.StripPrefix) > 64 {
			return fieldError(o.at("strip_prefix"), "must be 1..64 bytes, got "+itoa(len(k.StripPrefix)))
		}
	}
	if lv := o.get("lowercase"); lv.Exists() {
		if k.Lower, err = parseBool(o.at("lowercase"), lv); err != nil {
			return err
		}
	}
	return nil
}
