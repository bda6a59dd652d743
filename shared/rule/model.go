// Package rule is the configuration operators write: one schema for the filter's plugin
// configuration (JSON, as Istio's pluginConfig and Envoy's configuration deliver it) and
// for the sync service's rules API. It parses with gjson (no reflection, builds for
// wasip1), validates with errors that name the field and the offending value, and
// matches requests to rules deterministically.
//
// Precedence and matching (documented in README "Configuration"; SCHEMA.md beside this
// file holds the schema):
//   - Deny list first (403), then allow list (bypass), both by key glob or client-IP CIDR.
//   - Every rule whose match block matches the request applies, in config order; a
//     request is admitted only if every applicable rule admits it (this is how
//     hierarchical limits — tenant cap plus per-user limit — are written).
//   - Within a rule the limits come from: per-key override (first matching glob in
//     config order) > tier (the request's tier, chosen by the first tier definition that
//     matches) > the rule's own windows.
//   - A request's cost is the first matching entry of the rule's costs list, else the
//     rule's cost (default 1).
//
// A Config returned by Parse is immutable: Apply, Tier, CheckLists and RuleByID read it
// from any number of goroutines (the service) or on every request (the filter) without
// locks, and Parse builds lookup indexes that would go stale if the exported slices were
// edited afterwards. A Config built by hand (tests, the service's Go twin) works too; it
// just matches by linear scan.
package rule

import (
	"regexp"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// Config is a whole rule set.
type Config struct {
	// Version is the rule-set version (the service assigns it; plugin configs may set it).
	Version uint64
	// Sync configures the filter's connection to the sync service (filter only; ignored by
	// the service).
	Sync Sync
	// Telemetry chooses what the filter reports beyond its fixed stats (filter only;
	// ignored by the service).
	Telemetry Telemetry
	// RetryJitterMs bounds the random jitter added to Retry-After (default 1000 when the
	// field is absent; an explicit 0 disables jitter).
	RetryJitterMs int64
	Allow         []Pattern // bypass: key globs and CIDRs
	Deny          []Pattern // 403: key globs and CIDRs
	Tiers         []Tier    // tier definitions, first match wins
	Rules         []Rule
	// DefaultKey is the key source used by rules that do not set one
	// (default: header x-api-key, falling back to the client IP).
	DefaultKey KeySource
	// TrustedHops is the x-forwarded-for depth used to find the client IP for the
	// allow/deny CIDRs (see ClientIP). Default: the trusted_hops of the first "ip" source
	// in DefaultKey (depth first), else 0 (the peer address).
	TrustedHops int
	// Enforcement is the fleet-wide lever: on (default), shadow (every rule decides and
	// reports but never refuses) or off (no rule applies). See levers.go.
	Enforcement Enforcement
	// KeyHashing says which caller keys the sync service stores as keyed hashes
	// (default HashIPKeys).
	KeyHashing KeyHashing

	allowIdx, denyIdx *listIndex     // built by Parse; nil: linear scan
	tierIdx           []*globSet     // parallel to Tiers; nil: linear scan
	byID              map[string]int // rule id -> index in Rules
}

// Sync is the filter's sync-service settings.
type Sync struct {
	Cluster    string // Envoy cluster name of the service (empty: sync disabled, local only)
	Authority  string // :authority for callouts (default: Cluster)
	Secret     string // shared secret sent as "authorization: Bearer <secret>"
	Node       string // gateway id (default: random at start)
	IntervalMs int64  // tick (default 100)
	TimeoutMs  int64  // callout timeout (default 250)
	LeaseTTLMs int64  // longest a lease is used, whatever validity the service grants (default 60000); a slow key's, for eight of its gaps when longer (lease.UseUs)
	StaleMs    int64  // longest consumption no valid lease covers waits unreported (default 10000)
	// StaleLeasedMs is the longest consumption out of a valid lease waits unreported: 0
	// (the default) until the lease's renewal or low-water mark, which the service counts
	// as reserved meanwhile; stale_ms written in the configuration sets it too.
	StaleLeasedMs   int64
	MaxBatch        int64 // deltas per callout (default 1000, max wire.MaxDeltas)
	MaxPending      int64 // accepted and not used (default 10000): the filter's urgent list is fixed, the staleness scan finds the rest
	ExpectedNodes   int64 // fleet size assumed before the first reply (default 1)
	BreakerFailures int64 // consecutive failed syncs that open the breaker (default 3)
	BreakerOpenMs   int64 // longest backoff between syncs while failing (default 1000)
	IdleTTLMs       int64 // buckets idle this long are dropped from shared data (default 120000)
	TableSlots      int64 // shared-data slots for buckets: memory is bounded by them (default 65536)
}

// Telemetry is what the filter reports per decision. Both default to on; an operator
// turns one off to save its cost (a few host calls per request) or, for the metadata, when
// the access log must not carry even a key's hash.
type Telemetry struct {
	// RuleStats: per-rule stats (tollgate.rule.* with a rule tag, see the README).
	RuleStats bool
	// DecisionMetadata: each decision is set as the filter state "wasm.tollgate" (rule,
	// decision, remaining, limit, degraded, key hash) for the access log.
	DecisionMetadata bool
	// KeyHashSecret, when set, makes the metadata's key name the keyed one
	// (keyhash.AppendKeyed): the name the sync service, started with the same secret in
	// --key-hash-secret-file, uses in Redis, its logs and /v1/top. Empty: the unkeyed
	// SHA-256 prefix (keyhash.Append), from which an IP or any guessable key is recovered
	// by trying candidates.
	KeyHashSecret string
}

// Pattern is one allow/deny entry: a key glob (`*`, `?`) or an IP/CIDR.
type Pattern struct {
	Raw  string
	Glob string // set when the entry is a glob
	CIDR *IPNet // set when the entry is an IP or CIDR
}

// IPNet is a parsed CIDR (net/netip would do, but is kept behind this type so the
// matching code stays in one place).
type IPNet struct {
	Addr [16]byte
	Bits int // prefix length in the 16-byte (IPv4-mapped) form
}

// Tier defines how a request's tier is chosen.
type Tier struct {
	Name   string
	Keys   []string // key globs
	Header string   // or a request header...
	Values []string // ...with one of these values
}

// FailMode is what a rule does while the sync service is unreachable.
type FailMode uint8

const (
	FailOpen FailMode = iota
	FailClosed
)

// Rule is one rate-limit rule.
type Rule struct {
	ID      string
	Version uint64
	Match   Match
	// Key is the rule's key source; the zero KeySource (see IsZero) means
	// Config.DefaultKey, which lets Apply extract the default key once per request.
	Key     KeySource
	Algo    algo.Kind
	Windows []algo.Params // at least one; all share Algo (a fixed_window's "calendar" windows are algo.Calendar)
	Cost    int64         // default 1; with CostFrom, the estimate charged on admission
	Costs   []RouteCost
	// CostFrom, when set, charges what the response reports beyond the cost when the
	// response ends (the filter; the service charges what gateways report).
	CostFrom *CostFrom
	// MaxDelayUs, when > 0, shapes instead of refusing: a request the rule would refuse
	// but admit within this long is held by the filter until its permit's time (taken
	// ahead, as debt) and then let through; later ones are refused as usual.
	MaxDelayUs int64
	Tiers      map[string][]algo.Params // tier name -> windows
	Overrides  []Override
	Fail       FailMode
	Shadow     bool
	Strict     bool
	// DegradedLimit, when > 0, caps every window's limit (and burst) while the gateway
	// decides without the sync service (degraded): each gateway enforces at most it.
	DegradedLimit int64
	// ShadowBP is the share of caller keys, in 1/10000, for which the rule is shadowed
	// (10000 - rollout_percent × 100): 0 enforces it for every key. Which keys is fixed
	// by a hash of rule id and key (RolledOut).
	ShadowBP int64
	// Descriptors, when set, also selects the rule for Envoy rate limit service requests
	// (the sync service's gRPC ShouldRateLimit): a request descriptor that matches it is
	// charged to the same buckets as HTTP requests the rule matches.
	Descriptors *DescriptorMatch
	// DescriptorOnly is set for a rule with descriptors and no HTTP match: Apply (the
	// filter) leaves it out, only descriptors select it. A rule with both applies on
	// both paths, to one quota.
	DescriptorOnly bool
	// MissingKey is what happens to a request the rule matches but whose key cannot
	// be found (default: skip the rule).
	MissingKey MissingKey
	// MaxInFlight, when > 0, caps the requests of one caller key the rule admits that
	// have not ended yet (filter only: a request holds a slot from admission to the end
	// of its stream). A rule may have it without windows (ConcurrencyOnly).
	MaxInFlight int64
	// ColdStart is what a gateway does with a request of a key it holds no lease for:
	// decide it within the cold-start allowance (default), wait for the service, or
	// admit one request regardless (parse_coldstart.go).
	ColdStart ColdStart

	overrideIdx *globSet // built by Parse; nil: linear scan
}

// Override gives keys matching Glob their own windows.
type Override struct {
	Glob    string
	Windows []algo.Params
}

// RouteCost makes requests on a route cost more than one permit.
type RouteCost struct {
	Prefix string // segment-aware, like Match.Prefix
	Regex  *regexp.Regexp
	Cost   int64
}

// Match selects requests. Empty fields match everything.
type Match struct {
	// Prefix matches the normalised path segment-wise: "/search" matches "/search" and
	// "/search/x", not "/searching". "/" matches every path.
	Prefix  string
	Regex   *regexp.Regexp // against the normalised path
	Methods []string       // upper-case
	Hosts   []string       // globs, lower-case, port and IPv6 brackets stripped
	// Path is an exact normalised path ("" matches every path).
	Path string
	// Headers and Query must all hold (see ValueMatch); Not, when set, must not match.
	Headers []ValueMatch
	Query   []ValueMatch
	Not     *Match
}

// KeySourceKind says where a caller's key comes from.
type KeySourceKind uint8

const (
	KeyHeader KeySourceKind = iota
	KeyJWTClaim
	KeyIP
	KeyRoute
	KeyComposite
	KeyQuery    // a query parameter
	KeyProperty // a proxy property: dynamic metadata, filter state
)

// KeySource extracts a caller key from a request.
type KeySource struct {
	Kind        KeySourceKind
	Header      string      // KeyHeader: header name (lower-case); KeyJWTClaim: header carrying the bearer token (default authorization)
	Claim       string      // KeyJWTClaim: gjson path into the token payload
	TrustedHops int         // KeyIP: x-forwarded-for hops added by trusted proxies (0: use the peer address)
	Parts       []KeySource // KeyComposite: joined with ":"
	Fallback    *KeySource  // used when this source yields nothing
	Query       string      // KeyQuery: parameter name
	Property    []string    // KeyProperty: the property path's tokens
	// StripPrefix (ASCII case-insensitive, then leading spaces) and Lower transform a
	// header, query or property value before it becomes the key.
	StripPrefix string
	Lower       bool
}

// Request is what matching and key extraction see of an HTTP request. Header names are
// lower-case (HTTP/2 and Envoy's header maps are).
type Request struct {
	Method string
	Host   string
	Path   string // without the query string (one is stripped if present)
	Header func(name string) (string, bool)
	// PeerAddr is the downstream peer (Envoy's source.address), "ip:port" or "ip".
	PeerAddr string
	// Peer, when set and PeerAddr is empty, is asked for the peer address the first time a
	// decision needs it (reading it costs the filter a host call that copies data in).
	Peer func() string
	// Query is the raw query string (without "?"); when empty it is taken from Path.
	Query string
	// Property reads a proxy property by its path's tokens (dynamic metadata, filter
	// state); nil: none.
	Property func(path []string) (string, bool)
	// KeyBuf, when set, is where keys that must be built (composite keys, lower-cased
	// values) are appended instead of allocated: those keys then alias it and are valid
	// until the caller reuses it.
	KeyBuf *[]byte
}

// Applied is one rule applied to one request: the resolved key, limits and cost.
// Windows aliases the Config's memory and must not be modified.
type Applied struct {
	Rule    *Rule
	Key     string        // caller key (empty: rule skipped, key not found)
	Windows []algo.Params // after override > tier > default
	Tier    string        // tier whose windows apply, or "" (override or rule default)
	Cost    int64
	// Index is the rule's position in Config.Rules and Override 1 + the index of the
	// override whose windows apply (0: none), so a caller can keep what it derives
	// from each window (the filter's header text) beside the rule set.
	Index, Override int
	// Refuse, when non-zero, is the status (401 or 403) the request is refused with
	// because the rule's key is missing and its MissingKey policy denies; Key is then "".
	Refuse int
}
