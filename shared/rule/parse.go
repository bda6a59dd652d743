package rule

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Caps on a rule set. They keep the filter's per-request work and memory bounded no
// matter what an operator (or a compromised control plane) sends, and they keep every
// value inside what the sync protocol can carry (256-byte strings). The bounds of the
// numbers that reach the algorithms (limit, window, burst, cost) are shared/algo's
// (algo.MaxLimit, algo.MaxWindowUs, ...), and every window is checked with
// algo.Params.Validate: a rule set that parses is one every algorithm enforces as
// written, in the filter and at the sync service alike.
const (
	MaxConfigSize  = 4 << 20           // bytes of JSON
	MaxRules       = 1000              // rules per config
	MaxWindows     = 8                 // windows per rule, tier or override
	MaxCosts       = 64                // costs entries per rule
	MaxOverrides   = 1000              // overrides per rule
	MaxListEntries = 10000             // allow or deny entries
	MaxTiers       = 64                // tier definitions
	MaxTierEntries = 1000              // keys or values per tier definition
	MaxKeyLen      = wire.MaxStringLen // longer caller keys are shortened, see KeySource.Extract
	MaxIDLen       = 64                // rule id and tier name

	maxMethods     = 16
	maxHosts       = 64
	maxPatternLen  = 256 // glob or CIDR
	maxRegexLen    = 1024
	maxRegexProg   = 2000 // instructions of a compiled regex (regexp/syntax)
	maxConditions  = 16   // header or query conditions per match block
	maxKeyDepth    = 4    // nesting of composite parts and fallbacks
	maxParts       = 8
	maxTrustedHops = 16
	maxNesting     = 64 // JSON nesting depth; the deepest valid config needs 8
	maxShownValue  = 64 // bytes of an offending value quoted in an error
)

// Parse parses and validates a JSON rule set (schema in SCHEMA.md). An invalid one is
// refused with an *Errors listing every problem found (each a *FieldError naming the
// JSON path; errors.As finds the first). Defaults are filled in: Sync settings, the
// default key source, rule cost 1, token_bucket, fail open.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxConfigSize {
		return nil, &Errors{List: []*FieldError{fieldError("", "configuration is "+itoa(len(data))+" bytes, more than the "+itoa(MaxConfigSize)+" allowed")}}
	}
	if fe := checkSyntax(data); fe != nil {
		return nil, &Errors{List: []*FieldError{fe}}
	}
	var errs errList
	root, err := parseObject("", gjson.ParseBytes(data),
		"version", "retry_jitter_ms", "trusted_hops", "sync", "telemetry", "key", "allow", "deny", "tiers", "rules",
		"enforcement", "key_hashing")
	if errs.add(err) {
		return nil, errs.err()
	}
	c := &Config{RetryJitterMs: 1000}
	if v := root.get("version"); v.Exists() {
		c.Version, err = parseUint(root.at("version"), v)
		errs.add(err)
	}
	if v := root.get("retry_jitter_ms"); v.Exists() {
		c.RetryJitterMs, err = parseInt(root.at("retry_jitter_ms"), v, 0, 60000)
		errs.add(err)
	}
	errs.add(parseLevers(root, c))
	c.Sync, err = parseSync(root.at("sync"), root.get("sync"))
	errs.add(err)
	c.Telemetry, err = parseTelemetry(root.at("telemetry"), root.get("telemetry"))
	errs.add(err)
	c.DefaultKey = builtinDefaultKey()
	if v := root.get("key"); v.Exists() {
		c.DefaultKey, err = parseKeySource(root.at("key"), v, 1)
		errs.add(err)
	}
	if v := root.get("trusted_hops"); v.Exists() {
		n, err := parseInt(root.at("trusted_hops"), v, 0, maxTrustedHops)
		errs.add(err)
		c.TrustedHops = int(n)
	} else if ip := firstIPSource(&c.DefaultKey, 0); ip != nil {
		c.TrustedHops = ip.TrustedHops
	}
	c.Allow, err = parseList(root.at("allow"), root.get("allow"))
	errs.add(err)
	c.Deny, err = parseList(root.at("deny"), root.get("deny"))
	errs.add(err)
	c.Tiers, err = parseTiers(root.at("tiers"), root.get("tiers"))
	// With a broken tier definition, a rule's use of that tier is not a second mistake.
	tiersOK := !errs.add(err)
	c.Rules, err = parseRules(root.at("rules"), root.get("rules"), c.Tiers, tiersOK)
	errs.add(err)
	if err := errs.err(); err != nil {
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
