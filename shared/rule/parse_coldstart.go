package rule

import "github.com/tidwall/gjson"

// ColdStart is what a rule's gateway does with a request of a key it holds no lease for
// (RATIONALE.md §2, "Decisions on a gateway"; §3, "Cold starts").
type ColdStart uint8

const (
	// ColdBounded (the default) decides such a request on the gateway within the
	// cold-start allowance, floor(capacity / (20·N)) per gateway, N the fleet size, and
	// acquires in the background; beyond the allowance (and for limits under 20·N, where
	// it is 0) the request waits for the acquire. The fleet over-admits at most 5 % of
	// the capacity.
	ColdBounded ColdStart = iota
	// ColdWait makes every such request wait for the acquire (one round trip): cold
	// starts are exact.
	ColdWait
	// ColdAdmit never makes a first request wait: a gateway whose allowance is 0 still
	// admits one request's cost before the service answers, so a fleet of N gateways may
	// admit up to N requests beyond a small limit on a cold start.
	ColdAdmit
)

var coldStartNames = [...]string{ColdBounded: "bounded", ColdWait: "wait", ColdAdmit: "admit"}

// String returns the cold_start value's JSON spelling.
func (c ColdStart) String() string {
	if int(c) < len(coldStartNames) {
		return coldStartNames[c]
	}
	return "unknown"
}

// parseColdStart reads a rule's cold_start: "bounded" (default), "wait" or "admit".
// A strict rule's requests are always decided by the service, so it takes none.
func parseColdStart(o *object, r *Rule) error {
	v := o.get("cold_start")
	if !v.Exists() {
		return nil
	}
	path := o.at("cold_start")
	if v.Type != gjson.String {
		return typeError(path, `"bounded", "wait" or "admit"`, v)
	}
	for c, name := range coldStartNames {
		if v.Str == name {
			if r.Strict && ColdStart(c) != ColdWait {
				return fieldError(path, `cannot be `+quoteShort(v.Str)+` on a "strict" rule (the service decides every request of it)`)
			}
			r.ColdStart = ColdStart(c)
			return nil
		}
	}
	return fieldError(path, `must be "bounded", "wait" or "admit", got `+quoteShort(v.Str))
}
