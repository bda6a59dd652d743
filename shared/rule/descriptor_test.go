package rule

import (
	"reflect"
	"testing"
)

// descriptorErrorCases: each fixture is a rule set with one malformed descriptor match,
// named after what is wrong with it; Parse must refuse it naming the JSON path.
var descriptorErrorCases = []struct {
	fixture string
	field   string
	msg     string
}{
	{"descriptor_missing_domain.json", "rules[0].descriptors.domain", "required"},
	{"descriptor_empty_domain.json", "rules[0].descriptors.domain", "must not be empty"},
	{"descriptor_domain_with_space.json", "rules[0].descriptors.domain", `must be visible ASCII without spaces, got "edge proxy"`},
	{"descriptor_missing_entries.json", "rules[0].descriptors.entries", "required"},
	{"descriptor_empty_entries.json", "rules[0].descriptors.entries", "must not be empty"},
	{"descriptor_entries_not_array.json", "rules[0].descriptors.entries", "must be an array"},
	{"descriptor_too_many_entries.json", "rules[0].descriptors.entries", "has more than 8 entries"},
	{"descriptor_entry_missing_key.json", "rules[0].descriptors.entries[1].key", "required"},
	{"descriptor_entry_empty_key.json", "rules[0].descriptors.entries[0].key", "must not be empty"},
	{"descriptor_entry_empty_value.json", "rules[0].descriptors.entries[0].value", `must not be empty (leave "value" out to match any value)`},
	{"descriptor_entry_value_too_long.json", "rules[0].descriptors.entries[0].value", "must be at most 256 bytes, got 257"},
	{"descriptor_entry_value_control_char.json", "rules[0].descriptors.entries[0].value", "must not contain control characters"},
	{"descriptor_entry_value_not_string.json", "rules[0].descriptors.entries[0].value", "must be a string, got 5"},
	{"descriptor_entry_unknown_field.json", "rules[0].descriptors.entries[0].values", "unknown field"},
	{"descriptor_unknown_field.json", "rules[0].descriptors.unit", "unknown field"},
	{"descriptor_not_object.json", "rules[0].descriptors", "must be an object"},
	{"descriptor_except_with_value.json", "rules[0].descriptors.entries[0].except", `cannot be combined with "value"`},
	{"descriptor_except_empty_value.json", "rules[0].descriptors.entries[0].except[1]", "must not be empty"},
	{"descriptor_except_not_array.json", "rules[0].descriptors.entries[0].except", "must be an array"},
	{"descriptor_replaces_unknown_rule.json", "rules[1].descriptors.replaces[0]", `unknown rule "per-usr"`},
	{"descriptor_replaces_itself.json", "rules[0].descriptors.replaces[0]", "a rule cannot replace itself"},
	{"descriptor_replaces_http_only_rule.json", "rules[1].descriptors.replaces[0]", `rule "search" has no descriptor match`},
}

// The descriptor cases run with every other fixture in TestParseErrors (which also
// checks that each fixture in testdata is listed).
func init() { parseErrorCases = append(parseErrorCases, descriptorErrorCases...) }

func TestParseDescriptors(t *testing.T) {
	for _, tt := range []struct {
		name, rule     string
		want           *DescriptorMatch
		descriptorOnly bool
	}{
		{"any value", `"descriptors": {"domain": "api", "entries": [{"key": "api_key"}]}`,
			&DescriptorMatch{Domain: "api", Entries: []DescriptorMatchEntry{{Key: "api_key", Any: true}}}, true},
		{"fixed and any", `"descriptors": {"domain": "edge", "entries": [{"key": "route", "value": "search v2"}, {"key": "remote_address"}]}`,
			&DescriptorMatch{Domain: "edge", Entries: []DescriptorMatchEntry{{Key: "route", Value: "search v2"}, {Key: "remote_address", Any: true}}}, true},
		{"with an HTTP match", `"match": {"prefix": "/search"}, "descriptors": {"domain": "api", "entries": [{"key": "api_key"}]}`,
			&DescriptorMatch{Domain: "api", Entries: []DescriptorMatchEntry{{Key: "api_key", Any: true}}}, false},
		{"any value except some", `"descriptors": {"domain": "api", "entries": [{"key": "api_key", "except": ["alice", "bob"]}]}`,
			&DescriptorMatch{Domain: "api", Entries: []DescriptorMatchEntry{{Key: "api_key", Any: true, Except: []string{"alice", "bob"}}}}, true},
		{"null reads as absent", `"descriptors": null`, nil, false},
		{"none", `"match": {"prefix": "/"}`, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, `{"rules": [{"id": "r", "limit": 5, "window": "1s", `+tt.rule+`}]}`)
			r := &c.Rules[0]
			if !reflect.DeepEqual(r.Descriptors, tt.want) || r.DescriptorOnly != tt.descriptorOnly {
				t.Errorf("descriptors %+v only %v, want %+v only %v", r.Descriptors, r.DescriptorOnly, tt.want, tt.descriptorOnly)
			}
		})
	}
}

func TestApplyDescriptor(t *testing.T) {
	c := mustParse(t, `{
	  "tiers": [{"name": "pro", "keys": ["pro_*"]}],
	  "rules": [
	    {"id": "per-key", "limit": 10, "window": "1m", "descriptors": {"domain": "api", "entries": [{"key": "api_key"}]},
	     "tiers": {"pro": {"limit": 100, "window": "1m"}}, "overrides": [{"key": "vip", "limit": 1000, "window": "1m"}]},
	    {"id": "search", "limit": 3, "window": "1s", "cost": 2,
	     "descriptors": {"domain": "api", "entries": [{"key": "route", "value": "search"}, {"key": "api_key"}]}},
	    {"id": "pair", "limit": 3, "window": "1s",
	     "descriptors": {"domain": "api", "entries": [{"key": "tenant"}, {"key": "user"}]}},
	    {"id": "global", "limit": 1000, "window": "1s", "descriptors": {"domain": "edge", "entries": [{"key": "generic_key", "value": "all"}]}},
	    {"id": "other-paths", "limit": 5, "window": "1s", "descriptors": {"domain": "edge", "entries": [{"key": "path", "except": ["/a", "/b"]}]}},
	    {"id": "http", "limit": 1, "window": "1s", "match": {"prefix": "/"}}
	  ]}`)
	type got struct {
		Rule, Key, Tier string
		Limit, Cost     int64
	}
	for _, tt := range []struct {
		name    string
		domain  string
		entries []DescriptorEntry
		want    []got
	}{
		{"any value is the caller key", "api", []DescriptorEntry{{"api_key", "alice"}}, []got{{"per-key", "alice", "", 10, 1}}},
		{"tier by key glob", "api", []DescriptorEntry{{"api_key", "pro_1"}}, []got{{"per-key", "pro_1", "pro", 100, 1}}},
		{"override by key", "api", []DescriptorEntry{{"api_key", "vip"}}, []got{{"per-key", "vip", "", 1000, 1}}},
		{"fixed value and any", "api", []DescriptorEntry{{"route", "search"}, {"api_key", "bob"}}, []got{{"search", "bob", "", 3, 2}}},
		{"fixed value differs", "api", []DescriptorEntry{{"route", "upload"}, {"api_key", "bob"}}, nil},
		{"entries in another order", "api", []DescriptorEntry{{"api_key", "bob"}, {"route", "search"}}, nil},
		{"two values joined", "api", []DescriptorEntry{{"tenant", "acme"}, {"user", "u1"}}, []got{{"pair", "acme:u1", "", 3, 1}}},
		{"all fixed: the domain is the key", "edge", []DescriptorEntry{{"generic_key", "all"}}, []got{{"global", "edge", "", 1000, 1}}},
		{"other domain", "edge", []DescriptorEntry{{"api_key", "alice"}}, nil},
		{"longer descriptor", "api", []DescriptorEntry{{"api_key", "alice"}, {"x", "y"}}, nil},
		{"empty value never matches", "api", []DescriptorEntry{{"api_key", ""}}, nil},
		{"any value but the excepted", "edge", []DescriptorEntry{{"path", "/c"}}, []got{{"other-paths", "/c", "", 5, 1}}},
		{"excepted value", "edge", []DescriptorEntry{{"path", "/b"}}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out []got
			for _, a := range c.ApplyDescriptor(tt.domain, tt.entries, nil) {
				out = append(out, got{a.Rule.ID, a.Key, a.Tier, a.Windows[0].Limit, a.Cost})
			}
			if !reflect.DeepEqual(out, tt.want) {
				t.Errorf("got %+v, want %+v", out, tt.want)
			}
		})
	}
}

// TestApplySkipsDescriptorOnlyRules: the filter (Apply) leaves out a rule selected
// only by descriptors, and applies one that also has an HTTP match.
func TestApplySkipsDescriptorOnlyRules(t *testing.T) {
	c := mustParse(t, `{"rules": [
	  {"id": "rls-only", "limit": 1, "window": "1s", "descriptors": {"domain": "api", "entries": [{"key": "api_key"}]}},
	  {"id": "both", "limit": 1, "window": "1s", "match": {"prefix": "/"}, "descriptors": {"domain": "api", "entries": [{"key": "api_key"}]}}
	]}`)
	req := &Request{Method: "GET", Path: "/x", Header: func(n string) (string, bool) { return "alice", n == "x-api-key" }}
	applied := c.Apply(req, nil)
	if len(applied) != 1 || applied[0].Rule.ID != "both" || applied[0].Key != "alice" {
		t.Fatalf("Apply = %+v, want only rule both for alice", applied)
	}
	if d := c.ApplyDescriptor("api", []DescriptorEntry{{"api_key", "alice"}}, nil); len(d) != 2 {
		t.Fatalf("ApplyDescriptor matched %d rules, want 2", len(d))
	}
}
