package rls

import (
	"reflect"
	"slices"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// TestReplacedRules: the rules a request's selected rules replace, whichever descriptor
// selected them; a replaced rule's own replaces still count (as envoyproxy/ratelimit
// collects every found limit's replaces before dropping any).
func TestReplacedRules(t *testing.T) {
	c, err := rule.Parse([]byte(`{"rules": [
	  {"id": "general", "limit": 10, "window": "1m", "descriptors": {"domain": "d", "entries": [{"key": "user"}]}},
	  {"id": "upload", "limit": 1, "window": "1m", "descriptors": {"domain": "d", "entries": [{"key": "path", "value": "/upload"}, {"key": "user"}], "replaces": ["general"]}},
	  {"id": "tenant", "limit": 5, "window": "1m", "descriptors": {"domain": "d", "entries": [{"key": "tenant"}], "replaces": ["upload"]}}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		descs [][]rule.DescriptorEntry
		want  []string
	}{
		{"nothing replaces", [][]rule.DescriptorEntry{{{Key: "user", Value: "u"}}}, nil},
		{"upload replaces general", [][]rule.DescriptorEntry{{{Key: "user", Value: "u"}}, {{Key: "path", Value: "/upload"}, {Key: "user", Value: "u"}}}, []string{"general"}},
		{"a replaced rule's replaces still count", [][]rule.DescriptorEntry{{{Key: "user", Value: "u"}}, {{Key: "path", Value: "/upload"}, {Key: "user", Value: "u"}}, {{Key: "tenant", Value: "t"}}},
			[]string{"general", "upload"}},
		{"replacing a rule not selected", [][]rule.DescriptorEntry{{{Key: "tenant", Value: "t"}}}, []string{"upload"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var applied []rule.Applied
			for _, d := range tt.descs {
				applied = c.ApplyDescriptor("d", d, applied)
			}
			var got []string
			for id := range replacedRules(applied) {
				got = append(got, id)
			}
			slices.Sort(got)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("replaced %v, want %v", got, tt.want)
			}
		})
	}
}
