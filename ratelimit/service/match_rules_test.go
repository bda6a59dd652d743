package service

import (
	"net/http"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// TestRulesAPIMatchAndKeySyntax: the service's rules API takes the match conditions,
// key sources and missing-key policies the filter applies (one parser, rule.Parse), and
// answers 422 naming the field of a malformed one while the stored version keeps
// serving.
func TestRulesAPIMatchAndKeySyntax(t *testing.T) {
	srv := redistest.StartStandalone(t)
	a := start(t, opts{addrs: srv.Addrs()})
	const rest = `"limit":10,"window":"1m"`
	for _, tc := range []struct {
		name, rule string
		field      string // "" for a rule set the service stores
		check      func(r *rule.Rule) bool
	}{
		{"path, headers, query, not", `{"id":"r",` + rest + `,"match":{"hosts":["api.example.com"],"path":"/v1/login",
			"headers":[{"name":"x-env","exact":"prod"},{"name":"user-agent","regex":"(?i)bot","not":true}],
			"query":[{"name":"debug"}],"not":{"methods":["OPTIONS"]}}}`,
			"", func(r *rule.Rule) bool {
				return r.Match.Path == "/v1/login" && len(r.Match.Headers) == 2 && r.Match.Headers[1].Not && len(r.Match.Query) == 1 && r.Match.Not != nil
			}},
		{"metadata composite key, deny", `{"id":"r",` + rest + `,"key":{"source":"composite","parts":[
			{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.tenant"},
			{"source":"query","name":"user","lowercase":true}]},"missing_key":{"action":"deny","status":403}}`,
			"", func(r *rule.Rule) bool {
				return r.Key.Kind == rule.KeyComposite && r.Key.Parts[0].Kind == rule.KeyProperty && r.MissingKey.Status == 403
			}},
		{"bearer transform, fallback", `{"id":"r",` + rest + `,"key":{"source":"header","name":"authorization","strip_prefix":"Bearer "},
			"missing_key":{"action":"fallback","key":{"source":"filter_state","name":"tenant"}}}`,
			"", func(r *rule.Rule) bool {
				return r.Key.StripPrefix == "Bearer " && r.MissingKey.Action == rule.MissingFallback && r.MissingKey.Key.Kind == rule.KeyProperty
			}},
		{"regex too large", `{"id":"r",` + rest + `,"match":{"headers":[{"name":"x-id","regex":"^[a-z]{1000}[0-9]{1000}"}]}}`,
			"rules[0].match.headers[0].regex", nil},
		{"invalid header regex", `{"id":"r",` + rest + `,"match":{"headers":[{"name":"x-id","regex":"(["}]}}`,
			"rules[0].match.headers[0].regex", nil},
		{"bad missing_key status", `{"id":"r",` + rest + `,"missing_key":{"action":"deny","status":429}}`,
			"rules[0].missing_key.status", nil},
		{"metadata without path", `{"id":"r",` + rest + `,"key":{"source":"metadata","namespace":"ns"}}`,
			"rules[0].key.path", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, out := a.do(t, http.MethodPut, "/v1/rules", adminToken, []byte(`{"rules":[`+tc.rule+`]}`), "Content-Type", "application/json")
			if tc.field != "" {
				var eb struct{ Error, Field string }
				decodeJSON(t, out, &eb)
				if code != http.StatusUnprocessableEntity || eb.Field != tc.field {
					t.Fatalf("%d %s, want 422 naming %s", code, out, tc.field)
				}
				return
			}
			if code != http.StatusOK {
				t.Fatalf("%d %s, want 200", code, out)
			}
			_, _, body := a.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
			c, err := rule.Parse(body)
			if err != nil || len(c.Rules) != 1 || !tc.check(&c.Rules[0]) {
				t.Fatalf("served rule set %s: %v", body, err)
			}
		})
	}
}
