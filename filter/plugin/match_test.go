package plugin_test

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

const jwtNS = "envoy.filters.http.jwt_authn"

// sendMeta runs a request whose dynamic metadata holds the given jwt_authn payload claims
// (as Envoy's jwt_authn filter with payload_in_metadata "my_payload" leaves them).
func (g *gateway) sendMeta(path string, claims map[string]string, headers ...string) *nativehost.Stream {
	req := [][2]string{{":method", "GET"}, {":path", path}, {":authority", "api.example.com"}}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ": ")
		req = append(req, [2]string{name, value})
	}
	props := map[string]string{"source.address": "10.1.2.3:50000"}
	for k, v := range claims {
		props["metadata.filter_metadata."+jwtNS+".my_payload."+k] = v
	}
	return g.h.Request(0, req, props)
}

// TestMatchConditionsInFilter: each match condition selects requests in the filter as
// rule.Apply says (a rule with limit 1 answers 429 to the second matching request; a
// request it does not match passes with no headers).
func TestMatchConditionsInFilter(t *testing.T) {
	for _, tc := range []struct {
		name, match string
		path        string
		headers     []string
		want        bool
	}{
		{"host", `{"hosts":["api.example.com"]}`, "/x", nil, true},
		{"host other", `{"hosts":["www.example.com"]}`, "/x", nil, false},
		{"prefix", `{"prefix":"/v1"}`, "/v1/a", nil, true},
		{"path exact", `{"path":"/v1/login"}`, "/v1/login?next=/", nil, true},
		{"path exact other", `{"path":"/v1/login"}`, "/v1/login/x", nil, false},
		{"regex", `{"regex":"^/v[0-9]+/a$"}`, "/v2/a", nil, true},
		{"method", `{"methods":["POST"]}`, "/x", nil, false},
		{"header present", `{"headers":[{"name":"x-debug"}]}`, "/x", []string{"x-debug: 1"}, true},
		{"header absent", `{"headers":[{"name":"x-debug"}]}`, "/x", nil, false},
		{"header exact", `{"headers":[{"name":"x-env","exact":"prod"}]}`, "/x", []string{"x-env: prod"}, true},
		{"header exact other", `{"headers":[{"name":"x-env","exact":"prod"}]}`, "/x", []string{"x-env: dev"}, false},
		{"header prefix", `{"headers":[{"name":"authorization","prefix":"Bearer "}]}`, "/x", []string{"authorization: Bearer t"}, true},
		{"header regex", `{"headers":[{"name":"user-agent","regex":"(?i)bot"}]}`, "/x", []string{"user-agent: SomeBot"}, true},
		{"header not", `{"headers":[{"name":"x-internal","not":true}]}`, "/x", []string{"x-internal: 1"}, false},
		{"query present", `{"query":[{"name":"debug"}]}`, "/x?a=1&debug", nil, true},
		{"query exact", `{"query":[{"name":"format","exact":"csv"}]}`, "/x?format=%63sv", nil, true},
		{"query exact other", `{"query":[{"name":"format","exact":"csv"}]}`, "/x?format=json", nil, false},
		{"not block", `{"prefix":"/v1","not":{"path":"/v1/health"}}`, "/v1/health", nil, false},
		{"three conditions", `{"hosts":["api.example.com"],"prefix":"/v1","headers":[{"name":"x-env","exact":"prod"}]}`, "/v1/a", []string{"x-env: prod"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
				"rules":[{"id":"r","limit":1,"window":"1m","match":`+tc.match+`}]}`)
			hdrs := append([]string{"x-api-key: k1"}, tc.headers...)
			g.send(tc.path, hdrs...)
			s := g.send(tc.path, hdrs...)
			want := 200
			if tc.want {
				want = 429
			}
			if got := int(s.Status()); got != want {
				t.Errorf("second request: %s, want %d", answer(s), want)
			}
		})
	}
}

// TestKeySourcesInFilter: each key source keys the filter's buckets (limit 1: a second
// request with the same key is refused, one with another key is not).
func TestKeySourcesInFilter(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		same      [2]request
		other     request
	}{
		{"query", `{"source":"query","name":"api_key"}`,
			[2]request{{path: "/x?api_key=a"}, {path: "/x?api_key=%61"}}, request{path: "/x?api_key=b"}},
		{"metadata claim", `{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.sub"}`,
			[2]request{{claims: map[string]string{"sub": "u1"}}, {claims: map[string]string{"sub": "u1"}}}, request{claims: map[string]string{"sub": "u2"}}},
		{"composite tenant:user", `{"source":"composite","parts":[{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.tenant"},{"source":"header","name":"x-user"}]}`,
			[2]request{{claims: map[string]string{"tenant": "t1"}, headers: []string{"x-user: u"}}, {claims: map[string]string{"tenant": "t1"}, headers: []string{"x-user: u"}}},
			request{claims: map[string]string{"tenant": "t2"}, headers: []string{"x-user: u"}}},
		{"bearer stripped, lower-cased", `{"source":"header","name":"authorization","strip_prefix":"Bearer ","lowercase":true}`,
			[2]request{{headers: []string{"authorization: Bearer ABC"}}, {headers: []string{"authorization: bearer abc"}}}, request{headers: []string{"authorization: Bearer abd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, `{"retry_jitter_ms":0,"rules":[{"id":"r","limit":1,"window":"1m","key":`+tc.key+`,"missing_key":"deny"}]}`)
			if s := tc.same[0].send(g); s.Status() != 200 {
				t.Fatalf("first: %s", answer(s))
			}
			if s := tc.same[1].send(g); s.Status() != 429 {
				t.Fatalf("same key: %s, want 429", answer(s))
			}
			if s := tc.other.send(g); s.Status() != 200 {
				t.Fatalf("other key: %s, want 200", answer(s))
			}
		})
	}
}

type request struct {
	path    string
	claims  map[string]string
	headers []string
}

func (r request) send(g *gateway) *nativehost.Stream {
	p := r.path
	if p == "" {
		p = "/x"
	}
	return g.sendMeta(p, r.claims, r.headers...)
}

// TestMissingKeyInFilter: a request without the rule's key passes (skip), is refused
// with the JSON body (deny, 401 or 403), or is limited under the fallback key.
func TestMissingKeyInFilter(t *testing.T) {
	const key = `"key":{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.sub"}`
	for _, tc := range []struct {
		name, policy string
		want         []string // answers to three requests without the key
	}{
		{"skip", `"skip"`, []string{"200", "200", "200"}},
		{"deny", `"deny"`, []string{
			`401 | body {"error":{"code":"UNAUTHENTICATED","message":"Request carries no caller key","details":{"status":401,"rule":"r"}}}`}},
		{"deny 403", `{"action":"deny","status":403}`, []string{
			`403 | body {"error":{"code":"FORBIDDEN","message":"Request carries no caller key","details":{"status":403,"rule":"r"}}}`}},
		{"fallback", `{"action":"fallback","key":{"source":"ip"}}`, []string{"200", "200", "429"}},
		{"shadow deny never refuses", `"deny"`, []string{"200", "200"}},
		{"enforcement shadow: deny never refuses", `"deny"`, []string{"200", "200"}},
		{"enforcement off: deny never refuses", `"deny"`, []string{"200", "200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shadow, enforcement := "", ""
			switch {
			case strings.HasPrefix(tc.name, "shadow"):
				shadow = `,"shadow":true`
			case strings.HasPrefix(tc.name, "enforcement shadow"):
				enforcement = `"enforcement":"shadow",`
			case strings.HasPrefix(tc.name, "enforcement off"):
				enforcement = `"enforcement":"off",`
			}
			g := newGateway(t, `{"retry_jitter_ms":0,`+enforcement+`"rules":[{"id":"r","limit":2,"window":"1m",`+key+`,"missing_key":`+tc.policy+shadow+`}]}`)
			for i, want := range tc.want {
				got := answer(g.sendMeta("/x", nil))
				if !strings.Contains(want, "body") {
					got, _, _ = strings.Cut(got, " | ") // the rate-limit headers are pinned by TestAnswers
				}
				if got != want {
					t.Errorf("request %d: %s, want %s", i, got, want)
				}
			}
			// The key present: limited under it whatever the policy.
			if s := g.sendMeta("/x", map[string]string{"sub": "u1"}); s.Status() != 200 || s.Local != nil {
				t.Errorf("with key: %s", answer(s))
			}
		})
	}
}

// A gRPC request refused for its missing key is refused the gRPC way (trailers-only:
// UNAUTHENTICATED for 401, PERMISSION_DENIED for 403), and the decision metadata names
// the rule and says key_missing.
func TestMissingKeyGRPC(t *testing.T) {
	for _, tc := range []struct {
		policy string
		status uint32
		grpc   int32
	}{
		{`"deny"`, 401, 16},
		{`{"action":"deny","status":403}`, 403, 7},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			g := newGateway(t, `{"retry_jitter_ms":0,"rules":[{"id":"r","limit":2,"window":"1m","key":{"source":"header","name":"x-tenant"},"missing_key":`+tc.policy+`}]}`)
			s := g.send("/svc.Orders/List", "content-type: application/grpc")
			if s.Local == nil || s.Local.Status != tc.status || s.Local.GRPCStatus != tc.grpc || string(s.Local.Body) != "no caller key for rule r" {
				t.Fatalf("answer %s (grpc-status %v), want %d with grpc-status %d", answer(s), s.Local, tc.status, tc.grpc)
			}
			if got := s.FilterState["tollgate"]; got != "rule=r decision=key_missing degraded=false" {
				t.Errorf("decision metadata %q", got)
			}
			if s := g.send("/x"); s.Local == nil || s.Local.GRPCStatus != -1 || !strings.Contains(string(s.Local.Body), `"rule":"r"`) {
				t.Errorf("plain HTTP request: %s, want the JSON body", answer(s))
			}
		})
	}
}
