package rule

import "github.com/tollgate-rl/tollgate/shared/algo"

// Enforcement is the fleet-wide emergency lever of a rule set. It travels with the rules
// (a change is a new rule-set version, which every gateway picks up within the rule-change
// bound), so switching Tollgate to shadow or off needs no redeploy.
type Enforcement uint8

const (
	// EnforceOn applies every rule as written (default).
	EnforceOn Enforcement = iota
	// EnforceShadow decides and reports every rule but refuses nothing (as if every rule
	// had "shadow": true).
	EnforceShadow
	// EnforceOff applies no rule: requests pass without counting or rate-limit headers.
	// The deny list still answers 403: it is access control, not a limit.
	EnforceOff
)

// String is the configuration name.
func (e Enforcement) String() string {
	switch e {
	case EnforceShadow:
		return "shadow"
	case EnforceOff:
		return "off"
	}
	return "on"
}

// KeyHashing says which caller keys the sync service stores (Redis, logs) as keyed
// hashes (HMAC-SHA256 with the deployment's key-hash secret) instead of raw.
type KeyHashing uint8

const (
	// HashIPKeys hashes keys that are IP addresses (what an "ip" key source yields,
	// alone or as a fallback): the default.
	HashIPKeys KeyHashing = iota
	// HashAllKeys hashes every caller key (API keys, JWT subjects, composites).
	HashAllKeys
	// HashNoKeys stores every key raw.
	HashNoKeys
)

// Shadowed reports whether an applied rule only reports for this request: the rule is a
// shadow rule, the rule set's enforcement is shadow, or the caller key is outside the
// rule's rollout. Filter and service (descriptors) both ask this, so a request is
// enforced or shadowed the same way whichever path decides it.
func (c *Config) Shadowed(a *Applied) bool {
	return c.ShadowedRule(a.Rule) || !a.Rule.RolledOut(a.Key)
}

// ShadowedRule reports whether r only reports whoever calls: a shadow rule, or any rule
// while the rule set's enforcement is shadow. (Shadowed adds the caller's rollout; a
// request without a key, which a rollout cannot place, asks this.)
func (c *Config) ShadowedRule(r *Rule) bool {
	return r.Shadow || c != nil && c.Enforcement == EnforceShadow
}

// Off reports whether the rule set applies no rule (enforcement "off").
func (c *Config) Off() bool { return c != nil && c.Enforcement == EnforceOff }

// RolledOut reports whether the rule is enforced for key under its rollout_percent:
// a key is in when its rollout point (RolloutPoint, 0..9999) is at or above ShadowBP, so
// raising the percentage only adds keys and a caller does not flip between enforced
// and shadowed as the rollout grows.
func (r *Rule) RolledOut(key string) bool {
	return r.ShadowBP <= 0 || int64(RolloutPoint(r.ID, key)) >= r.ShadowBP
}

// RolloutPoint places (rule id, caller key) at one of 10,000 points: FNV-1a over both,
// then a 64-bit finaliser (splitmix64) so that keys differing only in their last byte
// spread over all points. The rule id is mixed in so that two rules rolled out to 5 %
// do not pick the same 5 % of callers. It allocates nothing (the filter's hot path).
func RolloutPoint(ruleID, key string) uint32 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(ruleID); i++ {
		h = (h ^ uint64(ruleID[i])) * prime
	}
	h = (h ^ 0xff) * prime // separator: ("ab","c") and ("a","bc") differ
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return uint32(h % 10000)
}

// DegradedWindow is window p while degraded under a degraded limit: limit and burst
// capped at it, the window unchanged (limit <= 0: p itself).
func DegradedWindow(p algo.Params, limit int64) algo.Params {
	// Only the buckets have a burst; a calendar window keeps its period in the field.
	burst := p.Burst > 0 && p.Kind.HasBurst()
	if limit <= 0 || limit >= p.Limit && (!burst || limit >= p.Burst) {
		return p
	}
	p.Limit = min(p.Limit, limit)
	if burst {
		p.Burst = min(p.Burst, limit)
	}
	return p
}

// Degraded is window p of rule r as a gateway enforces it while degraded.
func (r *Rule) Degraded(p algo.Params) algo.Params { return DegradedWindow(p, r.DegradedLimit) }
