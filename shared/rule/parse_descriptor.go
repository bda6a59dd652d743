package rule

import (
	"github.com/tidwall/gjson"
)

// Bounds of a descriptor match. Envoy sends a descriptor's entries in the order of the
// route's rate limit actions; a handful is usual, and each value becomes part of a
// caller key, which the sync protocol carries in 256 bytes.
const (
	MaxDescriptorEntries = 8    // entries per descriptor match
	maxDescriptorToken   = 128  // domain and entry key
	maxDescriptorValue   = 256  // entry value
	MaxDescriptorExcept  = 1000 // values an entry excepts
)

// parseDescriptors reads a rule's descriptor match:
//
//	"descriptors": {"domain": "api", "entries": [{"key": "api_key"}, {"key": "route", "value": "search"}]}
//
// The rules "replaces" names are checked once every rule is read (checkReplaces).
func parseDescriptors(path string, v gjson.Result) (*DescriptorMatch, error) {
	o, err := parseObject(path, v, "domain", "entries", "replaces")
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
	if rv := o.get("replaces"); rv.Exists() {
		d.Replaces, err = parseStrings(o.at("replaces"), rv, MaxRules)
		errs.add(err)
	}
	return d, errs.err()
}

// checkReplaces refuses a "replaces" entry that names no rule with a descriptor match,
// or the rule itself: either would never take effect, so it is a mistake.
func checkReplaces(path string, rules []Rule) error {
	var errs errList
	byID := make(map[string]int, len(rules))
	for i := range rules {
		byID[rules[i].ID] = i
	}
	for i := range rules {
		d := rules[i].Descriptors
		if d == nil {
			continue
		}
		for j, id := range d.Replaces {
			at := indexPath(indexPath(path, i)+".descriptors.replaces", j)
			k, ok := byID[id]
			switch {
			case !ok:
				errs.add(fieldError(at, "unknown rule "+quoteShort(id)))
			case k == i:
				errs.add(fieldError(at, "a rule cannot replace itself"))
			case rules[k].Descriptors == nil:
				errs.add(fieldError(at, "rule "+quoteShort(id)+" has no descriptor match, so no descriptor request applies it"))
			}
		}
	}
	return errs.err()
}

func parseDescriptorEntry(path string, v gjson.Result, e *DescriptorMatchEntry) error {
	o, err := parseObject(path, v, "key", "value", "except")
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
		if xv := o.get("except"); xv.Exists() {
			elems, err := parseArray(o.at("except"), xv, MaxDescriptorExcept)
			if err != nil {
				return err
			}
			e.Except = make([]string, len(elems))
			for i, x := range elems {
				if e.Except[i], err = parseDescriptorValue(indexPath(o.at("except"), i), x); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if o.has("except") {
		return fieldError(o.at("except"), "cannot be combined with \"value\" (it excepts values from an entry that matches any value)")
	}
	e.Value, err = parseDescriptorValue(o.at("value"), o.get("value"))
	return err
}

func parseDescriptorValue(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	switch {
	case s == "":
		// Envoy never sends an empty value (an action that finds nothing drops the
		// descriptor), so an empty one would never match; "any value" is said by
		// leaving "value" out.
		return "", fieldError(path, "must not be empty (leave \"value\" out to match any value)")
	case len(s) > maxDescriptorValue:
		return "", fieldError(path, "must be at most "+itoa(maxDescriptorValue)+" bytes, got "+itoa(len(s)))
	case hasControl(s):
		return "", fieldError(path, "must not contain control characters, got "+quoteShort(s))
	}
	return s, nil
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}
