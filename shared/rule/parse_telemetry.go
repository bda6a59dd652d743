package rule

import "github.com/tidwall/gjson"

// parseTelemetry reads the filter's "telemetry" object; every switch defaults to on.
func parseTelemetry(path string, v gjson.Result) (Telemetry, error) {
	t := Telemetry{RuleStats: true, DecisionMetadata: true}
	if !v.Exists() {
		return t, nil
	}
	o, err := parseObject(path, v, "rule_stats", "decision_metadata", "key_hash_secret")
	if err != nil {
		return t, err
	}
	if fv := o.get("key_hash_secret"); fv.Exists() {
		// Never echoed in an error: it is a secret.
		s, err := parseString(o.at("key_hash_secret"), fv)
		if err != nil {
			return t, err
		}
		if len(s) > 1024 || !printable(s) {
			return t, fieldError(o.at("key_hash_secret"), "must be at most 1024 bytes of visible ASCII without spaces (value not shown)")
		}
		t.KeyHashSecret = s
	}
	for _, f := range []struct {
		name string
		dst  *bool
	}{
		{"rule_stats", &t.RuleStats},
		{"decision_metadata", &t.DecisionMetadata},
	} {
		if fv := o.get(f.name); fv.Exists() {
			if *f.dst, err = parseBool(o.at(f.name), fv); err != nil {
				return t, err
			}
		}
	}
	return t, nil
}
