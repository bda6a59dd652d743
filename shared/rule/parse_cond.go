package rule

import (
	"strconv"

	"github.com/tidwall/gjson"
)

// parseConditions reads the match fields beyond prefix, regex, methods and hosts:
// "path" (exact), "headers", "query" and "not".
func parseConditions(o *object, m *Match) error {
	var err error
	if pv := o.get("path"); pv.Exists() {
		if m.Path, err = parsePrefix(o.at("path"), pv); err != nil {
			return err
		}
	}
	if hv := o.get("headers"); hv.Exists() {
		if m.Headers, err = parseValueMatches(o.at("headers"), hv, true); err != nil {
			return err
		}
	}
	if qv := o.get("query"); qv.Exists() {
		if m.Query, err = parseValueMatches(o.at("query"), qv, false); err != nil {
			return err
		}
	}
	if nv := o.get("not"); nv.Exists() {
		if !nv.IsObject() {
			return typeError(o.at("not"), "an object", nv)
		}
		not, err := parseMatchBlock(o.at("not"), nv, false)
		if err != nil {
			return err
		}
		if not.isEmpty() {
			// An empty block matches every request, so its negation none: a rule that
			// never applies is a mistake, not a configuration.
			return fieldError(o.at("not"), "must have at least one condition")
		}
		m.Not = &not
	}
	return nil
}

func (m *Match) isEmpty() bool {
	return m.Prefix == "" && m.Path == "" && m.Regex == nil && len(m.Methods) == 0 && len(m.Hosts) == 0 &&
		len(m.Headers) == 0 && len(m.Query) == 0 && m.Not == nil
}

// parseValueMatches reads header (headers set) or query-parameter conditions:
//
//	{"name": "x-env", "exact": "prod"}   // or "prefix", "regex" (headers only), "present": true
//	{"name": "debug", "not": true}       // name alone: present; "not" inverts
func parseValueMatches(path string, v gjson.Result, headers bool) ([]ValueMatch, error) {
	elems, err := parseArray(path, v, maxConditions)
	if err != nil {
		return nil, err
	}
	out := make([]ValueMatch, len(elems))
	for i, e := range elems {
		if err := parseValueMatch(indexPath(path, i), e, headers, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func parseValueMatch(path string, e gjson.Result, headers bool, c *ValueMatch) error {
	fields := []string{"name", "present", "exact", "not"}
	kinds := "\"present\" or \"exact\""
	if headers {
		fields = append(fields, "prefix", "regex")
		kinds = "\"present\", \"exact\", \"prefix\" or \"regex\""
	}
	o, err := parseObject(path, e, fields...)
	if err != nil {
		return err
	}
	if !o.has("name") {
		return fieldError(o.at("name"), "required")
	}
	if headers {
		if c.Name, err = parseHeaderName(o.at("name"), o.get("name")); err != nil {
			return err
		}
	} else {
		if c.Name, err = parseString(o.at("name"), o.get("name")); err != nil {
			return err
		}
		if c.Name == "" || len(c.Name) > 256 {
			return fieldError(o.at("name"), "must be 1..256 bytes, got "+itoa(len(c.Name)))
		}
	}
	set := ""
	for _, k := range fields[1:] {
		if k == "not" || !o.has(k) {
			continue
		}
		if set != "" {
			return fieldError(o.at(k), "cannot be combined with "+strconv.Quote(set)+" (want one of "+kinds+")")
		}
		set = k
	}
	switch set {
	case "", "present":
		c.Kind = ValuePresent
		if set != "" {
			p, err := parseBool(o.at("present"), o.get("present"))
			if err != nil {
				return err
			}
			if !p {
				return fieldError(o.at("present"), "must be true (write \"not\": true for an absent one)")
			}
		}
	case "exact", "prefix":
		c.Kind = ValueExact
		if set == "prefix" {
			c.Kind = ValuePrefix
		}
		if c.Value, err = parseString(o.at(set), o.get(set)); err != nil {
			return err
		}
		if len(c.Value) > 1024 {
			return fieldError(o.at(set), "must be at most 1024 bytes, got "+itoa(len(c.Value)))
		}
		if set == "prefix" && c.Value == "" {
			return fieldError(o.at(set), "must not be empty")
		}
	case "regex":
		c.Kind = ValueRegex
		if c.Regex, err = parseRegex(o.at("regex"), o.get("regex")); err != nil {
			return err
		}
	}
	if nv := o.get("not"); nv.Exists() {
		if c.Not, err = parseBool(o.at("not"), nv); err != nil {
			return err
		}
	}
	return nil
}
