package rule

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
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

// FieldError is a validation error: Field is the JSON path of the offending value
// (e.g. "rules[2].limit"; "" for the document as a whole, which Error calls
// "configuration") and Msg says what is wrong with
// it, quoting the value. Err is the underlying cause when there is one (a regexp or
// duration parse error).
type FieldError struct {
	Field string
	Msg   string
	Err   error
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "configuration: " + e.Msg
	}
	return e.Field + ": " + e.Msg
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldErrorf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

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

// object is a JSON object whose field names have been checked against the allowed
// set: unknown and duplicate fields are errors, and an explicit null reads as absent
// (generated configs often write null for "not set").
type object struct {
	path   string
	fields map[string]gjson.Result
}

func parseObject(path string, v gjson.Result, allowed ...string) (*object, error) {
	if !v.IsObject() {
		return nil, typeError(path, "an object", v)
	}
	o := &object{path: path, fields: make(map[string]gjson.Result, len(allowed))}
	var err error
	v.ForEach(func(k, val gjson.Result) bool {
		name := k.String()
		if !contains(allowed, name) {
			err = fieldErrorf(joinPath(path, name), "unknown field")
			return false
		}
		if _, dup := o.fields[name]; dup {
			err = fieldErrorf(joinPath(path, name), "duplicate field")
			return false
		}
		o.fields[name] = val
		return true
	})
	if err != nil {
		return nil, err
	}
	return o, nil
}

func (o *object) get(name string) gjson.Result {
	v := o.fields[name]
	if v.Type == gjson.Null {
		return gjson.Result{}
	}
	return v
}

func (o *object) has(name string) bool { return o.get(name).Exists() }

func (o *object) at(name string) string { return joinPath(o.path, name) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// joinPath appends a field name to a JSON path; names that are not plain identifiers
// are written as ["name"] so the path stays unambiguous.
func joinPath(path, name string) string {
	plain := name != ""
	for i := 0; i < len(name); i++ {
		if !isIDByte(name[i]) {
			plain = false
			break
		}
	}
	if !plain {
		return path + "[" + strconv.Quote(name) + "]"
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// show renders an offending JSON value for an error message: compacted (whitespace
// outside strings dropped) and shortened so a huge value cannot flood a log line.
func show(v gjson.Result) string {
	raw := v.Raw
	var b strings.Builder
	inString, escaped := false, false
	for i := 0; i < len(raw) && b.Len() <= maxShownValue; i++ {
		c := raw[i]
		switch {
		case inString:
			inString = escaped || c != '"'
			escaped = !escaped && c == '\\'
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		b.WriteByte(c)
	}
	if out := b.String(); len(out) > maxShownValue {
		return out[:maxShownValue] + "..."
	}
	return b.String()
}

func quoteShort(s string) string {
	if len(s) > maxShownValue {
		return strconv.Quote(s[:maxShownValue]) + "..."
	}
	return strconv.Quote(s)
}

func typeError(path, want string, v gjson.Result) *FieldError {
	return fieldErrorf(path, "must be %s, got %s", want, show(v))
}

func parseString(path string, v gjson.Result) (string, error) {
	if v.Type != gjson.String {
		return "", typeError(path, "a string", v)
	}
	return v.Str, nil
}

func parseBool(path string, v gjson.Result) (bool, error) {
	if !v.IsBool() {
		return false, typeError(path, "true or false", v)
	}
	return v.Bool(), nil
}

// parseInt reads an integer in [lo, hi]. JSON numbers are read from their raw text,
// never through float64, so 1.5 and 1e3 are refused instead of rounded.
func parseInt(path string, v gjson.Result, lo, hi int64) (int64, error) {
	if v.Type != gjson.Number {
		return 0, typeError(path, "an integer", v)
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil {
		if strings.ContainsAny(v.Raw, ".eE") {
			return 0, typeError(path, "an integer", v)
		}
		// Out of int64 range: report against the bound it broke.
		if strings.HasPrefix(v.Raw, "-") {
			return 0, rangeError(path, lo, v.Raw)
		}
		return 0, fieldErrorf(path, "must be <= %d, got %s", hi, show(v))
	}
	if n < lo {
		return 0, rangeError(path, lo, v.Raw)
	}
	if n > hi {
		return 0, fieldErrorf(path, "must be <= %d, got %s", hi, show(v))
	}
	return n, nil
}

func rangeError(path string, lo int64, raw string) *FieldError {
	if len(raw) > maxShownValue {
		raw = raw[:maxShownValue] + "..."
	}
	if lo == 1 {
		return fieldErrorf(path, "must be > 0, got %s", raw)
	}
	return fieldErrorf(path, "must be >= %d, got %s", lo, raw)
}

func parseUint(path string, v gjson.Result) (uint64, error) {
	if v.Type != gjson.Number {
		return 0, typeError(path, "a non-negative integer", v)
	}
	n, err := strconv.ParseUint(v.Raw, 10, 64)
	if err != nil {
		if strings.HasPrefix(v.Raw, "-") {
			return 0, fieldErrorf(path, "must be >= 0, got %s", show(v))
		}
		if strings.ContainsAny(v.Raw, ".eE") {
			return 0, typeError(path, "a non-negative integer", v)
		}
		return 0, fieldErrorf(path, "must be < 2^64, got %s", show(v))
	}
	return n, nil
}

// parseArray returns the elements of a JSON array of at most max entries.
func parseArray(path string, v gjson.Result, max int) ([]gjson.Result, error) {
	if !v.IsArray() {
		return nil, typeError(path, "an array", v)
	}
	n := 0
	v.ForEach(func(_, _ gjson.Result) bool { n++; return n <= max })
	if n > max {
		return nil, fieldErrorf(path, "has more than %d entries", max)
	}
	return v.Array(), nil
}

func parseStrings(path string, v gjson.Result, max int) ([]string, error) {
	elems, err := parseArray(path, v, max)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(elems))
	for i, e := range elems {
		s, err := parseString(indexPath(path, i), e)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// parseDuration reads a Go duration string ("1m", "500ms") or an integer number of
// milliseconds, whole milliseconds only: the sync protocol carries windows in ms, and
// a window the filter and the service round differently would be two different limits.
func parseDuration(path string, v gjson.Result, lo, hi time.Duration) (time.Duration, error) {
	var d time.Duration
	switch v.Type {
	case gjson.Number:
		ms, err := parseInt(path, v, lo.Milliseconds(), hi.Milliseconds())
		if err != nil {
			return 0, err
		}
		return time.Duration(ms) * time.Millisecond, nil
	case gjson.String:
		var err error
		d, err = time.ParseDuration(v.Str)
		if err != nil {
			return 0, &FieldError{Field: path, Msg: fmt.Sprintf("invalid duration %s (want e.g. \"1s\", \"1m\", \"500ms\" or integer milliseconds)", quoteShort(v.Str)), Err: err}
		}
	default:
		return 0, typeError(path, "a duration string or integer milliseconds", v)
	}
	if d < lo {
		return 0, fieldErrorf(path, "must be >= %s, got %s", lo, quoteShort(v.Str))
	}
	if d > hi {
		return 0, fieldErrorf(path, "must be <= %s, got %s", hi, quoteShort(v.Str))
	}
	if d%time.Millisecond != 0 {
		return 0, fieldErrorf(path, "must be a whole number of milliseconds, got %s", quoteShort(v.Str))
	}
	return d, nil
}

func isIDByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '-' || b == '.'
}

// validID checks [A-Za-z0-9_.-]{1,64}: ids end up in Redis keys
// ("rl:{key}:<id>:<window>"), metrics labels and headers, so ":" and spaces are out.
func validID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isIDByte(s[i]) {
			return false
		}
	}
	return true
}

func parseID(path string, v gjson.Result, what string) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if !validID(s) {
		return "", fieldErrorf(path, "invalid %s %s: must match [A-Za-z0-9_.-]{1,%d}", what, quoteShort(s), MaxIDLen)
	}
	return s, nil
}

// isTchar reports an RFC 9110 token character (header names, methods).
func isTchar(b byte) bool {
	if b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}

// parseHeaderName returns a lower-case header name; a leading ":" is allowed for
// Envoy's pseudo-headers (":authority").
func parseHeaderName(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	name := strings.TrimPrefix(s, ":")
	ok := name != "" && len(s) <= 128
	for i := 0; ok && i < len(name); i++ {
		ok = isTchar(name[i])
	}
	if !ok {
		return "", fieldErrorf(path, "invalid header name %s", quoteShort(s))
	}
	return strings.ToLower(s), nil
}

// printable reports whether s is non-empty, visible ASCII without spaces: safe in a
// header value and a log line.
func printable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func parseToken(path string, v gjson.Result, max int) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", nil
	}
	if len(s) > max {
		return "", fieldErrorf(path, "must be at most %d bytes, got %d", max, len(s))
	}
	if !printable(s) {
		return "", fieldErrorf(path, "must be visible ASCII without spaces, got %s", quoteShort(s))
	}
	return s, nil
}

func parseSync(path string, v gjson.Result) (Sync, error) {
	s := Sync{
		IntervalMs: 100, TimeoutMs: 250, LeaseTTLMs: 60000, StaleMs: 10000, MaxBatch: 1000, MaxPending: 10000,
		ExpectedNodes: 1, BreakerFailures: 3, BreakerOpenMs: 1000, IdleTTLMs: 120000, TableSlots: 65536,
	}
	if !v.Exists() {
		return s, nil
	}
	o, err := parseObject(path, v, "cluster", "authority", "secret", "node", "interval_ms", "timeout_ms",
		"lease_ttl_ms", "stale_ms", "max_batch", "max_pending", "expected_nodes", "breaker_failures", "breaker_open_ms", "idle_ttl_ms", "table_slots")
	if err != nil {
		return s, err
	}
	strs := []struct {
		name string
		dst  *string
		max  int
	}{
		{"cluster", &s.Cluster, 256},
		{"authority", &s.Authority, 256},
		{"secret", &s.Secret, 1024},
		{"node", &s.Node, wire.MaxStringLen},
	}
	for _, f := range strs {
		if fv := o.get(f.name); fv.Exists() {
			if *f.dst, err = parseToken(o.at(f.name), fv, f.max); err != nil {
				return s, err
			}
		}
	}
	if s.Authority == "" {
		s.Authority = s.Cluster
	}
	ints := []struct {
		name   string
		dst    *int64
		lo, hi int64
	}{
		{"interval_ms", &s.IntervalMs, 10, 60000},
		{"timeout_ms", &s.TimeoutMs, 1, 60000},
		{"lease_ttl_ms", &s.LeaseTTLMs, 1, 600000},
		{"stale_ms", &s.StaleMs, 10, 600000},
		{"max_batch", &s.MaxBatch, 1, wire.MaxDeltas},
		{"max_pending", &s.MaxPending, 1, 1_000_000},
		{"expected_nodes", &s.ExpectedNodes, 1, 10000},
		{"breaker_failures", &s.BreakerFailures, 1, 1000},
		{"breaker_open_ms", &s.BreakerOpenMs, 1, 3_600_000},
		{"idle_ttl_ms", &s.IdleTTLMs, 1000, 7 * 24 * 3_600_000},
		{"table_slots", &s.TableSlots, 64, 1 << 22},
	}
	for _, f := range ints {
		if fv := o.get(f.name); fv.Exists() {
			if *f.dst, err = parseInt(o.at(f.name), fv, f.lo, f.hi); err != nil {
				return s, err
			}
		}
	}
	// A lease that expires before the next tick could ever renew it would make every
	// node drop its lease between syncs.
	if s.LeaseTTLMs < s.IntervalMs {
		return s, fieldErrorf(o.at("lease_ttl_ms"), "must be >= sync.interval_ms (%d), got %d", s.IntervalMs, s.LeaseTTLMs)
	}
	if s.StaleMs < s.IntervalMs {
		return s, fieldErrorf(o.at("stale_ms"), "must be >= sync.interval_ms (%d), got %d", s.IntervalMs, s.StaleMs)
	}
	return s, nil
}

// parseKeySource parses {"source": ..., ...}; depth counts composite parts and
// fallbacks so a config cannot make extraction recurse without bound.
func parseKeySource(path string, v gjson.Result, depth int) (KeySource, error) {
	var k KeySource
	if depth > maxKeyDepth {
		return k, fieldErrorf(path, "key sources nested deeper than %d levels", maxKeyDepth)
	}
	o, err := parseObject(path, v, "source", "name", "claim", "header", "trusted_hops", "parts", "fallback")
	if err != nil {
		return k, err
	}
	if !o.has("source") {
		return k, fieldErrorf(o.at("source"), "required (header, jwt, ip, route or composite)")
	}
	src, err := parseString(o.at("source"), o.get("source"))
	if err != nil {
		return k, err
	}
	var allowed []string
	switch src {
	case "header":
		k.Kind, allowed = KeyHeader, []string{"name"}
	case "jwt":
		k.Kind, allowed = KeyJWTClaim, []string{"claim", "header"}
	case "ip":
		k.Kind, allowed = KeyIP, []string{"trusted_hops"}
	case "route":
		k.Kind = KeyRoute
	case "composite":
		k.Kind, allowed = KeyComposite, []string{"parts"}
	default:
		return k, fieldErrorf(o.at("source"), "unknown key source %s (want header, jwt, ip, route or composite)", quoteShort(src))
	}
	// Fields of another source are errors in document order, like unknown fields.
	var bad string
	v.ForEach(func(key, _ gjson.Result) bool {
		name := key.String()
		if name != "source" && name != "fallback" && !contains(allowed, name) && o.has(name) {
			bad = name
			return false
		}
		return true
	})
	if bad != "" {
		return k, fieldErrorf(o.at(bad), "unknown field for source %q", src)
	}
	switch k.Kind {
	case KeyHeader:
		if !o.has("name") {
			return k, fieldErrorf(o.at("name"), "required for source \"header\"")
		}
		if k.Header, err = parseHeaderName(o.at("name"), o.get("name")); err != nil {
			return k, err
		}
	case KeyJWTClaim:
		if !o.has("claim") {
			return k, fieldErrorf(o.at("claim"), "required for source \"jwt\"")
		}
		if k.Claim, err = parseClaim(o.at("claim"), o.get("claim")); err != nil {
			return k, err
		}
		k.Header = "authorization"
		if hv := o.get("header"); hv.Exists() {
			if k.Header, err = parseHeaderName(o.at("header"), hv); err != nil {
				return k, err
			}
		}
	case KeyIP:
		if hv := o.get("trusted_hops"); hv.Exists() {
			n, err := parseInt(o.at("trusted_hops"), hv, 0, maxTrustedHops)
			if err != nil {
				return k, err
			}
			k.TrustedHops = int(n)
		}
	case KeyComposite:
		if !o.has("parts") {
			return k, fieldErrorf(o.at("parts"), "required for source \"composite\"")
		}
		elems, err := parseArray(o.at("parts"), o.get("parts"), maxParts)
		if err != nil {
			return k, err
		}
		if len(elems) < 2 {
			return k, fieldErrorf(o.at("parts"), "needs at least 2 parts, got %d", len(elems))
		}
		k.Parts = make([]KeySource, len(elems))
		for i, e := range elems {
			if k.Parts[i], err = parseKeySource(indexPath(o.at("parts"), i), e, depth+1); err != nil {
				return k, err
			}
		}
	}
	if fv := o.get("fallback"); fv.Exists() {
		fb, err := parseKeySource(o.at("fallback"), fv, depth+1)
		if err != nil {
			return k, err
		}
		k.Fallback = &fb
	}
	return k, nil
}

// parseClaim accepts a gjson path of plain names ("sub", "org.id", "https://x\.io/tenant"
// with "\." for a literal dot). Query, wildcard and modifier syntax is refused: a key
// must be one value, and modifiers would let a config run arbitrary gjson machinery
// on every request.
func parseClaim(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	ok := s != "" && len(s) <= 256 && s[0] != '.' && s[len(s)-1] != '.' && !strings.Contains(s, "..")
	for i := 0; ok && i < len(s); i++ {
		b := s[i]
		ok = b > ' ' && b < 0x7f && strings.IndexByte(`@#|*?()!=<>%,[]{}"`, b) < 0
	}
	if !ok {
		return "", fieldErrorf(path, "invalid claim path %s: want names separated by \".\" (no wildcards, queries or modifiers)", quoteShort(s))
	}
	return s, nil
}

// parseGlob validates a key glob: "*" and "?" are the only special characters.
func parseGlob(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fieldErrorf(path, "must not be empty")
	}
	if len(s) > maxPatternLen {
		return "", fieldErrorf(path, "must be at most %d bytes, got %d", maxPatternLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return "", fieldErrorf(path, "invalid glob %s: control character", quoteShort(s))
		}
	}
	return s, nil
}

func parseList(path string, v gjson.Result) ([]Pattern, error) {
	if !v.Exists() {
		return nil, nil
	}
	elems, err := parseArray(path, v, MaxListEntries)
	if err != nil {
		return nil, err
	}
	out := make([]Pattern, 0, len(elems))
	for i, e := range elems {
		p, err := parsePattern(indexPath(path, i), e)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePattern classifies an allow/deny entry. An entry that parses as an IP address
// is an IP; an entry that contains "/" and only the characters of an address
// (hex digits, ".", ":") must be a valid CIDR — so a typo such as "10.0.0.0/33" is an
// error, not a key glob that silently never matches; anything else is a key glob.
func parsePattern(path string, v gjson.Result) (Pattern, error) {
	s, err := parseGlob(path, v)
	if err != nil {
		return Pattern{}, err
	}
	p := Pattern{Raw: s}
	if looksLikeCIDR(s) {
		n, err := parseCIDR(s)
		if err != nil {
			return p, &FieldError{Field: path, Msg: fmt.Sprintf("invalid CIDR %s: %v", quoteShort(s), err), Err: err}
		}
		p.CIDR = n
		return p, nil
	}
	if n, err := parseIPNet(s); n != nil || err != nil {
		if err != nil {
			return p, &FieldError{Field: path, Msg: fmt.Sprintf("invalid IP %s: %v", quoteShort(s), err), Err: err}
		}
		p.CIDR = n
		return p, nil
	}
	p.Glob = s
	return p, nil
}

func looksLikeCIDR(s string) bool {
	slash := strings.IndexByte(s, '/')
	if slash < 0 {
		return false
	}
	sep := false
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b == '.' || b == ':':
			sep = true
		case b == '/' || b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F':
		default:
			return false
		}
	}
	return sep
}

// parseHost validates a host glob: lower-cased, no port (ports are stripped from the
// request's host before matching, so a pattern with one could never match), a trailing
// dot dropped and IPv6 brackets removed, like the request's host.
func parseHost(path string, v gjson.Result) (string, error) {
	s, err := parseGlob(path, v)
	if err != nil {
		return "", err
	}
	h := strings.TrimSuffix(strings.ToLower(s), ".")
	v6 := len(h) > 2 && h[0] == '[' && h[len(h)-1] == ']'
	if v6 {
		h = h[1 : len(h)-1]
	}
	for i := 0; i < len(h); i++ {
		b := h[i]
		switch {
		case b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '.' || b == '_' || b == '*' || b == '?':
		case b == ':' && v6:
		case b == ':':
			return "", fieldErrorf(path, "host %s must not include a port (write IPv6 addresses in brackets)", quoteShort(s))
		default:
			return "", fieldErrorf(path, "invalid host %s", quoteShort(s))
		}
	}
	if h == "" {
		return "", fieldErrorf(path, "invalid host %s", quoteShort(s))
	}
	return h, nil
}

func parseRegex(path string, v gjson.Result) (*regexp.Regexp, error) {
	s, err := parseString(path, v)
	if err != nil {
		return nil, err
	}
	if s == "" {
		return nil, fieldErrorf(path, "must not be empty")
	}
	if len(s) > maxRegexLen {
		return nil, fieldErrorf(path, "must be at most %d bytes, got %d", maxRegexLen, len(s))
	}
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, &FieldError{Field: path, Msg: fmt.Sprintf("invalid regex %s: %v", quoteShort(s), err), Err: err}
	}
	return re, nil
}

// parsePrefix validates a path prefix and stores it normalised, so "/api/" and "/api"
// mean the same and match the normalised request path.
func parsePrefix(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(s, "/") {
		return "", fieldErrorf(path, "must start with \"/\", got %s", quoteShort(s))
	}
	if len(s) > 1024 {
		return "", fieldErrorf(path, "must be at most 1024 bytes, got %d", len(s))
	}
	if strings.ContainsAny(s, "?#") {
		return "", fieldErrorf(path, "must not contain a query or fragment, got %s", quoteShort(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return "", fieldErrorf(path, "invalid path %s: use percent-encoding for spaces and non-ASCII", quoteShort(s))
		}
	}
	return NormalizePath(s), nil
}

func parseMatch(path string, v gjson.Result) (Match, error) {
	var m Match
	if !v.Exists() {
		return m, nil
	}
	o, err := parseObject(path, v, "prefix", "regex", "methods", "hosts")
	if err != nil {
		return m, err
	}
	if pv := o.get("prefix"); pv.Exists() {
		if m.Prefix, err = parsePrefix(o.at("prefix"), pv); err != nil {
			return m, err
		}
	}
	if rv := o.get("regex"); rv.Exists() {
		if m.Regex, err = parseRegex(o.at("regex"), rv); err != nil {
			return m, err
		}
	}
	if mv := o.get("methods"); mv.Exists() {
		methods, err := parseStrings(o.at("methods"), mv, maxMethods)
		if err != nil {
			return m, err
		}
		for i, s := range methods {
			ok := s != "" && len(s) <= 32
			for j := 0; ok && j < len(s); j++ {
				ok = isTchar(s[j])
			}
			if !ok {
				return m, fieldErrorf(indexPath(o.at("methods"), i), "invalid method %s", quoteShort(s))
			}
			methods[i] = strings.ToUpper(s)
		}
		m.Methods = methods
	}
	if hv := o.get("hosts"); hv.Exists() {
		elems, err := parseArray(o.at("hosts"), hv, maxHosts)
		if err != nil {
			return m, err
		}
		m.Hosts = make([]string, len(elems))
		for i, e := range elems {
			if m.Hosts[i], err = parseHost(indexPath(o.at("hosts"), i), e); err != nil {
				return m, err
			}
		}
	}
	return m, nil
}

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

// parseLimits reads the limit/window/burst shorthand or the windows list of o (a rule,
// a rule's tier entry or an override): exactly one of the two forms.
func parseLimits(o *object, kind algo.Kind) ([]algo.Params, error) {
	short := o.has("limit") || o.has("window") || o.has("burst")
	if o.has("windows") {
		if short {
			return nil, fieldErrorf(o.at("windows"), "cannot be combined with \"limit\", \"window\" or \"burst\"; put every window in \"windows\"")
		}
		elems, err := parseArray(o.at("windows"), o.get("windows"), MaxWindows)
		if err != nil {
			return nil, err
		}
		if len(elems) == 0 {
			return nil, fieldErrorf(o.at("windows"), "must have at least one window")
		}
		out := make([]algo.Params, len(elems))
		for i, e := range elems {
			wo, err := parseObject(indexPath(o.at("windows"), i), e, "limit", "window", "burst")
			if err != nil {
				return nil, err
			}
			if out[i], err = parseWindow(wo, kind, ""); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	w, err := parseWindow(o, kind, " (or \"windows\")")
	if err != nil {
		return nil, err
	}
	return []algo.Params{w}, nil
}

func parseWindow(o *object, kind algo.Kind, alt string) (algo.Params, error) {
	p := algo.Params{Kind: kind}
	if !o.has("limit") {
		return p, fieldErrorf(o.at("limit"), "required%s", alt)
	}
	if !o.has("window") {
		return p, fieldErrorf(o.at("window"), "required%s", alt)
	}
	var err error
	if p.Limit, err = parseInt(o.at("limit"), o.get("limit"), 1, MaxLimit); err != nil {
		return p, err
	}
	if kind == algo.SlidingWindowLog && p.Limit > MaxLogLimit {
		return p, fieldErrorf(o.at("limit"), "must be <= %d for sliding_window_log (its state grows with the limit), got %d", MaxLogLimit, p.Limit)
	}
	d, err := parseDuration(o.at("window"), o.get("window"), MinWindow, MaxWindow)
	if err != nil {
		return p, err
	}
	p.WindowUs = d.Microseconds()
	if bv := o.get("burst"); bv.Exists() {
		if p.Burst, err = parseInt(o.at("burst"), bv, 0, MaxLimit); err != nil {
			return p, err
		}
		// The window algorithms ignore burst; accepting it would let an operator believe
		// a capacity is configured that nothing enforces.
		if p.Burst != 0 && kind != algo.TokenBucket && kind != algo.GCRA {
			return p, fieldErrorf(o.at("burst"), "only token_bucket and gcra use burst, the rule's algorithm is %s", AlgorithmName(kind))
		}
	}
	return p, nil
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
