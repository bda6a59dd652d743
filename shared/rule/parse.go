package rule

import (
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Caps on a rule set. They keep the filter's per-request work and memory bounded no
// matter what an operator (or a compromised control plane) sends, and they keep every
// value inside what the sync protocol can carry (wire's uint32 limits and 256-byte
// strings).
const (
	MaxConfigSize  = 4 << 20       // bytes of JSON
	MaxRules       = 1000          // rules per config
	MaxWindows     = 8             // windows per rule, tier or override
	MaxCosts       = 64            // costs entries per rule
	MaxOverrides   = 1000          // overrides per rule
	MaxListEntries = 10000         // allow or deny entries
	MaxTiers       = 64            // tier definitions
	MaxTierEntries = 1000          // keys or values per tier definition
	MaxLimit       = 1_000_000_000 // limit and burst (fits wire's uint32)
	MaxCost        = 1_000_000     // cost per request
	MaxLogLimit    = 10000         // sliding_window_log limit: its state is O(limit)
	MaxWindow      = 24 * time.Hour
	MinWindow      = time.Millisecond
	MaxKeyLen      = wire.MaxStringLen // longer caller keys are shortened, see KeySource.Extract
	MaxIDLen       = 64                // rule id and tier name

	maxMethods     = 16
	maxHosts       = 64
	maxPatternLen  = 256 // glob or CIDR
	maxRegexLen    = 1024
	maxKeyDepth    = 4 // nesting of composite parts and fallbacks
	maxParts       = 8
	maxTrustedHops = 16
	maxNesting     = 64 // JSON nesting depth; the deepest valid config needs 8
	maxShownValue  = 64 // bytes of an offending value quoted in an error
)

// Parse parses and validates a JSON rule set (schema in SCHEMA.md). Every error is a
// *FieldError naming the JSON path. Defaults are filled in: Sync settings, the default
// key source, rule cost 1, token_bucket, fail open.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxConfigSize {
		return nil, fieldErrorf("", "configuration is %d bytes, more than the %d allowed", len(data), MaxConfigSize)
	}
	if depth := jsonDepth(data); depth > maxNesting {
		return nil, fieldErrorf("", "invalid JSON: nested deeper than %d levels", maxNesting)
	}
	if !gjson.ValidBytes(data) {
		return nil, fieldErrorf("", "invalid JSON")
	}
	root, err := parseObject("", gjson.ParseBytes(data),
		"version", "retry_jitter_ms", "trusted_hops", "sync", "key", "allow", "deny", "tiers", "rules")
	if err != nil {
		return nil, err
	}
	c := &Config{RetryJitterMs: 1000}
	if v := root.get("version"); v.Exists() {
		if c.Version, err = parseUint(root.at("version"), v); err != nil {
			return nil, err
		}
	}
	if v := root.get("retry_jitter_ms"); v.Exists() {
		if c.RetryJitterMs, err = parseInt(root.at("retry_jitter_ms"), v, 0, 60000); err != nil {
			return nil, err
		}
	}
	if c.Sync, err = parseSync(root.at("sync"), root.get("sync")); err != nil {
		return nil, err
	}
	if v := root.get("key"); v.Exists() {
		if c.DefaultKey, err = parseKeySource(root.at("key"), v, 1); err != nil {
			return nil, err
		}
	} else {
		c.DefaultKey = builtinDefaultKey()
	}
	if v := root.get("trusted_hops"); v.Exists() {
		n, err := parseInt(root.at("trusted_hops"), v, 0, maxTrustedHops)
		if err != nil {
			return nil, err
		}
		c.TrustedHops = int(n)
	} else if ip := firstIPSource(&c.DefaultKey, 0); ip != nil {
		c.TrustedHops = ip.TrustedHops
	}
	if c.Allow, err = parseList(root.at("allow"), root.get("allow")); err != nil {
		return nil, err
	}
	if c.Deny, err = parseList(root.at("deny"), root.get("deny")); err != nil {
		return nil, err
	}
	if c.Tiers, err = parseTiers(root.at("tiers"), root.get("tiers")); err != nil {
		return nil, err
	}
	if c.Rules, err = parseRules(root.at("rules"), root.get("rules"), c.Tiers); err != nil {
		return nil, err
	}
	c.buildIndexes()
	return c, nil
}

// builtinDefaultKey is the key source used when a config names none: the API key
// header, else the client IP, so that anonymous callers are still limited.
func builtinDefaultKey() KeySource {
	return KeySource{Kind: KeyHeader, Header: "x-api-key", Fallback: &KeySource{Kind: KeyIP}}
}

func firstIPSource(k *KeySource, depth int) *KeySource {
	if k == nil || depth > maxKeyDepth*2 {
		return nil
	}
	if k.Kind == KeyIP {
		return k
	}
	for i := range k.Parts {
		if ip := firstIPSource(&k.Parts[i], depth+1); ip != nil {
			return ip
		}
	}
	return firstIPSource(k.Fallback, depth+1)
}

// jsonDepth returns the deepest bracket nesting of data (strings skipped), stopping
// early past maxNesting: gjson's validator recurses per level, so absurd nesting is
// refused before it is handed over.
func jsonDepth(data []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, b := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case b == '\\':
				escaped = true
			case b == '"':
				inString = false
			}
		case b == '"':
			inString = true
		case b == '{' || b == '[':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > maxNesting {
					return deepest
				}
			}
		case b == '}' || b == ']':
			depth--
		}
	}
	return deepest
}
