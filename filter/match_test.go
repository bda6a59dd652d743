//go:build !wasip1

package main

import (
	"encoding/base64"
	"encoding/json"
	"testing"

	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// These tests run the compiled module in internal/wazerohost: match conditions, key sources and
// missing-key policies as the filter applies them behind Envoy's ABI (the property path
// of dynamic metadata included).

type mreq struct {
	method, path, host string
	headers            []wasmhost.Pair
	meta               map[string]any // jwt_authn payload at my_payload
	state              map[string]string
}

func (m mreq) request() *wasmhost.Request {
	r := &wasmhost.Request{Method: "GET", Path: "/x", Authority: "api.example.com", RemoteAddr: "10.1.2.3:40000",
		Header: append([]wasmhost.Pair{{"x-api-key", "k1"}}, m.headers...)}
	if m.method != "" {
		r.Method = m.method
	}
	if m.path != "" {
		r.Path = m.path
	}
	if m.host != "" {
		r.Authority = m.host
	}
	if m.meta != nil {
		r.Metadata = wasmhost.Metadata{wasmhost.JWTAuthnFilter: {"my_payload": m.meta}}
	}
	r.FilterState = m.state
	return r
}

// TestCompiledMatchConditions: a rule of limit 1 refuses the second request it
// matches; a request it does not match passes both times.
func TestCompiledMatchConditions(t *testing.T) {
	for _, tc := range []struct {
		name, match string
		req         mreq
		want        bool
	}{
		{"host", `{"hosts":["*.example.com"]}`, mreq{host: "API.example.com:443"}, true},
		{"host other", `{"hosts":["*.example.com"]}`, mreq{host: "example.org"}, false},
		{"prefix", `{"prefix":"/v1"}`, mreq{path: "/v1/a?x=1"}, true},
		{"path exact", `{"path":"/v1/login"}`, mreq{path: "/v1//login?next=/"}, true},
		{"path exact other", `{"path":"/v1/login"}`, mreq{path: "/v1/login/x"}, false},
		{"regex", `{"regex":"^/v[0-9]+/a$"}`, mreq{path: "/v7/a"}, true},
		{"method", `{"methods":["POST"]}`, mreq{method: "POST"}, true},
		{"method other", `{"methods":["POST"]}`, mreq{method: "GET"}, false},
		{"header present", `{"headers":[{"name":"x-debug"}]}`, mreq{headers: []wasmhost.Pair{{"x-debug", "1"}}}, true},
		{"header absent", `{"headers":[{"name":"x-debug"}]}`, mreq{}, false},
		{"header exact", `{"headers":[{"name":"x-env","exact":"prod"}]}`, mreq{headers: []wasmhost.Pair{{"x-env", "prod"}}}, true},
		{"header exact other", `{"headers":[{"name":"x-env","exact":"prod"}]}`, mreq{headers: []wasmhost.Pair{{"x-env", "dev"}}}, false},
		{"header prefix", `{"headers":[{"name":"authorization","prefix":"Bearer "}]}`, mreq{headers: []wasmhost.Pair{{"authorization", "Bearer t"}}}, true},
		{"header regex", `{"headers":[{"name":"user-agent","regex":"(?i)bot"}]}`, mreq{headers: []wasmhost.Pair{{"user-agent", "SomeBot/1"}}}, true},
		{"header regex other", `{"headers":[{"name":"user-agent","regex":"(?i)bot"}]}`, mreq{headers: []wasmhost.Pair{{"user-agent", "curl"}}}, false},
		{"header not", `{"headers":[{"name":"x-internal","not":true}]}`, mreq{headers: []wasmhost.Pair{{"x-internal", "1"}}}, false},
		{"query present", `{"query":[{"name":"debug"}]}`, mreq{path: "/x?a=1&debug"}, true},
		{"query exact", `{"query":[{"name":"format","exact":"csv"}]}`, mreq{path: "/x?format=%63sv"}, true},
		{"query exact other", `{"query":[{"name":"format","exact":"csv"}]}`, mreq{path: "/x?format=json"}, false},
		{"not block", `{"prefix":"/v1","not":{"path":"/v1/health"}}`, mreq{path: "/v1/health"}, false},
		{"three conditions", `{"hosts":["api.example.com"],"prefix":"/v1","headers":[{"name":"x-env","exact":"prod"}]}`,
			mreq{path: "/v1/a", headers: []wasmhost.Pair{{"x-env", "prod"}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newGateway(t, wasmhost.Config{PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
				"rules":[{"id":"r","limit":1,"window":"1m","match":` + tc.match + `}]}`)})
			h.Handle(tc.req.request())
			r := h.Handle(tc.req.request())
			want := 200
			if tc.want {
				want = 429
			}
			if r.Status != want {
				t.Errorf("second request: %d %s, want %d", r.Status, r.Body, want)
			}
		})
	}
}

// TestCompiledKeySources: requests with the same key share a bucket of 1, another key
// has its own.
func TestCompiledKeySources(t *testing.T) {
	const ns = `"namespace":"envoy.filters.http.jwt_authn"`
	for _, tc := range []struct {
		name, key   string
		same, other mreq
	}{
		{"query", `{"source":"query","name":"api_key"}`, mreq{path: "/x?api_key=a"}, mreq{path: "/x?api_key=b"}},
		{"metadata claim", `{"source":"metadata",` + ns + `,"path":"my_payload.sub"}`,
			mreq{meta: map[string]any{"sub": "u1"}}, mreq{meta: map[string]any{"sub": "u2"}}},
		{"metadata nested claim", `{"source":"metadata",` + ns + `,"path":["my_payload","org","id"]}`,
			mreq{meta: map[string]any{"org": map[string]any{"id": "acme"}}}, mreq{meta: map[string]any{"org": map[string]any{"id": "other"}}}},
		{"composite tenant:user", `{"source":"composite","parts":[{"source":"metadata",` + ns + `,"path":"my_payload.tenant"},{"source":"metadata",` + ns + `,"path":"my_payload.sub"}]}`,
			mreq{meta: map[string]any{"tenant": "t1", "sub": "u"}}, mreq{meta: map[string]any{"tenant": "t2", "sub": "u"}}},
		{"filter state", `{"source":"filter_state","name":"tenant"}`,
			mreq{state: map[string]string{"tenant": "t1"}}, mreq{state: map[string]string{"tenant": "t2"}}},
		{"bearer stripped, lower-cased", `{"source":"header","name":"authorization","strip_prefix":"Bearer ","lowercase":true}`,
			mreq{headers: []wasmhost.Pair{{"authorization", "Bearer ABC"}}}, mreq{headers: []wasmhost.Pair{{"authorization", "Bearer abd"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newGateway(t, wasmhost.Config{PluginConfig: []byte(`{"retry_jitter_ms":0,"rules":[{"id":"r","limit":1,"window":"1m","key":` +
				tc.key + `,"missing_key":"deny"}]}`)})
			for i, want := range []int{200, 429} {
				if r := h.Handle(tc.same.request()); r.Status != want {
					t.Fatalf("same key, request %d: %d %s, want %d", i, r.Status, r.Body, want)
				}
			}
			if r := h.Handle(tc.other.request()); r.Status != 200 {
				t.Fatalf("other key: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestCompiledMissingKey: a request without the key passes (skip), gets 401/403 with
// the JSON body (deny), or is limited under the client IP (fallback).
func TestCompiledMissingKey(t *testing.T) {
	const key = `"key":{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.sub"}`
	for _, tc := range []struct {
		name, policy string
		want         []int
		code         string
	}{
		{"skip", `"skip"`, []int{200, 200, 200}, ""},
		{"deny", `"deny"`, []int{401, 401}, "UNAUTHENTICATED"},
		{"deny 403", `{"action":"deny","status":403}`, []int{403}, "FORBIDDEN"},
		{"fallback", `{"action":"fallback","key":{"source":"ip"}}`, []int{200, 200, 429}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newGateway(t, wasmhost.Config{PluginConfig: []byte(`{"retry_jitter_ms":0,"rules":[{"id":"r","limit":2,"window":"1m",` +
				key + `,"missing_key":` + tc.policy + `}]}`)})
			for i, want := range tc.want {
				r := h.Handle(mreq{}.request())
				if r.Status != want {
					t.Fatalf("request %d: %d %s, want %d", i, r.Status, r.Body, want)
				}
				if tc.code != "" {
					var body struct {
						Error struct {
							Code    string
							Details struct {
								Status int
								Rule   string
							}
						}
					}
					if err := json.Unmarshal(r.Body, &body); err != nil || body.Error.Code != tc.code || body.Error.Details.Rule != "r" ||
						body.Error.Details.Status != want || r.Get("content-type") != "application/json" {
						t.Fatalf("refusal %q (content-type %q): %+v %v", r.Body, r.Get("content-type"), body, err)
					}
				}
			}
			if r := h.Handle(mreq{meta: map[string]any{"sub": "u1"}}.request()); r.Status != 200 || r.Get("ratelimit-policy") == "" {
				t.Fatalf("with key: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestCompiledJWTAuthnMetadata: the host's jwt_authn stand-in puts the token's payload in
// dynamic metadata and the filter keys on its claim (numbers come back as doubles and
// are no key).
func TestCompiledJWTAuthnMetadata(t *testing.T) {
	h := newGateway(t, wasmhost.Config{JWTAuthn: &wasmhost.JWTAuthn{PayloadInMetadata: "my_payload"},
		PluginConfig: []byte(`{"retry_jitter_ms":0,"rules":[{"id":"r","limit":1,"window":"1m",
			"key":{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.sub"},"missing_key":"deny"}]}`)})
	tok := func(payload string) wasmhost.Pair {
		return wasmhost.Pair{"authorization", "Bearer eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".c2ln"}
	}
	for i, tc := range []struct {
		auth wasmhost.Pair
		want int
	}{
		{tok(`{"sub":"alice"}`), 200},
		{tok(`{"sub":"alice","iat":1}`), 429},
		{tok(`{"sub":"bob"}`), 200},
		{tok(`{"sub":12345}`), 401}, // a number claim is an 8-byte double: no key
		{wasmhost.Pair{"x-other", "1"}, 401},
	} {
		r := h.Handle(mreq{headers: []wasmhost.Pair{tc.auth}}.request())
		if r.Status != tc.want {
			t.Errorf("request %d: %d %s, want %d", i, r.Status, r.Body, tc.want)
		}
	}
}
