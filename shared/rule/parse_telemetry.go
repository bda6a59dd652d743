package rule

import "github.com/tidwall/gjson"

// parseTelemetry reads the filter's "telemetry" object; every switch defaults to on.
func parseTelemetry(path string, v gjson.Result) (Telemetry, error) {
	t := Telemetry{RuleStats: true, DecisionMetadata: true}
	if !v.Exists() {
		return t, nil
	}
	o, err := parseObject(path, v, "rule_stats", "decision_metadata")
	if err != nil {
		return t, err
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
