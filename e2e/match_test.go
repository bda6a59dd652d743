package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// TestJWTMetadataTenantLimits: two gateways behind a jwt_authn stand-in (the host puts
// each bearer token's payload in dynamic metadata, as Envoy's jwt_authn does with
// payload_in_metadata) limit by the tenant claim read through proxy_get_property, synced
// through the service: two tenants get separate quotas across the fleet, and a request
// without the claim gets each rule's missing-key answer — skip passes it, deny answers
// 401 or 403 with the JSON body, fallback limits it under the x-client header.
func TestJWTMetadataTenantLimits(t *testing.T) {
	// One at a time (not t.Parallel): it counts exact quotas over a second or less
	// through the shared services, which the parallel scenarios keep busy.
	e := sharedEnv(t)
	id := uniqueKey("jwtmeta")
	const tenantKey = `{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.tenant"}`
	rules := fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[
	  {"id":"%[1]s-tenant","match":{"prefix":"/t"},"key":%[2]s,"limit":5,"window":"1h","missing_key":"skip"},
	  {"id":"%[1]s-deny","match":{"prefix":"/deny"},"key":%[2]s,"limit":100,"window":"1h","missing_key":"deny"},
	  {"id":"%[1]s-deny403","match":{"prefix":"/forbid"},"key":%[2]s,"limit":100,"window":"1h","missing_key":{"action":"deny","status":403}},
	  {"id":"%[1]s-fallback","match":{"prefix":"/fb"},"key":%[2]s,"limit":2,"window":"1h",
	   "missing_key":{"action":"fallback","key":{"source":"header","name":"x-client"}}}]}`, id, tenantKey)
	gws := make([]*harness.Gateway, 2)
	for i := range gws {
		g, err := harness.StartGateway(harness.GatewayConfig{
			Wasm: e.bins.Wasm, Workers: 2, NodeID: fmt.Sprintf("%s-gw%d", id, i+1),
			Rules: []byte(rules), Pin: pinned, Services: e.serviceAddrs(), Secret: syncSecret,
			Sync: harness.Sync{ExpectedNodes: 2}, Upstream: e.upstream.URL,
			JWTAuthn: &wazerohost.JWTAuthn{PayloadInMetadata: "my_payload"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		gws[i] = g
	}
	ctx := ctxFor(t, 60*time.Second)
	bearer := func(tenant, sub string) [2]string {
		payload, _ := json.Marshal(map[string]any{"tenant": tenant, "sub": sub, "iat": 1_700_000_000})
		return [2]string{"authorization", "Bearer eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(payload) + ".c2ln"}
	}
	tenantA, tenantB := id+"-acme", id+"-globex"

	// Two tenants, alternating between the gateways and between users of a tenant:
	// each tenant's quota of 5 is its own and is shared by its users.
	admitted := map[string]int{}
	for i := 0; i < 8; i++ {
		for _, tenant := range []string{tenantA, tenantB} {
			a := e.client.Get(ctx, gws[i%2].URL, "/t/orders", "", bearer(tenant, fmt.Sprintf("user-%d", i%3)))
			if a.Err != nil {
				t.Fatal(a.Err)
			}
			if a.OK() {
				admitted[tenant]++
			} else if a.Status != 429 {
				t.Fatalf("tenant %s: %d %s", tenant, a.Status, a.Body)
			}
		}
	}
	t.Logf("admitted of 8 each: %v", admitted)
	for _, tenant := range []string{tenantA, tenantB} {
		if admitted[tenant] != 5 {
			t.Errorf("tenant %s: %d of 8 admitted, want its quota of 5", tenant, admitted[tenant])
		}
	}

	// Without a token the tenant rule is skipped: unlimited by it.
	for i := 0; i < 8; i++ {
		if a := e.client.Get(ctx, gws[i%2].URL, "/t/orders", ""); a.Status != 200 || a.Get("ratelimit-policy") != "" {
			t.Fatalf("skip, request %d: %d (policy %q) %s", i, a.Status, a.Get("ratelimit-policy"), a.Body)
		}
	}

	// deny: 401 or 403 with the JSON body naming the rule; with a token, admitted.
	for _, tc := range []struct {
		path, rule, code string
		status           int
	}{
		{"/deny", id + "-deny", "UNAUTHENTICATED", 401},
		{"/forbid", id + "-deny403", "FORBIDDEN", 403},
	} {
		a := e.client.Get(ctx, gws[0].URL, tc.path, "", [2]string{"authorization", "Bearer not-a-jwt"})
		var body struct {
			Error struct {
				Code    string
				Message string
				Details struct {
					Status int
					Rule   string
				}
			}
		}
		if err := json.Unmarshal(a.Body, &body); err != nil || a.Status != tc.status || body.Error.Code != tc.code ||
			body.Error.Details.Rule != tc.rule || body.Error.Details.Status != tc.status || a.Get("content-type") != "application/json" {
			t.Errorf("%s without a key: %d %q (content-type %q), want %d %s for rule %s", tc.path, a.Status, a.Body, a.Get("content-type"), tc.status, tc.code, tc.rule)
		}
		if a := e.client.Get(ctx, gws[1].URL, tc.path, "", bearer(tenantA, "u")); a.Status != 200 {
			t.Errorf("%s with a key: %d %s", tc.path, a.Status, a.Body)
		}
	}

	// fallback: without a token the request is limited under x-client (2 per hour,
	// across both gateways); another client has its own quota; a tenant is keyed by
	// its claim.
	client := [2]string{"x-client", id + "-c1"}
	var fb []int
	ok := 0
	for i := 0; i < 4; i++ {
		a := e.client.Get(ctx, gws[i%2].URL, "/fb", "", client)
		fb = append(fb, a.Status)
		if a.OK() {
			ok++
		} else if a.Status != 429 {
			t.Fatalf("fallback: %d %s", a.Status, a.Body)
		}
	}
	if ok != 2 {
		t.Errorf("fallback under x-client: %v, want 2 of 4 admitted (its quota)", fb)
	}
	if a := e.client.Get(ctx, gws[0].URL, "/fb", "", [2]string{"x-client", id + "-c2"}); a.Status != 200 {
		t.Errorf("fallback, another client: %d %s", a.Status, a.Body)
	}
	if a := e.client.Get(ctx, gws[1].URL, "/fb", "", bearer(tenantB, "u"), client); a.Status != 200 {
		t.Errorf("fallback rule with a tenant claim: %d %s", a.Status, a.Body)
	}
	if a := e.client.Get(ctx, gws[0].URL, "/fb", ""); a.Status != 200 || a.Get("ratelimit-policy") != "" {
		t.Errorf("fallback without either key: %d (policy %q), want unlimited", a.Status, a.Get("ratelimit-policy"))
	}
	if n := gws[0].Metric("tollgate.requests_key_missing") + gws[1].Metric("tollgate.requests_key_missing"); n != 2 {
		t.Errorf("tollgate.requests_key_missing = %d, want 2", n)
	}
}
