package rule

import (
	"github.com/tidwall/gjson"
)

// Bounds of a descriptor match. Envoy sends a descriptor's entries in the order of the
// route's rate limit actions; a handful is usual, and each value becomes part of a
// caller key, which the sync protocol carries in 256 bytes.
const (
	MaxDescriptorEntries = 8   // entries per descriptor match
	maxDescriptorToken   = 128 // domain and entry key
	maxDescriptorValue   = 256 // entry value
)

// parseDescriptors reads a rule's descriptor match:
//
//	"descriptors": {"domain": "api", "entries": [{"key": "api_key"}, {"key": "route", "value": "search"}]}
func parseDescriptors(path string, v gjson.Result) (*DescriptorMatch, error) {
	o, err := parseObject(path, v, "domain", "entries")
	if err != nil {
		return nil, err
	}
	var errs errList
	d := &DescriptorMatch{}
	if !o.has("domain") {
		errs.add(fieldError(o.at("domain"), "required"))
	} else if d.Domain, err = parseToken(o.at("domain"), o.get("domain"), maxDescriptorToken); !errs.add(err) && d.Domain == "" {
		errs.add(fieldError(o.at("domain"), "must not be empty"))
	}
	if !o.has("entries") {
		errs.add(fieldError(o.at("entries"), "required"))
		return d, errs.err()
	}
	elems, err := parseArray(o.at("entries"), o.get("entries"), MaxDescriptorEntries)
	if errs.add(err) {
		return d, errs.err()
	}
	if len(elems) == 0 {
		errs.add(fieldError(o.at("entries"), "must not be empty"))
	}
	d.Entries = make([]DescriptorMatchEntry, len(elems))
	for i, e := range elems {
		errs.add(parseDescriptorEntry(indexPath(o.at("entries"), i), e, &d.Entries[i]))
	}
	return d, errs.err()
}

func parseDescriptorEntry(path string, v gjson.Result, e *DescriptorMatchEntry) error {
	o, err := parseObject(path, v, "key", "value")
	if err != nil {
		return err
	}
	if !o.has("key") {
		return fieldError(o.at("key"), "required")
	}
	if e.Key, err = parseToken(o.at("key"), o.get("key"), maxDescriptorToken); err != nil {
		return err
	}
	if e.Key == "" {
		return fieldError(o.at("key"), "must not be empty")
	}
	if !o.has("value") {
		e.Any = true
		return nil
	}
	s, err := parseString(o.at("value"), o.get("value"))
	if err != nil {
		return err
	}
	switch {
	case s == "":
		// Envoy never sends an empty value (an action that finds nothing drops the
		// descriptor), so an empty one would never match; "any value" is said by
		// leaving "value" out.
		return fieldError(o.at("value"), "must not be empty (leave \"value\" out to match any value)")
	case len(s) > maxDescriptorValue:
		return fieldError(o.at("value"), "must be at most "+itoa(maxDescriptorValue)+" bytes, got "+itoa(len(s)))
	case hasControl(s):
		return fieldError(o.at("value"), "must not contain control characters, got "+quoteShort(s))
	}
	e.Value = s
	return nil
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}
