package rule

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustParse(t testing.TB, doc string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func win(kind algo.Kind, limit int64, window string, burst int64) algo.Params {
	return algo.Params{Kind: kind, Limit: limit, WindowUs: durUs(window), Burst: burst}
}

func durUs(s string) int64 {
	units := map[string]int64{"ms": 1000, "s": 1e6, "m": 60e6, "h": 3600e6}
	for _, u := range []string{"ms", "s", "m", "h"} {
		if n, ok := strings.CutSuffix(s, u); ok {
			var v int64
			for _, c := range n {
				v = v*10 + int64(c-'0')
			}
			return v * units[u]
		}
	}
	panic("bad test duration " + s)
}

func TestParseFull(t *testing.T) {
	c, err := Parse(readFixture(t, "valid_full.json"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 3 || c.RetryJitterMs != 500 {
		t.Errorf("version %d jitter %d", c.Version, c.RetryJitterMs)
	}
	wantSync := Sync{Cluster: "tollgate_ratelimit", Authority: "ratelimit", Secret: "s3cret", Node: "gw-1",
		IntervalMs: 100, TimeoutMs: 250, LeaseTTLMs: 1000, StaleMs: 10000, MaxBatch: 1000, MaxPending: 10000, ExpectedNodes: 4,
		BreakerFailures: 3, BreakerOpenMs: 1000, IdleTTLMs: 120000, TableSlots: 65536}
	if c.Sync != wantSync {
		t.Errorf("sync = %+v, want %+v", c.Sync, wantSync)
	}
	if c.DefaultKey.Kind != KeyHeader || c.DefaultKey.Header != "x-api-key" ||
		c.DefaultKey.Fallback == nil || c.DefaultKey.Fallback.Kind != KeyIP || c.DefaultKey.Fallback.TrustedHops != 1 {
		t.Errorf("default key = %+v", c.DefaultKey)
	}
	if c.TrustedHops != 1 {
		t.Errorf("trusted hops = %d, want 1 (from the default key's ip source)", c.TrustedHops)
	}
	if len(c.Allow) != 4 || c.Allow[0].Glob != "sk_internal_*" || c.Allow[1].CIDR == nil || c.Allow[1].CIDR.Bits != 104 ||
		c.Allow[2].CIDR == nil || c.Allow[2].CIDR.Bits != 128 || c.Allow[3].CIDR == nil || c.Allow[3].CIDR.Bits != 32 {
		t.Errorf("allow = %+v", c.Allow)
	}
	if len(c.Deny) != 1 || c.Deny[0].Glob != "sk_revoked_*" || c.Deny[0].Raw != "sk_revoked_*" {
		t.Errorf("deny = %+v", c.Deny)
	}
	wantTiers := []Tier{{Name: "enterprise", Keys: []string{"sk_ent_*"}}, {Name: "pro", Header: "x-plan", Values: []string{"pro"}}, {Name: "free", Keys: []string{"*"}}}
	if !reflect.DeepEqual(c.Tiers, wantTiers) {
		t.Errorf("tiers = %+v", c.Tiers)
	}
	if len(c.Rules) != 5 {
		t.Fatalf("%d rules", len(c.Rules))
	}

	s := c.Rules[0]
	if s.ID != "search" || s.Version != 1 || s.Algo != algo.GCRA || s.Cost != 2 || s.Fail != FailClosed || !s.Shadow || !s.Strict {
		t.Errorf("search = %+v", s)
	}
	if s.Match.Prefix != "/search" || s.Match.Regex.String() != "^/v[0-9]+/search" ||
		!reflect.DeepEqual(s.Match.Methods, []string{"GET"}) || !reflect.DeepEqual(s.Match.Hosts, []string{"api.example.com", "*.example.org"}) {
		t.Errorf("search match = %+v", s.Match)
	}
	if s.Key.Kind != KeyJWTClaim || s.Key.Claim != "sub" || s.Key.Header != "authorization" || s.Key.Fallback == nil || s.Key.Fallback.Header != "x-api-key" {
		t.Errorf("search key = %+v", s.Key)
	}
	if !reflect.DeepEqual(s.Windows, []algo.Params{win(algo.GCRA, 30, "1m", 50)}) {
		t.Errorf("search windows = %+v", s.Windows)
	}
	if len(s.Costs) != 2 || s.Costs[0].Prefix != "/search/deep" || s.Costs[0].Cost != 10 || s.Costs[1].Regex == nil || s.Costs[1].Cost != 5 {
		t.Errorf("search costs = %+v", s.Costs)
	}
	wantRuleTiers := map[string][]algo.Params{
		"free":       {win(algo.GCRA, 100, "1m", 0)},
		"pro":        {win(algo.GCRA, 1000, "1m", 0)},
		"enterprise": {win(algo.GCRA, 100, "1s", 200), win(algo.GCRA, 10000, "1m", 0)},
	}
	if !reflect.DeepEqual(s.Tiers, wantRuleTiers) {
		t.Errorf("search tiers = %+v", s.Tiers)
	}
	if len(s.Overrides) != 1 || s.Overrides[0].Glob != "sk_live_big*" || !reflect.DeepEqual(s.Overrides[0].Windows, []algo.Params{win(algo.GCRA, 5000, "1m", 0)}) {
		t.Errorf("search overrides = %+v", s.Overrides)
	}

	tc := c.Rules[1]
	if tc.Key.Kind != KeyComposite || len(tc.Key.Parts) != 2 || tc.Key.Parts[0].Claim != "org.id" || tc.Key.Parts[0].Header != "x-token" || tc.Key.Parts[1].Kind != KeyRoute {
		t.Errorf("tenant-cap key = %+v", tc.Key)
	}
	wantWin := []algo.Params{win(algo.SlidingWindowCounter, 100, "1s", 0), win(algo.SlidingWindowCounter, 3000, "1m", 0), win(algo.SlidingWindowCounter, 100000, "1h", 0)}
	if !reflect.DeepEqual(tc.Windows, wantWin) || tc.Cost != 1 || tc.Fail != FailOpen || tc.Shadow {
		t.Errorf("tenant-cap = %+v", tc)
	}
	if g := c.Rules[2]; g.ID != "global.v2_x" || g.Shadow || !g.Key.IsZero() || !reflect.DeepEqual(g.Windows, []algo.Params{win(algo.SlidingWindowLog, 10000, "500ms", 0)}) {
		t.Errorf("global = %+v", g)
	}
	if f := c.Rules[3]; !reflect.DeepEqual(f.Windows, []algo.Params{win(algo.FixedWindow, 1, "24h", 0)}) {
		t.Errorf("fixed = %+v", f.Windows)
	}
	if tb := c.Rules[4]; !reflect.DeepEqual(tb.Windows, []algo.Params{win(algo.TokenBucket, 1000, "1ms", 0)}) {
		t.Errorf("tb = %+v", tb.Windows)
	}
	checkInvariants(t, c)
}

func TestParseDefaults(t *testing.T) {
	for _, name := range []string{"valid_empty.json", "valid_minimal.json"} {
		t.Run(name, func(t *testing.T) {
			c, err := Parse(readFixture(t, name))
			if err != nil {
				t.Fatal(err)
			}
			want := Sync{IntervalMs: 100, TimeoutMs: 250, LeaseTTLMs: 60000, StaleMs: 10000, MaxBatch: 1000, MaxPending: 10000,
				ExpectedNodes: 1, BreakerFailures: 3, BreakerOpenMs: 1000, IdleTTLMs: 120000, TableSlots: 65536}
			if c.Sync != want {
				t.Errorf("sync = %+v, want %+v", c.Sync, want)
			}
			if c.RetryJitterMs != 1000 || c.TrustedHops != 0 || c.Version != 0 {
				t.Errorf("jitter %d hops %d version %d", c.RetryJitterMs, c.TrustedHops, c.Version)
			}
			if !reflect.DeepEqual(c.DefaultKey, builtinDefaultKey()) {
				t.Errorf("default key = %+v", c.DefaultKey)
			}
			for _, r := range c.Rules {
				if r.Algo != algo.TokenBucket || r.Cost != 1 || r.Fail != FailOpen || r.Shadow || r.Strict || !r.Key.IsZero() {
					t.Errorf("rule defaults = %+v", r)
				}
			}
			checkInvariants(t, c)
		})
	}
}

func TestParseValues(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		check func(*Config) bool
	}{
		{"duration string ms", `{"rules":[{"id":"a","limit":1,"window":"250ms"}]}`,
			func(c *Config) bool { return c.Rules[0].Windows[0].WindowUs == 250_000 }},
		{"duration compound", `{"rules":[{"id":"a","limit":1,"window":"1m30s"}]}`,
			func(c *Config) bool { return c.Rules[0].Windows[0].WindowUs == 90_000_000 }},
		{"duration integer ms", `{"rules":[{"id":"a","limit":1,"window":1500}]}`,
			func(c *Config) bool { return c.Rules[0].Windows[0].WindowUs == 1_500_000 }},
		{"explicit zero jitter", `{"retry_jitter_ms":0}`,
			func(c *Config) bool { return c.RetryJitterMs == 0 }},
		{"telemetry defaults to on", `{}`,
			func(c *Config) bool { return c.Telemetry.RuleStats && c.Telemetry.DecisionMetadata }},
		{"telemetry switched off", `{"telemetry":{"rule_stats":false,"decision_metadata":false}}`,
			func(c *Config) bool { return !c.Telemetry.RuleStats && !c.Telemetry.DecisionMetadata }},
		{"authority defaults to cluster", `{"sync":{"cluster":"rl"}}`,
			func(c *Config) bool { return c.Sync.Authority == "rl" }},
		{"explicit trusted hops beats default key", `{"trusted_hops":2,"key":{"source":"ip","trusted_hops":1}}`,
			func(c *Config) bool { return c.TrustedHops == 2 }},
		{"trusted hops from composite part", `{"key":{"source":"composite","parts":[{"source":"header","name":"a"},{"source":"ip","trusted_hops":3}]}}`,
			func(c *Config) bool { return c.TrustedHops == 3 }},
		{"null reads as absent", `{"version":null,"rules":[{"id":"a","limit":1,"window":"1s","cost":null,"key":null}]}`,
			func(c *Config) bool { return c.Version == 0 && c.Rules[0].Cost == 1 && c.Rules[0].Key.IsZero() }},
		{"prefix normalised", `{"rules":[{"id":"a","limit":1,"window":"1s","match":{"prefix":"/api//v1/"}}]}`,
			func(c *Config) bool { return c.Rules[0].Match.Prefix == "/api/v1" }},
		{"host trailing dot and case", `{"rules":[{"id":"a","limit":1,"window":"1s","match":{"hosts":["API.Example.COM.","[::1]"]}}]}`,
			func(c *Config) bool {
				return c.Rules[0].Match.Hosts[0] == "api.example.com" && c.Rules[0].Match.Hosts[1] == "::1"
			}},
		{"pseudo header name", `{"key":{"source":"header","name":":Authority"}}`,
			func(c *Config) bool { return c.DefaultKey.Header == ":authority" }},
		{"key glob with slash is a glob", `{"allow":["abc/def*","deadbeef"]}`,
			func(c *Config) bool { return c.Allow[0].Glob == "abc/def*" && c.Allow[1].Glob == "deadbeef" }},
		{"ipv4-mapped ipv6 cidr", `{"allow":["::ffff:10.0.0.0/104"]}`,
			func(c *Config) bool { return c.Allow[0].CIDR != nil && c.Allow[0].CIDR.Bits == 104 }},
		{"rule tier limits", `{"tiers":[{"name":"a","keys":["x"]}],"rules":[{"id":"a","limit":1,"window":"1s","tiers":{"a":{"limit":2,"window":"1s"}}}]}`,
			func(c *Config) bool { return len(c.Rules[0].Tiers["a"]) == 1 }},
		{"max windows", `{"rules":[{"id":"a","windows":[{"limit":1,"window":"1s"},{"limit":2,"window":"2s"},{"limit":3,"window":"3s"},{"limit":4,"window":"4s"},{"limit":5,"window":"5s"},{"limit":6,"window":"6s"},{"limit":7,"window":"7s"},{"limit":8,"window":"8s"}]}]}`,
			func(c *Config) bool { return len(c.Rules[0].Windows) == MaxWindows }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.doc)
			if !tt.check(c) {
				t.Errorf("unexpected config: %+v", c)
			}
			checkInvariants(t, c)
		})
	}
}

// parseErrorCases maps every error fixture to the field its error must name and a part
// of the message. TestParseErrorFixturesListed keeps this table and testdata/ in step.
var parseErrorCases = []struct {
	fixture string
	field   string
	msg     string
}{
	{"unknown_algorithm.json", "rules[0].algorithm", `unknown algorithm "leaky"`},
	{"negative_limit.json", "rules[2].limit", "must be > 0, got -5"},
	{"bad_regex.json", "rules[1].match.regex", `invalid regex "(": error parsing regexp`},
	{"bad_cidr.json", "deny[3]", `invalid CIDR "10.0.0.0/33"`},
	{"duplicate_rule_id.json", "rules[4].id", `duplicate rule id "search" (first used by rules[1])`},
	{"unknown_field.json", "rules[0].foo", "unknown field"},
	{"undefined_tier.json", "rules[0].tiers.gold", `undefined tier "gold"`},
	{"both_limit_and_windows.json", "rules[0].windows", `cannot be combined with "limit"`},
	{"bad_duration.json", "rules[0].window", `invalid duration "1 minute"`},
	{"missing_limit.json", "rules[0].limit", "required"},
	{"missing_window.json", "rules[0].window", "required"},
	{"missing_limits.json", "rules[0].limit", `required (or "windows")`},
	{"missing_rule_id.json", "rules[0].id", "required"},
	{"bad_rule_id.json", "rules[0].id", `invalid rule id "search api"`},
	{"long_rule_id.json", "rules[0].id", "must match [A-Za-z0-9_.-]{1,64}"},
	{"zero_limit.json", "rules[0].limit", "must be > 0, got 0"},
	{"fractional_limit.json", "rules[0].limit", "must be an integer, got 1.5"},
	{"limit_above_maximum.json", "rules[0].limit", "must be <= " + itoa(algo.MaxLimit) + ", got 99999999999"},
	{"limit_overflows_int64.json", "rules[0].limit", "must be <= " + itoa(algo.MaxLimit) + ", got 99999999999999999999"},
	{"limit_faster_than_one_per_microsecond.json", "rules[1].limit", "1001 per 1000 µs is more than one permit per µs"},
	{"burst_takes_too_long_to_refill.json", "rules[0].burst", "takes longer than"},
	{"burst_above_maximum.json", "rules[0].burst", "must be <= " + itoa(algo.MaxBurst) + ", got 99999999999"},
	{"cost_above_maximum.json", "rules[0].cost", "must be <= " + itoa(algo.MaxCost) + ", got 99999999999"},
	{"tier_window_limit_above_maximum.json", "rules[0].tiers.pro.windows[1].limit", "must be <= " + itoa(algo.MaxLimit) + ", got 99999999999"},
	{"override_window_too_short.json", "rules[0].overrides[0].window", "must be >= " + formatUs(algo.MinWindowUs) + `, got "999us"`},
	{"window_not_a_duration_in_days.json", "rules[0].window", `invalid duration "3 days" (want e.g. "500ms", "1m", "1h30m", "30d" or integer milliseconds)`},
	{"several_errors.json", "deny[0]", `invalid CIDR "10.0.0.0/33"`},
	{"string_limit.json", "rules[0].limit", `must be an integer, got "100"`},
	{"window_longer_than_31_days.json", "rules[0].window", "must be <= " + formatUs(algo.MaxWindowUs) + `, got "32d"`},
	{"window_too_short.json", "rules[0].window", `must be >= 1ms, got "500us"`},
	{"window_sub_millisecond.json", "rules[0].window", `must be a whole number of milliseconds, got "1500us"`},
	{"window_zero_ms.json", "rules[0].window", "must be > 0, got 0"},
	{"window_negative.json", "rules[0].window", `must be >= 1ms, got "-1s"`},
	{"window_bad_type.json", "rules[0].window", "must be a duration string or integer milliseconds, got true"},
	{"negative_burst.json", "rules[0].burst", "must be >= 0, got -1"},
	{"burst_on_window_algorithm.json", "rules[0].burst", "only token_bucket and gcra use burst, the rule's algorithm is fixed_window"},
	{"zero_cost.json", "rules[0].cost", "must be > 0, got 0"},
	{"max_delay_on_window_algorithm.json", "rules[0].max_delay", "only token_bucket and gcra can delay requests, the rule's algorithm is fixed_window"},
	{"max_delay_bad_duration.json", "rules[0].max_delay", `invalid duration "2 seconds"`},
	{"max_delay_too_long.json", "rules[0].max_delay", `must be <= 1m0s, got "5m"`},
	{"max_delay_on_strict_rule.json", "rules[0].max_delay", `cannot be combined with "strict"`},
	{"cost_from_header_and_body.json", "rules[0].cost_from.body", `cannot be combined with "header"`},
	{"cost_from_empty.json", "rules[0].cost_from.header", `required (or "body")`},
	{"cost_from_body_path_with_query.json", "rules[0].cost_from.body", "no wildcards, queries or modifiers"},
	{"cost_from_max_body_too_small.json", "rules[0].cost_from.max_body_bytes", "must be >= 1024, got 100"},
	{"cost_from_bad_header_name.json", "rules[0].cost_from.header", `"x tokens"`},
	{"cost_from_on_strict_rule.json", "rules[0].cost_from", `cannot be combined with "strict"`},
	{"cost_from_max_body_with_header.json", "rules[0].cost_from.max_body_bytes", `only applies to "body"`},
	{"sliding_log_limit_above_maximum.json", "rules[0].limit", "must be <= " + itoa(algo.MaxLogLimit) + " for sliding_window_log (its state grows with the limit), got 99999999999"},
	{"too_many_windows.json", "rules[0].windows", "has more than 8 entries"},
	{"empty_windows.json", "rules[0].windows", "must have at least one window"},
	{"window_unknown_field.json", "rules[0].windows[1].size", "unknown field"},
	{"window_missing_limit.json", "rules[0].windows[1].limit", "required"},
	{"unknown_top_level_field.json", "ratelimits", "unknown field"},
	{"duplicate_field.json", "rules[0].limit", "duplicate field"},
	{"bad_method.json", "rules[0].match.methods[1]", `invalid method "GE T"`},
	{"host_with_port.json", "rules[0].match.hosts[0]", `host "api.example.com:8080" must not include a port`},
	{"bad_host.json", "rules[0].match.hosts[1]", `invalid host "api/example"`},
	{"bad_prefix.json", "rules[0].match.prefix", `must start with "/", got "search"`},
	{"prefix_with_query.json", "rules[0].match.prefix", `must not contain a query or fragment, got "/search?q=1"`},
	{"match_unknown_field.json", "rules[0].match.pathname", "unknown field"},
	{"match_not_object.json", "rules[0].match", `must be an object, got "/search"`},
	{"bad_key_source.json", "rules[0].key.source", `unknown key source "cookie"`},
	{"missing_key_source.json", "key.source", "required"},
	{"header_key_without_name.json", "rules[0].key.name", `required for source "header"`},
	{"key_field_for_other_source.json", "rules[0].key.claim", `unknown field for source "header"`},
	{"key_unknown_field.json", "rules[0].key.default", "unknown field"},
	{"bad_header_name.json", "rules[0].key.name", `invalid header name "x api key"`},
	{"jwt_without_claim.json", "rules[0].key.claim", `required for source "jwt"`},
	{"bad_claim_path.json", "rules[0].key.claim", `invalid claim path "sub|@reverse"`},
	{"composite_one_part.json", "rules[0].key.parts", "needs at least 2 parts, got 1"},
	{"composite_bad_part.json", "rules[0].key.parts[1].source", `unknown key source "cookie"`},
	{"key_nested_too_deep.json", "rules[0].key.fallback.fallback.fallback.fallback", "nested deeper than 4 levels"},
	{"trusted_hops_too_large.json", "rules[0].key.trusted_hops", "must be <= 16, got 17"},
	{"bad_fail_mode.json", "rules[0].fail", `must be "open" or "closed", got "maybe"`},
	{"telemetry_not_bool.json", "telemetry.rule_stats", "true or false"},
	{"telemetry_unknown_field.json", "telemetry.access_log", "unknown field"},
	{"shadow_not_bool.json", "rules[0].shadow", `must be true or false, got "yes"`},
	{"costs_prefix_and_regex.json", "rules[0].costs[0].regex", `cannot be combined with "prefix"`},
	{"costs_missing_cost.json", "rules[0].costs[1].cost", "required"},
	{"costs_missing_route.json", "rules[0].costs[0].prefix", `required (or "regex")`},
	{"costs_bad_regex.json", "rules[0].costs[0].regex", `invalid regex "[a-"`},
	{"override_missing_key.json", "rules[0].overrides[0].key", "required"},
	{"override_missing_window.json", "rules[0].overrides[0].window", `required (or "windows")`},
	{"override_empty_key.json", "rules[0].overrides[0].key", "must not be empty"},
	{"tier_missing_name.json", "tiers[0].name", "required"},
	{"duplicate_tier_name.json", "tiers[1].name", `duplicate tier name "pro"`},
	{"bad_tier_name.json", "tiers[0].name", `invalid tier name "gold tier"`},
	{"calendar_needs_fixed_window.json", "rules[0].calendar", `needs "algorithm": "fixed_window", the rule's algorithm is token_bucket`},
	{"calendar_on_sliding_window_counter.json", "rules[0].windows[0].calendar", `the rule's algorithm is sliding_window_counter`},
	{"calendar_with_window.json", "rules[0].window", `cannot be combined with "calendar"`},
	{"calendar_with_burst.json", "rules[0].burst", "only token_bucket and gcra use burst"},
	{"calendar_bad_period.json", "rules[0].calendar.period", `must be "day", "week" or "month", got "year"`},
	{"calendar_missing_period.json", "rules[0].calendar.period", "required"},
	{"calendar_bad_utc_offset.json", "rules[0].calendar.utc_offset", `must be "+HH:MM" or "-HH:MM" within ±14:00 (e.g. "+05:30", "-08:00"), got "+5:30"`},
	{"calendar_utc_offset_beyond_14h.json", "rules[0].calendar.utc_offset", `got "-14:30"`},
	{"calendar_time_zone_name.json", "rules[0].calendar.time_zone", "unknown field"},
	{"calendar_not_object.json", "rules[0].calendar", `must be an object, got "month"`},
	{"calendar_window_in_list_bad_period.json", "rules[0].windows[1].calendar.period", `got "fortnight"`},
	{"tier_without_selector.json", "tiers[0]", `tier "pro" needs "keys" or "header" and "values"`},
	{"tier_header_without_values.json", "tiers[0].values", `required with "header"`},
	{"tier_values_without_header.json", "tiers[0].header", `required with "values"`},
	{"tier_unknown_field.json", "tiers[0].plan", "unknown field"},
	{"rule_tiers_not_object.json", "rules[0].tiers", `must be an object of tier name to limits, got ["pro"]`},
	{"rule_tier_unknown_field.json", "rules[0].tiers.pro.cost", "unknown field"},
	{"rule_tier_missing_limit.json", "rules[0].tiers.pro.limit", `required (or "windows")`},
	{"ip_with_zone.json", "allow[0]", `invalid IP "fe80::1%eth0": zones are not allowed`},
	{"cidr_host_bits.json", "allow[1]", `invalid CIDR "10.0.0.1/8": host bits set (did you mean "10.0.0.0/8"?)`},
	{"bad_ipv6_cidr.json", "deny[0]", `invalid CIDR "2001:db8::/129"`},
	{"list_not_array.json", "allow", `must be an array, got "sk_internal_*"`},
	{"empty_list_entry.json", "deny[0]", "must not be empty"},
	{"list_entry_not_string.json", "deny[1]", "must be a string, got 42"},
	{"sync_unknown_field.json", "sync.intervall_ms", "unknown field"},
	{"sync_interval_too_small.json", "sync.interval_ms", "must be >= 10, got 5"},
	{"sync_lease_shorter_than_interval.json", "sync.lease_ttl_ms", "must be >= sync.interval_ms (500), got 200"},
	{"sync_max_batch_too_large.json", "sync.max_batch", "must be <= 4096, got 5000"},
	{"sync_secret_with_space.json", "sync.secret", `must be visible ASCII without spaces, got "s3cret value"`},
	{"sync_not_object.json", "sync", `must be an object, got "tollgate_ratelimit"`},
	{"negative_retry_jitter.json", "retry_jitter_ms", "must be >= 0, got -1"},
	{"negative_version.json", "version", "must be >= 0, got -3"},
	{"fractional_version.json", "version", "must be a non-negative integer, got 1.5"},
	{"negative_trusted_hops.json", "trusted_hops", "must be >= 0, got -1"},
	{"invalid_json.json", "", "invalid JSON at line 2, column 1 (byte 12): unexpected end of input, want a value"},
	{"not_an_object.json", "", `must be an object, got [{"id":"search"}]`},
	{"too_deeply_nested.json", "", "nested deeper than 64 levels"},
	{"rules_not_array.json", "rules", `must be an array, got {`},
	{"rule_not_object.json", "rules[0]", `must be an object, got "search"`},
	{"too_many_rules.json", "rules", "has more than 1000 entries"},
	{"regex_program_too_large.json", "rules[0].match.regex", "is too large: its program has"},
	{"regex_too_long.json", "rules[0].match.headers[0].regex", "must be at most 1024 bytes, got 1102"},
	{"header_regex_invalid.json", "rules[0].match.headers[1].regex", `invalid regex "[a-": error parsing regexp`},
	{"header_match_two_kinds.json", "rules[0].match.headers[0].prefix", `cannot be combined with "exact"`},
	{"header_present_false.json", "rules[0].match.headers[0].present", `must be true (write "not": true for an absent one)`},
	{"header_match_without_name.json", "rules[0].match.headers[0].name", "required"},
	{"query_match_regex.json", "rules[0].match.query[0].regex", "unknown field"},
	{"match_not_empty.json", "rules[0].match.not", "must have at least one condition"},
	{"match_not_nested.json", "rules[0].match.not.not", "unknown field"},
	{"match_path_relative.json", "rules[0].match.path", `must start with "/", got "login"`},
	{"metadata_without_namespace.json", "rules[0].key.namespace", `required for source "metadata"`},
	{"metadata_bad_path.json", "rules[0].key.path", `invalid path "my_payload..sub"`},
	{"query_key_without_name.json", "rules[0].key.name", `required for source "query"`},
	{"strip_prefix_on_ip.json", "rules[0].key.strip_prefix", `unknown field for source "ip"`},
	{"missing_key_unknown_action.json", "rules[0].missing_key.action", `unknown action "reject" (want skip, deny or fallback)`},
	{"missing_key_bad_status.json", "rules[0].missing_key.status", "must be 401 or 403, got 402"},
	{"missing_key_fallback_without_key.json", "rules[0].missing_key.key", `required with action "fallback"`},
	{"missing_key_status_with_skip.json", "rules[0].missing_key.status", `only with action "deny"`},
	{"missing_key_fallback_bad_source.json", "rules[0].missing_key.key.source", `unknown key source "cookie"`},
	{"unknown_field_in_key_fallback.json", "key.fallback.hops", `unknown field`},
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorCases {
		t.Run(strings.TrimSuffix(tt.fixture, ".json"), func(t *testing.T) {
			c, err := Parse(readFixture(t, tt.fixture))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != tt.field {
				t.Errorf("field = %q, want %q (error: %v)", fe.Field, tt.field, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err.Error(), tt.msg)
			}
			if tt.field != "" && !strings.HasPrefix(err.Error(), tt.field+": ") {
				t.Errorf("error %q does not start with the field", err.Error())
			}
		})
	}
}

func TestParseErrorFixturesListed(t *testing.T) {
	listed := map[string]bool{}
	for _, tt := range parseErrorCases {
		listed[tt.fixture] = true
	}
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		if !strings.HasPrefix(name, "valid_") && !listed[name] {
			t.Errorf("fixture %s is not in parseErrorCases", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("parseErrorCases names missing fixture %s", name)
	}
}

func TestParseErrorsInline(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		field string
		msg   string
	}{
		{"too large", `{"x":"` + strings.Repeat("a", MaxConfigSize) + `"}`, "", "more than the 4194304 allowed"},
		{"empty", ``, "", "invalid JSON"},
		{"unwrapped cause", `{"rules":[{"id":"a","limit":1,"window":"1x"}]}`, "rules[0].window", `invalid duration "1x"`},
		{"odd field name quoted", `{"rules":[{"id":"a","limit":1,"window":"1s","a b":1}]}`, `rules[0]["a b"]`, "unknown field"},
		{"long value shortened", `{"rules":[{"id":"a","limit":1,"window":"1s","fail":"` + strings.Repeat("x", 500) + `"}]}`, "rules[0].fail", `x"...`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FieldError", err)
			}
			if fe.Field != tt.field || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q (field %q), want field %q containing %q", err, fe.Field, tt.field, tt.msg)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error message is %d bytes long", len(err.Error()))
			}
		})
	}
	t.Run("regex cause unwraps", func(t *testing.T) {
		_, err := Parse(readFixture(t, "bad_regex.json"))
		var fe *FieldError
		if !errors.As(err, &fe) || errors.Unwrap(fe) == nil {
			t.Errorf("%v wraps no cause", err)
		}
	})
}

func TestAlgorithmNames(t *testing.T) {
	want := []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingWindowLog, algo.SlidingWindowCounter, algo.FixedWindow}
	if got := Algorithms(); !slices.Equal(got, want) {
		t.Errorf("Algorithms() = %v, want %v", got, want)
	}
	for _, k := range Algorithms() {
		name := AlgorithmName(k)
		back, ok := ParseAlgorithm(name)
		if name == "" || !ok || back != k {
			t.Errorf("kind %d: name %q back %d %v", k, name, back, ok)
		}
	}
	// A calendar window is configured as a fixed_window with a "calendar".
	if AlgorithmName(algo.Calendar) != "fixed_window" {
		t.Errorf("calendar is named %q", AlgorithmName(algo.Calendar))
	}
	if _, ok := ParseAlgorithm(algo.Calendar.String()); ok {
		t.Error("the calendar kind parsed as a rule algorithm")
	}
	if AlgorithmName(algo.Kind(algo.NumKinds)) != "" {
		t.Error("unknown kind has a name")
	}
	if _, ok := ParseAlgorithm("leaky"); ok {
		t.Error("leaky parsed")
	}
}

func TestParseCalendar(t *testing.T) {
	c, err := Parse(readFixture(t, "valid_calendar.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]algo.Params{
		"plan":  {algo.CalendarParams(1_000_000, algo.Month, 0)},
		"india": {{Kind: algo.FixedWindow, Limit: 100, WindowUs: durUs("1m")}, algo.CalendarParams(50_000, algo.Day, 330)},
		"west":  {algo.CalendarParams(7000, algo.Week, -480)},
	}
	for _, r := range c.Rules {
		if !reflect.DeepEqual(r.Windows, want[r.ID]) {
			t.Errorf("rule %s: windows %+v, want %+v", r.ID, r.Windows, want[r.ID])
		}
	}
	if got, want := c.Rules[2].Tiers["pro"], []algo.Params{algo.CalendarParams(20_000_000, algo.Month, 60)}; !reflect.DeepEqual(got, want) {
		t.Errorf("tier pro: %+v, want %+v", got, want)
	}
	if got := c.Rules[0].Overrides[0].Windows; !reflect.DeepEqual(got, []algo.Params{algo.CalendarParams(5_000_000, algo.Month, 0)}) {
		t.Errorf("override: %+v", got)
	}
	// The degraded limit caps the limit and leaves the period alone.
	if got := c.Rules[0].Degraded(c.Rules[0].Windows[0]); got != algo.CalendarParams(1000, algo.Month, 0) {
		t.Errorf("degraded: %+v", got)
	}
}

func TestParseUTCOffset(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"+00:00", 0, true}, {"-00:00", 0, true}, {"+05:30", 330, true}, {"-08:00", -480, true},
		{"+14:00", 840, true}, {"-14:00", -840, true}, {"+05:45", 345, true},
		{"+14:01", 0, false}, {"+5:30", 0, false}, {"05:30", 0, false}, {"+05:60", 0, false},
		{"+0530", 0, false}, {"Z", 0, false}, {"+05:3a", 0, false}, {"", 0, false}, {"+05:30 ", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, ok := parseUTCOffset(tt.in)
			if got != tt.want || ok != tt.ok {
				t.Errorf("parseUTCOffset(%q) = %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// Consumption out of a valid lease waits for the lease's renewal unless the
// configuration writes stale_ms, which then bounds it too.
func TestParseStaleLeased(t *testing.T) {
	for _, c := range []struct {
		sync       string
		stale, lsd int64
	}{
		{`{"cluster":"c"}`, 10000, 0},
		{`{"cluster":"c","stale_ms":200}`, 200, 200},
		{`{"cluster":"c","stale_ms":10000}`, 10000, 10000},
	} {
		cfg, err := Parse([]byte(`{"sync":` + c.sync + `,"rules":[{"id":"a","limit":1,"window":"1s"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Sync.StaleMs != c.stale || cfg.Sync.StaleLeasedMs != c.lsd {
			t.Errorf("%s: stale_ms %d, leased %d; want %d, %d", c.sync, cfg.Sync.StaleMs, cfg.Sync.StaleLeasedMs, c.stale, c.lsd)
		}
	}
}
