package rlsimport

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json from the converter")

// TestConvertFixture: the fixture converts without a problem into the rule set in
// testdata/envoy-ratelimit.json (reviewed by hand; -update rewrites it), which parses.
func TestConvertFixture(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "envoy-ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res := Convert(data)
	if len(res.Problems) > 0 {
		t.Fatalf("problems: %v", res.Problems)
	}
	wantNotes := []want{{"descriptors[8].detailed_metric", "dropped: Tollgate counts decisions per rule"}}
	checkIssues(t, "notes", res.Notes, wantNotes)
	golden := filepath.Join("testdata", "envoy-ratelimit.json")
	if *update {
		if err := os.WriteFile(golden, res.Rules, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Rules, want) {
		t.Errorf("converted:\n%s\nwant (%s):\n%s", res.Rules, golden, want)
	}
	if _, err := rule.Parse(res.Rules); err != nil {
		t.Fatal(err)
	}
}

// want is an expected issue: its path and a part of its message.
type want struct{ Path, Msg string }

// checkIssues compares issues by path and a part of the message, in order.
func checkIssues(t *testing.T, what string, got []Issue, want []want) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
	for i := range want {
		if got[i].Path != want[i].Path || !strings.Contains(got[i].Msg, want[i].Msg) {
			t.Errorf("%s[%d] = %v, want path %q with %q", what, i, got[i], want[i].Path, want[i].Msg)
		}
	}
}

// TestConvertProblems: what cannot be converted is named by its YAML path, and the rest
// still converts.
func TestConvertProblems(t *testing.T) {
	deep := "domain: d\ndescriptors:\n"
	for i := 0; i < 9; i++ {
		deep += strings.Repeat("  ", 2*i) + "  - key: k" + string(rune('0'+i)) + "\n"
		if i < 8 {
			deep += strings.Repeat("  ", 2*i) + "    descriptors:\n"
		}
	}
	deep += strings.Repeat("  ", 16) + "    rate_limit: {unit: second, requests_per_unit: 1}\n"
	for _, tt := range []struct {
		name  string
		yaml  string
		want  []want
		rules int // rules converted despite the problems
	}{
		{"year", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: j
    rate_limit: {unit: week, requests_per_unit: 5}`,
			[]want{{"descriptors[0].rate_limit.unit", "a year (365 days) is longer than Tollgate's longest window (31d)"}}, 1},
		{"wildcard value and what is beneath", `
domain: d
descriptors:
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}`,
			[]want{{"descriptors[0].value", `wildcard value "/api/*"`}, {"descriptors[0]", "the 1 limits beneath are not converted either"}}, 0},
		{"quota mode", `
domain: d
descriptors:
  - key: k
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 5}`,
			[]want{{"descriptors[0].quota_mode", "no Tollgate equivalent"}}, 1},
		{"zero requests", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 0}`,
			[]want{{"descriptors[0].rate_limit.requests_per_unit", "0 refuses every request"}}, 0},
		{"more than a window holds", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 2000000}`,
			[]want{{"descriptors[0].rate_limit.requests_per_unit", "2000000 per second"}}, 0},
		{"unknown unit", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: 1}`,
			[]want{{"descriptors[0].rate_limit.unit", `unknown unit "fortnight"`}}, 0},
		{"unit with unlimited", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, unlimited: true}`,
			[]want{{"descriptors[0].rate_limit.unit", "must not be set when unlimited"}}, 0},
		{"unlimited that replaces", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, name: general}
  - key: b
    rate_limit: {unlimited: true, replaces: [{name: general}]}`,
			[]want{{"descriptors[1].rate_limit.replaces", "an unlimited limit that replaces others has no Tollgate equivalent"}}, 1},
		{"replaces itself", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, name: me, replaces: [{name: me}]}`,
			[]want{{"descriptors[0].rate_limit.replaces[0].name", "a limit cannot replace itself"}}, 0},
		{"unknown fields", `
domain: d
limits: []
descriptors:
  - key: a
    burst: 3
    rate_limit: {unit: second, requests_per_unit: 1, per: 2}`,
			[]want{{"limits", "unknown field"}, {"descriptors[0].burst", "unknown field"}, {"descriptors[0].rate_limit.per", "unknown field"}}, 0},
		{"duplicate descriptor", `
domain: d
descriptors:
  - {key: a, value: x, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: a, value: x, rate_limit: {unit: second, requests_per_unit: 2}}`,
			[]want{{"descriptors[1]", `duplicate descriptor "a_x" (first at descriptors[0]`}}, 1},
		{"empty key", `
domain: d
descriptors:
  - {key: "", rate_limit: {unit: second, requests_per_unit: 1}}`,
			[]want{{"descriptors[0].key", "required, must not be empty"}}, 0},
		{"key with a space", `
domain: d
descriptors:
  - {key: "my key", rate_limit: {unit: second, requests_per_unit: 1}}`,
			[]want{{"descriptors[0].key", "must be visible ASCII without spaces"}}, 0},
		{"no domain", `
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}`,
			[]want{{"domain", "required, must not be empty"}}, 0},
		{"deeper than a descriptor match", deep,
			[]want{{"descriptors[0]" + strings.Repeat(".descriptors[0]", 8) + ".rate_limit", "a limit 9 entries deep"}}, 0},
		{"not YAML", "domain: [", []want{{"", "not YAML"}}, 0},
		{"not a mapping", "- a\n- b\n", []want{{"", "must be a mapping with domain and descriptors"}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := Convert([]byte(tt.yaml))
			checkIssues(t, "problems", res.Problems, tt.want)
			n := 0
			if res.Rules != nil {
				c, err := rule.Parse(res.Rules)
				if err != nil {
					t.Fatal(err)
				}
				n = len(c.Rules)
			}
			if n != tt.rules {
				t.Errorf("%d rules converted, want %d:\n%s", n, tt.rules, res.Rules)
			}
		})
	}
}

// TestConvertNotes: what only changes statistics is dropped with a note, and ids come
// from names where a name makes a unique rule id.
func TestConvertNotes(t *testing.T) {
	for _, tt := range []struct {
		name string
		yaml string
		want []want
		ids  []string
	}{
		{"metrics and metadata", `
domain: d
descriptors:
  - key: a
    detailed_metric: true
    value_to_metric: true
    metadata: {team: x}
    rate_limit: {unit: second, requests_per_unit: 1}`,
			[]want{{"descriptors[0].detailed_metric", "dropped"}, {"descriptors[0].value_to_metric", "dropped"}, {"descriptors[0].metadata", "dropped"}},
			[]string{"d.a"}},
		{"replacing a name nobody has", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ghost}]}`,
			[]want{{"descriptors[0].rate_limit.replaces[0].name", `no limit is named "ghost"`}}, []string{"d.a"}},
		{"names shared or not ids", `
domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 1, name: twice}}
  - {key: b, rate_limit: {unit: second, requests_per_unit: 1, name: twice}}
  - {key: c, rate_limit: {unit: second, requests_per_unit: 1, name: "with space"}}
  - {key: d, rate_limit: {unit: second, requests_per_unit: 1, name: fine}}`,
			[]want{{"descriptors[0].rate_limit.name", `"twice" is not a unique rule id`}, {"descriptors[1].rate_limit.name", `"twice" is not a unique rule id`},
				{"descriptors[2].rate_limit.name", `"with space" is not a unique rule id`}},
			[]string{"d.a", "d.b", "d.c", "fine"}},
		{"long or colliding paths get a hash", `
domain: d
descriptors:
  - key: ` + strings.Repeat("k", 70) + `
    rate_limit: {unit: second, requests_per_unit: 1}
  - {key: x, value: "v w", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: x_v_w, rate_limit: {unit: second, requests_per_unit: 1}}`,
			nil, []string{"d." + strings.Repeat("k", 45) + "-", "d.x_v_w", "d.x_v_w-"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := Convert([]byte(tt.yaml))
			if len(res.Problems) > 0 {
				t.Fatalf("problems: %v", res.Problems)
			}
			checkIssues(t, "notes", res.Notes, tt.want)
			c, err := rule.Parse(res.Rules)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Rules) != len(tt.ids) {
				t.Fatalf("%d rules, want ids %v", len(c.Rules), tt.ids)
			}
			for i, id := range tt.ids {
				if !strings.HasPrefix(c.Rules[i].ID, id) {
					t.Errorf("rule %d id %q, want %q", i, c.Rules[i].ID, id)
				}
			}
		})
	}
}

// TestConvertYAML: scalars read as envoyproxy/ratelimit's YAML 1.1 decoder reads them
// (a value is the text as written, yes/on are booleans, 1_000 and 0x10 integers), a key
// given twice is refused, and an issue carries its line.
func TestConvertYAML(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       string // a part of the converted rule set ("" : no check)
		problem    string // "path (line N): message part" of the only problem, if any
	}{
		{"value as written", "domain: d\ndescriptors:\n  - {key: flag, value: yes, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: v, value: 1.0, rate_limit: {unit: second, requests_per_unit: 1}}",
			`"value": "1.0"`, ""},
		{"yes is a value, not true", "domain: d\ndescriptors:\n  - {key: flag, value: yes, rate_limit: {unit: second, requests_per_unit: 1}}",
			`"value": "yes"`, ""},
		{"YAML 1.1 booleans", "domain: d\ndescriptors:\n  - {key: k, shadow_mode: on, rate_limit: {unit: second, requests_per_unit: 1}}",
			`"shadow": true`, ""},
		{"integers with underscores and hex", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1_000}}\n  - {key: b, rate_limit: {unit: hour, requests_per_unit: 0x10}}",
			`"limit": 16`, ""},
		{"anchors and aliases", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &rl {unit: minute, requests_per_unit: 7}\n  - key: b\n    rate_limit: *rl",
			`"limit": 7`, ""},
		{"quoted true is not a boolean", "domain: d\ndescriptors:\n  - {key: k, shadow_mode: \"true\", rate_limit: {unit: second, requests_per_unit: 1}}",
			"", `descriptors[0].shadow_mode (line 3): must be true or false, got "true"`},
		{"key given twice", "domain: d\ndescriptors:\n  - key: a\n    key: b\n    rate_limit: {unit: second, requests_per_unit: 1}",
			"", "descriptors[0].key (line 4): given twice"},
		{"line of a nested problem", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          unit: year\n          requests_per_unit: 1",
			"", "descriptors[0].descriptors[0].rate_limit.unit (line 7): a year"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := Convert([]byte(tt.yaml))
			switch {
			case tt.problem == "" && len(res.Problems) > 0:
				t.Fatalf("problems: %v", res.Problems)
			case tt.problem != "" && (len(res.Problems) != 1 || !strings.Contains(res.Problems[0].String(), tt.problem)):
				t.Fatalf("problems %v, want one with %q", res.Problems, tt.problem)
			}
			if tt.want != "" && !strings.Contains(string(res.Rules), tt.want) {
				t.Errorf("rules lack %s:\n%s", tt.want, res.Rules)
			}
		})
	}
}
