package rule

import "github.com/tidwall/gjson"

// DefaultMissingStatus is the status of a missing-key refusal when "status" is absent.
const DefaultMissingStatus = 401

// parseMissingKey reads a rule's missing-key policy:
//
//	"skip"                                            // the default: the rule does not apply
//	"deny"  or  {"action": "deny", "status": 403}     // refuse (401 unless 403 is given)
//	{"action": "fallback", "key": {"source": "ip"}}   // limit under another source's key
func parseMissingKey(path string, v gjson.Result) (MissingKey, error) {
	m := MissingKey{}
	var o *object
	action := ""
	if v.Type == gjson.String {
		action = v.Str
	} else {
		var err error
		if o, err = parseObject(path, v, "action", "status", "key"); err != nil {
			return m, typeErrorIfNotObject(path, v, err)
		}
		if !o.has("action") {
			return m, fieldError(o.at("action"), "required (skip, deny or fallback)")
		}
		if action, err = parseString(o.at("action"), o.get("action")); err != nil {
			return m, err
		}
		path = o.at("action")
	}
	switch action {
	case "skip":
		m.Action = MissingSkip
	case "deny":
		m.Action, m.Status = MissingDeny, DefaultMissingStatus
	case "fallback":
		m.Action = MissingFallback
		if o == nil {
			return m, fieldError(path, "\"fallback\" needs a key source: {\"action\": \"fallback\", \"key\": {...}}")
		}
	default:
		return m, fieldError(path, "unknown action "+quoteShort(action)+" (want skip, deny or fallback)")
	}
	if o == nil {
		return m, nil
	}
	if sv := o.get("status"); sv.Exists() {
		if m.Action != MissingDeny {
			return m, fieldError(o.at("status"), "only with action \"deny\"")
		}
		n, err := parseInt(o.at("status"), sv, 0, 999)
		if err != nil {
			return m, err
		}
		if n != 401 && n != 403 {
			return m, fieldError(o.at("status"), "must be 401 or 403, got "+itoa(n))
		}
		m.Status = int(n)
	}
	kv := o.get("key")
	switch {
	case kv.Exists() && m.Action != MissingFallback:
		return m, fieldError(o.at("key"), "only with action \"fallback\"")
	case m.Action == MissingFallback && !kv.Exists():
		return m, fieldError(o.at("key"), "required with action \"fallback\"")
	case kv.Exists():
		k, err := parseKeySource(o.at("key"), kv, 1)
		if err != nil {
			return m, err
		}
		m.Key = &k
	}
	return m, nil
}

// typeErrorIfNotObject words the error for a value that is neither of the two forms.
func typeErrorIfNotObject(path string, v gjson.Result, err error) error {
	if !v.IsObject() {
		return typeError(path, "\"skip\", \"deny\" or an object", v)
	}
	return err
}
