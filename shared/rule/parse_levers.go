package rule

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// parseLevers reads the rule set's fleet-wide settings: enforcement and key_hashing.
func parseLevers(root *object, c *Config) error {
	var errs errList
	if v := root.get("enforcement"); v.Exists() {
		s, err := parseString(root.at("enforcement"), v)
		if !errs.add(err) {
			if c.Enforcement, err = ParseEnforcement(s); err != nil {
				errs.add(fieldError(root.at("enforcement"), err.Error()))
			}
		}
	}
	if v := root.get("key_hashing"); v.Exists() {
		s, err := parseString(root.at("key_hashing"), v)
		if !errs.add(err) {
			switch s {
			case "ip":
				c.KeyHashing = HashIPKeys
			case "all":
				c.KeyHashing = HashAllKeys
			case "off":
				c.KeyHashing = HashNoKeys
			default:
				errs.add(fieldError(root.at("key_hashing"), "must be \"ip\", \"all\" or \"off\", got "+quoteShort(s)))
			}
		}
	}
	return errs.err()
}

// ParseEnforcement reads an enforcement setting: "on", "shadow" or "off".
func ParseEnforcement(s string) (Enforcement, error) {
	switch s {
	case "on":
		return EnforceOn, nil
	case "shadow":
		return EnforceShadow, nil
	case "off":
		return EnforceOff, nil
	}
	return 0, &FieldError{Msg: "must be \"on\", \"shadow\" or \"off\", got " + quoteShort(s)}
}

// parseRuleLevers reads a rule's degraded_limit and rollout_percent. The degraded limit
// is checked against the rule's own windows once they parsed (algoOK and Windows set):
// above the largest limit it would change nothing, which is a mistake worth naming.
func parseRuleLevers(o *object, r *Rule, algoOK bool) error {
	var errs errList
	if v := o.get("degraded_limit"); v.Exists() {
		n, err := parseInt(o.at("degraded_limit"), v, 1, r.Algo.MaxLimit())
		if !errs.add(err) && algoOK && len(r.Windows) > 0 {
			var top int64
			for _, w := range r.Windows {
				top = max(top, w.Limit)
			}
			if n > top {
				errs.add(fieldError(o.at("degraded_limit"), "must be <= the rule's limit ("+itoa(top)+"), got "+itoa(n)))
			} else {
				r.DegradedLimit = n
				for i, w := range r.Windows {
					if err := DegradedWindow(w, n).Validate(); err != nil {
						errs.add(fieldError(o.at("degraded_limit"), "window "+itoa(i)+" while degraded: "+err.Error()))
					}
				}
			}
		}
	}
	if v := o.get("rollout_percent"); v.Exists() {
		bp, err := parsePercentBP(o.at("rollout_percent"), v)
		if !errs.add(err) {
			r.ShadowBP = 10000 - bp
		}
	}
	return errs.err()
}

// parsePercentBP reads a percentage 0..100 with at most two decimals, in 1/10000.
func parsePercentBP(path string, v gjson.Result) (int64, error) {
	if v.Type != gjson.Number {
		return 0, typeError(path, "a number from 0 to 100", v)
	}
	raw := v.Raw
	if strings.ContainsAny(raw, "eE-") {
		return 0, fieldError(path, "must be a number from 0 to 100 with at most two decimals, got "+show(v))
	}
	whole, frac, _ := strings.Cut(raw, ".")
	if len(frac) > 2 || len(whole) > 3 {
		return 0, fieldError(path, "must be a number from 0 to 100 with at most two decimals, got "+show(v))
	}
	frac += strings.Repeat("0", 2-len(frac))
	w, err1 := strconv.ParseInt(whole, 10, 64)
	f, err2 := strconv.ParseInt(frac, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, typeError(path, "a number from 0 to 100", v)
	}
	bp := w*100 + f
	if bp > 10000 {
		return 0, fieldError(path, "must be <= 100, got "+show(v))
	}
	return bp, nil
}
