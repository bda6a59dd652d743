package rule

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

var algoNames = [...]string{
	algo.TokenBucket:          "token_bucket",
	algo.GCRA:                 "gcra",
	algo.SlidingWindowLog:     "sliding_window_log",
	algo.SlidingWindowCounter: "sliding_window_counter",
	algo.FixedWindow:          "fixed_window",
}

// AlgorithmName is the configuration name of an algorithm ("token_bucket", ...), or ""
// for an unknown kind.
func AlgorithmName(k algo.Kind) string {
	if int(k) < len(algoNames) {
		return algoNames[k]
	}
	return ""
}

// ParseAlgorithm is the inverse of AlgorithmName.
func ParseAlgorithm(name string) (algo.Kind, bool) {
	for k, n := range algoNames {
		if n == name {
			return algo.Kind(k), true
		}
	}
	return 0, false
}

func parseTiers(path string, v gjson.Result) ([]Tier, error) {
	if !v.Exists() {
		return nil, nil
	}
	elems, err := parseArray(path, v, MaxTiers)
	if err != nil {
		return nil, err
	}
	tiers := make([]Tier, len(elems))
	for i, e := range elems {
		tp := indexPath(path, i)
		o, err := parseObject(tp, e, "name", "keys", "header", "values")
		if err != nil {
			return nil, err
		}
		t := &tiers[i]
		if !o.has("name") {
			return nil, fieldErrorf(o.at("name"), "required")
		}
		if t.Name, err = parseID(o.at("name"), o.get("name"), "tier name"); err != nil {
			return nil, err
		}
		for j := 0; j < i; j++ {
			if tiers[j].Name == t.Name {
				return nil, fieldErrorf(o.at("name"), "duplicate tier name %q", t.Name)
			}
		}
		if kv := o.get("keys"); kv.Exists() {
			elems, err := parseArray(o.at("keys"), kv, MaxTierEntries)
			if err != nil {
				return nil, err
			}
			t.Keys = make([]string, len(elems))
			for j, ke := range elems {
				if t.Keys[j], err = parseGlob(indexPath(o.at("keys"), j), ke); err != nil {
					return nil, err
				}
			}
		}
		if hv := o.get("header"); hv.Exists() {
			if t.Header, err = parseHeaderName(o.at("header"), hv); err != nil {
				return nil, err
			}
			if !o.has("values") {
				return nil, fieldErrorf(o.at("values"), "required with \"header\"")
			}
		}
		if vv := o.get("values"); vv.Exists() {
			if t.Header == "" {
				return nil, fieldErrorf(o.at("header"), "required with \"values\"")
			}
			if t.Values, err = parseStrings(o.at("values"), vv, MaxTierEntries); err != nil {
				return nil, err
			}
			if len(t.Values) == 0 {
				return nil, fieldErrorf(o.at("values"), "must not be empty")
			}
		}
		if len(t.Keys) == 0 && t.Header == "" {
			return nil, fieldErrorf(tp, "tier %q needs \"keys\" or \"header\" and \"values\"", t.Name)
		}
	}
	return tiers, nil
}

func parseRules(path string, v gjson.Result, tiers []Tier) ([]Rule, error) {
	if !v.Exists() {
		return nil, nil
	}
	elems, err := parseArray(path, v, MaxRules)
	if err != nil {
		return nil, err
	}
	rules := make([]Rule, len(elems))
	seen := make(map[string]int, len(elems))
	for i, e := range elems {
		if err := parseRule(indexPath(path, i), e, tiers, &rules[i]); err != nil {
			return nil, err
		}
		if first, dup := seen[rules[i].ID]; dup {
			return nil, fieldErrorf(indexPath(path, i)+".id", "duplicate rule id %q (first used by %s)", rules[i].ID, indexPath(path, first))
		}
		seen[rules[i].ID] = i
	}
	return rules, nil
}

func parseRule(path string, v gjson.Result, tiers []Tier, r *Rule) error {
	o, err := parseObject(path, v, "id", "version", "match", "key", "algorithm", "limit", "window", "burst",
		"windows", "cost", "costs", "tiers", "overrides", "fail", "shadow", "strict")
	if err != nil {
		return err
	}
	if !o.has("id") {
		return fieldErrorf(o.at("id"), "required")
	}
	if r.ID, err = parseID(o.at("id"), o.get("id"), "rule id"); err != nil {
		return err
	}
	if vv := o.get("version"); vv.Exists() {
		if r.Version, err = parseUint(o.at("version"), vv); err != nil {
			return err
		}
	}
	if r.Match, err = parseMatch(o.at("match"), o.get("match")); err != nil {
		return err
	}
	if kv := o.get("key"); kv.Exists() {
		if r.Key, err = parseKeySource(o.at("key"), kv, 1); err != nil {
			return err
		}
	}
	if av := o.get("algorithm"); av.Exists() {
		name, err := parseString(o.at("algorithm"), av)
		if err != nil {
			return err
		}
		var ok bool
		if r.Algo, ok = ParseAlgorithm(name); !ok {
			return fieldErrorf(o.at("algorithm"), "unknown algorithm %s (want token_bucket, gcra, sliding_window_log, sliding_window_counter or fixed_window)", quoteShort(name))
		}
	}
	if r.Windows, err = parseLimits(o, r.Algo); err != nil {
		return err
	}
	r.Cost = 1
	if cv := o.get("cost"); cv.Exists() {
		if r.Cost, err = parseInt(o.at("cost"), cv, 1, MaxCost); err != nil {
			return err
		}
	}
	if cv := o.get("costs"); cv.Exists() {
		if r.Costs, err = parseCosts(o.at("costs"), cv); err != nil {
			return err
		}
	}
	if tv := o.get("tiers"); tv.Exists() {
		if r.Tiers, err = parseRuleTiers(o.at("tiers"), tv, tiers, r.Algo); err != nil {
			return err
		}
	}
	if ov := o.get("overrides"); ov.Exists() {
		if r.Overrides, err = parseOverrides(o.at("overrides"), ov, r.Algo); err != nil {
			return err
		}
	}
	if fv := o.get("fail"); fv.Exists() {
		s, err := parseString(o.at("fail"), fv)
		if err != nil {
			return err
		}
		switch s {
		case "open":
			r.Fail = FailOpen
		case "closed":
			r.Fail = FailClosed
		default:
			return fieldErrorf(o.at("fail"), "must be \"open\" or \"closed\", got %s", quoteShort(s))
		}
	}
	if sv := o.get("shadow"); sv.Exists() {
		if r.Shadow, err = parseBool(o.at("shadow"), sv); err != nil {
			return err
		}
	}
	if sv := o.get("strict"); sv.Exists() {
		if r.Strict, err = parseBool(o.at("strict"), sv); err != nil {
			return err
		}
	}
	return nil
}

func parseCosts(path string, v gjson.Result) ([]RouteCost, error) {
	elems, err := parseArray(path, v, MaxCosts)
	if err != nil {
		return nil, err
	}
	out := make([]RouteCost, len(elems))
	for i, e := range elems {
		o, err := parseObject(indexPath(path, i), e, "prefix", "regex", "cost")
		if err != nil {
			return nil, err
		}
		c := &out[i]
		switch {
		case o.has("prefix") && o.has("regex"):
			return nil, fieldErrorf(o.at("regex"), "cannot be combined with \"prefix\"; use two entries")
		case o.has("prefix"):
			if c.Prefix, err = parsePrefix(o.at("prefix"), o.get("prefix")); err != nil {
				return nil, err
			}
		case o.has("regex"):
			if c.Regex, err = parseRegex(o.at("regex"), o.get("regex")); err != nil {
				return nil, err
			}
		default:
			return nil, fieldErrorf(o.at("prefix"), "required (or \"regex\")")
		}
		if !o.has("cost") {
			return nil, fieldErrorf(o.at("cost"), "required")
		}
		if c.Cost, err = parseInt(o.at("cost"), o.get("cost"), 1, MaxCost); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func parseRuleTiers(path string, v gjson.Result, tiers []Tier, kind algo.Kind) (map[string][]algo.Params, error) {
	if !v.IsObject() {
		return nil, typeError(path, "an object of tier name to limits", v)
	}
	out := make(map[string][]algo.Params)
	var err error
	v.ForEach(func(k, tv gjson.Result) bool {
		name := k.String()
		tp := joinPath(path, name)
		if _, dup := out[name]; dup {
			err = fieldErrorf(tp, "duplicate field")
			return false
		}
		defined := false
		for i := range tiers {
			defined = defined || tiers[i].Name == name
		}
		if !defined {
			err = fieldErrorf(tp, "undefined tier %s (define it in the top-level \"tiers\")", quoteShort(name))
			return false
		}
		var o *object
		if o, err = parseObject(tp, tv, "limit", "window", "burst", "windows"); err != nil {
			return false
		}
		out[name], err = parseLimits(o, kind)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func parseOverrides(path string, v gjson.Result, kind algo.Kind) ([]Override, error) {
	elems, err := parseArray(path, v, MaxOverrides)
	if err != nil {
		return nil, err
	}
	out := make([]Override, len(elems))
	for i, e := range elems {
		o, err := parseObject(indexPath(path, i), e, "key", "limit", "window", "burst", "windows")
		if err != nil {
			return nil, err
		}
		if !o.has("key") {
			return nil, fieldErrorf(o.at("key"), "required")
		}
		if out[i].Glob, err = parseGlob(o.at("key"), o.get("key")); err != nil {
			return nil, err
		}
		if out[i].Windows, err = parseLimits(o, kind); err != nil {
			return nil, err
		}
	}
	return out, nil
}
