package rule

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// AlgorithmName is the configuration name of an algorithm ("token_bucket", ...), or ""
// for an unknown kind. The names are shared/algo's; a variant configured through
// another algorithm's options is named after that one (algo.Calendar is a
// fixed_window's "calendar", parse_calendar.go, so it is named "fixed_window").
func AlgorithmName(k algo.Kind) string {
	if !k.Valid() {
		return ""
	}
	return k.ConfiguredAs().String()
}

// ParseAlgorithm is the inverse of AlgorithmName for the algorithms a rule names
// (algo.Calendar is not one: it is a fixed_window's "calendar").
func ParseAlgorithm(name string) (algo.Kind, bool) {
	k, ok := algo.ParseKind(name)
	if !ok || k.ConfiguredAs() != k {
		return 0, false
	}
	return k, true
}

// Algorithms returns the algorithms a rule can name, in kind order: every kind but the
// variants configured through another one's options (algo.Calendar).
func Algorithms() []algo.Kind {
	var out []algo.Kind
	for _, k := range algo.Kinds() {
		if k.ConfiguredAs() == k {
			out = append(out, k)
		}
	}
	return out
}

// algorithmNames lists, for a message, the algorithms a rule can name that have
// property has, in kind order: "a, b or c" (conj "or"), "a and b" (conj "and").
func algorithmNames(has func(algo.Kind) bool, conj string) string {
	var names []string
	for _, k := range Algorithms() {
		if has(k) {
			names = append(names, k.String())
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// parseTiers reads the tier definitions; each is checked on its own.
func parseTiers(path string, v gjson.Result) ([]Tier, error) {
	if !v.Exists() {
		return nil, nil
	}
	elems, err := parseArray(path, v, MaxTiers)
	if err != nil {
		return nil, err
	}
	var errs errList
	tiers := make([]Tier, len(elems))
	for i, e := range elems {
		errs.add(parseTier(indexPath(path, i), e, tiers[:i], &tiers[i]))
	}
	return tiers, errs.err()
}

func parseTier(tp string, e gjson.Result, before []Tier, t *Tier) error {
	o, err := parseObject(tp, e, "name", "keys", "header", "values")
	if err != nil {
		return err
	}
	if !o.has("name") {
		return fieldError(o.at("name"), "required")
	}
	if t.Name, err = parseID(o.at("name"), o.get("name"), "tier name"); err != nil {
		return err
	}
	for j := range before {
		if before[j].Name == t.Name {
			return fieldError(o.at("name"), "duplicate tier name "+strconv.Quote(t.Name))
		}
	}
	if kv := o.get("keys"); kv.Exists() {
		elems, err := parseArray(o.at("keys"), kv, MaxTierEntries)
		if err != nil {
			return err
		}
		t.Keys = make([]string, len(elems))
		for j, ke := range elems {
			if t.Keys[j], err = parseGlob(indexPath(o.at("keys"), j), ke); err != nil {
				return err
			}
		}
	}
	if hv := o.get("header"); hv.Exists() {
		if t.Header, err = parseHeaderName(o.at("header"), hv); err != nil {
			return err
		}
		if !o.has("values") {
			return fieldError(o.at("values"), "required with \"header\"")
		}
	}
	if vv := o.get("values"); vv.Exists() {
		if t.Header == "" {
			return fieldError(o.at("header"), "required with \"values\"")
		}
		if t.Values, err = parseStrings(o.at("values"), vv, MaxTierEntries); err != nil {
			return err
		}
		if len(t.Values) == 0 {
			return fieldError(o.at("values"), "must not be empty")
		}
	}
	if len(t.Keys) == 0 && t.Header == "" {
		return fieldError(tp, "tier "+strconv.Quote(t.Name)+" needs \"keys\" or \"header\" and \"values\"")
	}
	return nil
}

// parseRules reads the rules; each is checked on its own. tiersOK says whether the tier
// definitions parsed: when they did not, a rule's use of an unknown tier is not
// reported again.
func parseRules(path string, v gjson.Result, tiers []Tier, tiersOK bool) ([]Rule, error) {
	if !v.Exists() {
		return nil, nil
	}
	elems, err := parseArray(path, v, MaxRules)
	if err != nil {
		return nil, err
	}
	var errs errList
	rules := make([]Rule, len(elems))
	seen := make(map[string]int, len(elems))
	for i, e := range elems {
		errs.add(parseRule(indexPath(path, i), e, tiers, tiersOK, &rules[i]))
		if rules[i].ID == "" {
			continue
		}
		if first, dup := seen[rules[i].ID]; dup {
			errs.add(fieldError(indexPath(path, i)+".id", "duplicate rule id "+strconv.Quote(rules[i].ID)+" (first used by "+indexPath(path, first)+")"))
			continue
		}
		seen[rules[i].ID] = i
	}
	errs.add(checkReplaces(path, rules))
	return rules, errs.err()
}

// parseRule reads one rule. Its fields are checked independently, except that windows
// are only read once the algorithm is known (they are checked against it).
func parseRule(path string, v gjson.Result, tiers []Tier, tiersOK bool, r *Rule) error {
	o, err := parseObject(path, v, "id", "version", "match", "key", "algorithm", "limit", "window", "calendar", "burst",
		"windows", "cost", "costs", "cost_from", "max_delay", "tiers", "overrides", "fail", "shadow", "strict", "descriptors",
		"missing_key", "degraded_limit", "rollout_percent", "max_in_flight", "cold_start")
	if err != nil {
		return err
	}
	var errs errList
	if !o.has("id") {
		errs.add(fieldError(o.at("id"), "required"))
	} else if id, err := parseID(o.at("id"), o.get("id"), "rule id"); !errs.add(err) {
		r.ID = id
	}
	if vv := o.get("version"); vv.Exists() {
		r.Version, err = parseUint(o.at("version"), vv)
		errs.add(err)
	}
	r.Match, err = parseMatch(o.at("match"), o.get("match"))
	errs.add(err)
	if dv := o.get("descriptors"); dv.Exists() {
		r.Descriptors, err = parseDescriptors(o.at("descriptors"), dv)
		errs.add(err)
		r.DescriptorOnly = !o.has("match")
	}
	if kv := o.get("key"); kv.Exists() {
		r.Key, err = parseKeySource(o.at("key"), kv, 1)
		errs.add(err)
	}
	if mv := o.get("missing_key"); mv.Exists() {
		r.MissingKey, err = parseMissingKey(o.at("missing_key"), mv)
		errs.add(err)
	}
	algoOK := true
	if av := o.get("algorithm"); av.Exists() {
		name, err := parseString(o.at("algorithm"), av)
		if algoOK = !errs.add(err); algoOK {
			if r.Algo, algoOK = ParseAlgorithm(name); !algoOK {
				errs.add(fieldError(o.at("algorithm"), "unknown algorithm "+quoteShort(name)+" (want "+algorithmNames(algo.Kind.Valid, "or")+")"))
			}
		}
	}
	if algoOK && !concurrencyOnly(o) {
		r.Windows, err = parseLimits(o, r.Algo)
		errs.add(err)
	}
	r.Cost = 1
	if cv := o.get("cost"); cv.Exists() {
		r.Cost, err = parseInt(o.at("cost"), cv, 1, algo.MaxCost)
		errs.add(err)
	}
	if cv := o.get("costs"); cv.Exists() {
		r.Costs, err = parseCosts(o.at("costs"), cv)
		errs.add(err)
	}
	if cv := o.get("cost_from"); cv.Exists() {
		r.CostFrom, err = parseCostFrom(o.at("cost_from"), cv)
		errs.add(err)
	}
	if tv := o.get("tiers"); tv.Exists() && algoOK {
		r.Tiers, err = parseRuleTiers(o.at("tiers"), tv, tiers, tiersOK, r.Algo)
		errs.add(err)
	}
	if ov := o.get("overrides"); ov.Exists() && algoOK {
		r.Overrides, err = parseOverrides(o.at("overrides"), ov, r.Algo)
		errs.add(err)
	}
	if fv := o.get("fail"); fv.Exists() {
		s, err := parseString(o.at("fail"), fv)
		if !errs.add(err) {
			switch s {
			case "open":
				r.Fail = FailOpen
			case "closed":
				r.Fail = FailClosed
			default:
				errs.add(fieldError(o.at("fail"), "must be \"open\" or \"closed\", got "+quoteShort(s)))
			}
		}
	}
	if sv := o.get("shadow"); sv.Exists() {
		r.Shadow, err = parseBool(o.at("shadow"), sv)
		errs.add(err)
	}
	if sv := o.get("strict"); sv.Exists() {
		r.Strict, err = parseBool(o.at("strict"), sv)
		errs.add(err)
	}
	if r.CostFrom != nil {
		switch {
		case r.Strict:
			// A strict rule's requests are decided by the service alone, before the
			// response exists; the gateway holds no bucket to charge the rest to.
			errs.add(fieldError(o.at("cost_from"), "cannot be combined with \"strict\""))
		case r.DescriptorOnly:
			errs.add(fieldError(o.at("cost_from"), "needs a \"match\": only the filter sees responses"))
		}
	}
	errs.add(parseMaxDelay(o, r, algoOK))
	errs.add(parseRuleLevers(o, r, algoOK))
	errs.add(parseInFlight(o, r))
	if err := parseColdStart(o, r); err != nil {
		errs.add(err)
	}
	return errs.err()
}

func parseCosts(path string, v gjson.Result) ([]RouteCost, error) {
	elems, err := parseArray(path, v, MaxCosts)
	if err != nil {
		return nil, err
	}
	var errs errList
	out := make([]RouteCost, len(elems))
	for i, e := range elems {
		errs.add(parseCost(indexPath(path, i), e, &out[i]))
	}
	return out, errs.err()
}

func parseCost(path string, e gjson.Result, c *RouteCost) error {
	o, err := parseObject(path, e, "prefix", "regex", "cost")
	if err != nil {
		return err
	}
	switch {
	case o.has("prefix") && o.has("regex"):
		return fieldError(o.at("regex"), "cannot be combined with \"prefix\"; use two entries")
	case o.has("prefix"):
		if c.Prefix, err = parsePrefix(o.at("prefix"), o.get("prefix")); err != nil {
			return err
		}
	case o.has("regex"):
		if c.Regex, err = parseRegex(o.at("regex"), o.get("regex")); err != nil {
			return err
		}
	default:
		return fieldError(o.at("prefix"), "required (or \"regex\")")
	}
	if !o.has("cost") {
		return fieldError(o.at("cost"), "required")
	}
	c.Cost, err = parseInt(o.at("cost"), o.get("cost"), 1, algo.MaxCost)
	return err
}

func parseRuleTiers(path string, v gjson.Result, tiers []Tier, tiersOK bool, kind algo.Kind) (map[string][]algo.Params, error) {
	if !v.IsObject() {
		return nil, typeError(path, "an object of tier name to limits", v)
	}
	out := make(map[string][]algo.Params)
	var errs errList
	v.ForEach(func(k, tv gjson.Result) bool {
		name := k.String()
		tp := joinPath(path, name)
		if _, dup := out[name]; dup {
			errs.add(fieldError(tp, "duplicate field"))
			return true
		}
		defined := false
		for i := range tiers {
			defined = defined || tiers[i].Name == name
		}
		if !defined && tiersOK {
			errs.add(fieldError(tp, "undefined tier "+quoteShort(name)+" (define it in the top-level \"tiers\")"))
			return true
		}
		// An unknown field is one mistake; the tier's windows are still checked.
		o, err := parseObject(tp, tv, "limit", "window", "calendar", "burst", "windows")
		if errs.add(err); o == nil {
			return true
		}
		w, err := parseLimits(o, kind)
		errs.add(err)
		out[name] = w
		return true
	})
	return out, errs.err()
}

func parseOverrides(path string, v gjson.Result, kind algo.Kind) ([]Override, error) {
	elems, err := parseArray(path, v, MaxOverrides)
	if err != nil {
		return nil, err
	}
	var errs errList
	out := make([]Override, len(elems))
	for i, e := range elems {
		// An unknown field is one mistake; the override's key and windows are still checked.
		o, err := parseObject(indexPath(path, i), e, "key", "limit", "window", "calendar", "burst", "windows")
		if errs.add(err); o == nil {
			continue
		}
		if !o.has("key") {
			errs.add(fieldError(o.at("key"), "required"))
		} else {
			out[i].Glob, err = parseGlob(o.at("key"), o.get("key"))
			errs.add(err)
		}
		out[i].Windows, err = parseLimits(o, kind)
		errs.add(err)
	}
	return out, errs.err()
}
