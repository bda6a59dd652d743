package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// A trading bot: 500 requests within a second against 100/min. Exactly the
// bucket's capacity is admitted (the refill over the run is far below one token), the rest
// get 429 with Retry-After, and every answer carries the rate-limit headers.
func TestTradingBotBurst(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},
		"rules":[{"id":"api","limit":100,"window":"1m"}]}`)
	admitted, rejected := 0, 0
	for i := 0; i < 500; i++ {
		a := e.do("/orders", "x-api-key", "bot-1")
		for _, h := range []string{"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit-policy", "ratelimit"} {
			if !a.has(h) {
				t.Fatalf("answer %d (%d) lacks %s: %v", i, a.status, h, a.headers)
			}
		}
		switch a.status {
		case 200:
			admitted++
			if want := strconv.Itoa(100 - admitted); a.get("x-ratelimit-remaining") != want {
				t.Fatalf("answer %d: remaining %q, want %s", i, a.get("x-ratelimit-remaining"), want)
			}
		case 429:
			rejected++
			ra, err := strconv.Atoi(a.get("retry-after"))
			if err != nil || ra < 1 {
				t.Fatalf("429 with retry-after %q", a.get("retry-after"))
			}
			if a.get("x-ratelimit-rule") != "api" {
				t.Fatalf("429 names rule %q", a.get("x-ratelimit-rule"))
			}
			var body struct {
				Error struct {
					Code    string
					Details struct {
						Limit             int    `json:"limit"`
						WindowSeconds     int    `json:"window_seconds"`
						RetryAfterSeconds int    `json:"retry_after_seconds"`
						ResetAt           string `json:"reset_at"`
						Rule              string `json:"rule"`
					}
				}
			}
			if err := json.Unmarshal([]byte(a.body), &body); err != nil {
				t.Fatalf("429 body %q: %v", a.body, err)
			}
			d := body.Error.Details
			if body.Error.Code != "RATE_LIMIT_EXCEEDED" || d.Limit != 100 || d.WindowSeconds != 60 || d.RetryAfterSeconds != ra || d.Rule != "api" || d.ResetAt == "" {
				t.Fatalf("429 body %+v (retry-after %d)", body, ra)
			}
		default:
			t.Fatalf("answer %d: status %d", i, a.status)
		}
	}
	if admitted != 100 || rejected != 400 {
		t.Fatalf("admitted %d, rejected %d; want exactly the capacity (100) admitted", admitted, rejected)
	}
	if got := e.counter("requests_allowed"); got != 100 {
		t.Fatalf("requests_allowed = %d", got)
	}
	if got := e.counter("requests_rejected"); got != 400 {
		t.Fatalf("requests_rejected = %d", got)
	}
}

func TestPerEndpointLimits(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},"rules":[
		{"id":"search","match":{"prefix":"/search"},"limit":3,"window":"1m"},
		{"id":"users","match":{"prefix":"/users"},"limit":5,"window":"1m"}]}`)
	if got := e.count(10, "/search", "x-api-key", "k"); got[200] != 3 || got[429] != 7 {
		t.Fatalf("/search: %v", got)
	}
	if got := e.count(10, "/users/42", "x-api-key", "k"); got[200] != 5 || got[429] != 5 {
		t.Fatalf("/users: %v", got)
	}
	if a := e.do("/health", "x-api-key", "k"); a.status != 200 || a.has("x-ratelimit-limit") {
		t.Fatalf("unmatched route: %d %v", a.status, a.headers)
	}
	// Another key has its own quota.
	if got := e.count(3, "/search", "x-api-key", "other"); got[200] != 3 {
		t.Fatalf("second key: %v", got)
	}
}

func TestTiersAndOverrides(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},
		"tiers":[{"name":"pro","keys":["sk_pro_*"]},{"name":"free","keys":["sk_free_*"]}],
		"rules":[{"id":"api","limit":2,"window":"1m",
			"tiers":{"free":{"limit":3,"window":"1m"},"pro":{"limit":6,"window":"1m"}},
			"overrides":[{"key":"sk_pro_vip","limit":9,"window":"1m"}]}]}`)
	tests := []struct {
		key  string
		want int
	}{
		{"nobody", 2}, {"sk_free_1", 3}, {"sk_pro_1", 6}, {"sk_pro_vip", 9},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := e.count(12, "/x", "x-api-key", tt.key); got[200] != tt.want {
				t.Fatalf("admitted %v, want %d", got, tt.want)
			}
			if a := e.do("/x", "x-api-key", tt.key); a.get("x-ratelimit-limit") != strconv.Itoa(tt.want) {
				t.Fatalf("x-ratelimit-limit %q, want %d", a.get("x-ratelimit-limit"), tt.want)
			}
		})
	}
}

func TestAllowDenyLists(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},
		"allow":["sk_internal_*","192.168.7.0/24"],"deny":["sk_revoked_*","10.0.0.0/8"],
		"rules":[{"id":"api","limit":1,"window":"1m"}]}`, [2]string{"source.address", "192.168.7.9:4000"})
	for i := 0; i < 3; i++ {
		a := e.do("/x", "x-api-key", "sk_revoked_9")
		if a.status != 403 || !strings.Contains(a.body, `"FORBIDDEN"`) || !strings.Contains(a.body, "sk_revoked_*") {
			t.Fatalf("revoked key: %d %s", a.status, a.body)
		}
	}
	// The peer is in the allowed CIDR: every key bypasses, and the answer says so.
	for i := 0; i < 3; i++ {
		a := e.do("/x", "x-api-key", "anyone")
		if a.status != 200 || a.get("x-ratelimit-policy") != "bypass" {
			t.Fatalf("allow-listed address: %d %v", a.status, a.headers)
		}
	}
	if got := e.counter("requests_denied_by_list"); got != 3 {
		t.Fatalf("denied metric %d", got)
	}
	if got := e.counter("requests_bypassed"); got != 3 {
		t.Fatalf("bypassed metric %d", got)
	}

	e.reset() // the emulator holds one host at a time
	e2 := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},
		"allow":["sk_internal_*"],"deny":["10.0.0.0/8"],
		"rules":[{"id":"api","limit":1,"window":"1m"}]}`, [2]string{"source.address", "10.3.4.5:4000"})
	if a := e2.do("/x", "x-api-key", "sk_internal_1"); a.status != 403 {
		t.Fatalf("deny CIDR must beat the allow glob: %d", a.status)
	}
}

func TestAlgorithmsThroughTheFilter(t *testing.T) {
	for _, algo := range []string{"token_bucket", "gcra", "sliding_window_log", "sliding_window_counter", "fixed_window"} {
		t.Run(algo, func(t *testing.T) {
			e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},
				"rules":[{"id":"r","algorithm":"`+algo+`","limit":5,"window":"1h"}]}`)
			got := e.count(8, "/x", "x-api-key", "k")
			if got[200] != 5 || got[429] != 3 {
				t.Fatalf("%s: %v, want 5 admitted then 429", algo, got)
			}
		})
	}
}

func TestCostAndMultiWindow(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},"rules":[
		{"id":"embed","limit":30,"window":"1m","costs":[{"prefix":"/embed","cost":10}]},
		{"id":"multi","match":{"prefix":"/multi"},"windows":[{"limit":3,"window":"1s"},{"limit":100,"window":"1h"}]}]}`)
	if got := e.count(5, "/embed", "x-api-key", "k"); got[200] != 3 {
		t.Fatalf("cost 10 of 30: %v", got)
	}
	a := e.do("/multi", "x-api-key", "m")
	if pol := a.get("ratelimit-policy"); !strings.Contains(pol, "w=1") || !strings.Contains(pol, "w=3600") {
		t.Fatalf("RateLimit-Policy must list both windows: %q", pol)
	}
	if got := e.count(5, "/multi", "x-api-key", "m"); got[200] != 2 {
		t.Fatalf("1s window of 3: %v", got)
	}
}

// A denial consumes nothing from the request's other buckets.
func TestDenialConsumesNothingElse(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},"rules":[
		{"id":"tenant","key":{"source":"header","name":"x-tenant"},"limit":100,"window":"1m"},
		{"id":"user","key":{"source":"composite","parts":[{"source":"header","name":"x-tenant"},{"source":"header","name":"x-user"}]},"limit":2,"window":"1m"}]}`)
	e.count(10, "/x", "x-tenant", "t1", "x-user", "u1") // 2 admitted, 8 refused by the user rule
	a := e.do("/x", "x-tenant", "t1", "x-user", "u2")
	if a.status != 200 || a.get("x-ratelimit-remaining") != "1" {
		t.Fatalf("u2's first request: %d remaining %q", a.status, a.get("x-ratelimit-remaining"))
	}
	// The tenant bucket was charged only for the 3 admitted requests: 97 left.
	if pol := a.get("ratelimit"); !strings.Contains(pol, "r=1") {
		t.Fatalf("most restrictive window should be the user's: %q", pol)
	}
	e.reset()
	e2 := startEmu(t, `{"key":{"source":"header","name":"x-tenant"},"rules":[
		{"id":"tenant","limit":3,"window":"1m"},
		{"id":"user","key":{"source":"composite","parts":[{"source":"header","name":"x-tenant"},{"source":"header","name":"x-user"}]},"limit":100,"window":"1m"}]}`)
	got := map[int]int{}
	for i := 0; i < 6; i++ {
		got[e2.do("/x", "x-tenant", "t", "x-user", "u"+itoa(i%2)).status]++
	}
	if got[200] != 3 {
		t.Fatalf("tenant cap must bound its users together: %v", got)
	}
}

func TestKeysFromJWTAndIP(t *testing.T) {
	// header.payload.signature with payload {"sub":"alice","org":{"id":"acme"}}
	jwt := func(payload string) string {
		return "Bearer eyJhbGciOiJIUzI1NiJ9." + b64url(payload) + ".c2ln"
	}
	e := startEmu(t, `{"rules":[
		{"id":"by-org","key":{"source":"jwt","claim":"org.id"},"limit":2,"window":"1m"},
		{"id":"by-ip","match":{"prefix":"/ip"},"key":{"source":"ip","trusted_hops":1},"limit":1,"window":"1m"}]}`,
		[2]string{"source.address", "127.0.0.1:9999"})
	alice := jwt(`{"sub":"alice","org":{"id":"acme"}}`)
	bob := jwt(`{"sub":"bob","org":{"id":"acme"}}`)
	if got := e.count(2, "/a", "authorization", alice); got[200] != 2 {
		t.Fatalf("alice: %v", got)
	}
	if a := e.do("/a", "authorization", bob); a.status != 429 {
		t.Fatalf("bob shares acme's quota, got %d", a.status)
	}
	if a := e.do("/a", "authorization", jwt(`{"sub":"carol","org":{"id":"other"}}`)); a.status != 200 {
		t.Fatalf("another org: %d", a.status)
	}
	// The rightmost x-forwarded-for entry (added by the trusted edge) is the client.
	if a := e.do("/ip", "x-forwarded-for", "6.6.6.6, 1.2.3.4"); a.status != 200 {
		t.Fatalf("first from 1.2.3.4: %d", a.status)
	}
	if a := e.do("/ip", "x-forwarded-for", "7.7.7.7, 1.2.3.4"); a.status != 429 {
		t.Fatalf("a forged left entry must not buy a new quota: %d", a.status)
	}
	if a := e.do("/ip", "x-forwarded-for", "1.2.3.5"); a.status != 200 {
		t.Fatalf("another client: %d", a.status)
	}
}

func TestShadowRule(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},"rules":[
		{"id":"trial","limit":2,"window":"1m","shadow":true}]}`)
	for i := 0; i < 5; i++ {
		a := e.do("/x", "x-api-key", "k")
		if a.status != 200 {
			t.Fatalf("a shadow rule never rejects: %d", a.status)
		}
		if (i >= 2) != (a.get("x-ratelimit-shadow") == "trial") {
			t.Fatalf("request %d: x-ratelimit-shadow %q", i, a.get("x-ratelimit-shadow"))
		}
	}
	if got := e.counter("requests_shadow_rejected"); got != 3 {
		t.Fatalf("shadow metric %d", got)
	}
}

func TestBadConfigRefusedWithField(t *testing.T) {
	tests := []struct{ name, config, field string }{
		{"negative limit", `{"rules":[{"id":"a","limit":-5,"window":"1m"}]}`, "rules[0].limit"},
		{"unknown algorithm", `{"rules":[{"id":"a","algorithm":"leaky","limit":5,"window":"1m"}]}`, "rules[0].algorithm"},
		{"bad CIDR", `{"deny":["10.0.0.0/33"],"rules":[]}`, "deny[0]"},
		{"not JSON", `{"rules":[`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEmu(t, tt.config)
			if st := e.host.StartPlugin(); st == types.OnPluginStartStatusOK {
				t.Fatal("plugin accepted a bad configuration")
			}
			logs := strings.Join(e.host.GetCriticalLogs(), "\n")
			if !strings.Contains(logs, "invalid plugin configuration") || !strings.Contains(logs, tt.field) {
				t.Fatalf("critical log %q does not name %q", logs, tt.field)
			}
		})
	}
}

// Envoy pushes a new plugin configuration to the running VM: the new rules apply to the
// next request; a bad update is refused and the previous rules keep serving.
func TestHotReconfiguration(t *testing.T) {
	e := startEmu(t, `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"a","limit":2,"window":"1m"}]}`)
	if got := e.count(3, "/x", "x-api-key", "k"); got[200] != 2 {
		t.Fatalf("before: %v", got)
	}
	e.reset()
	e.open(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"b","limit":5,"window":"1m"}]}`)
	if st := e.host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatal("new configuration refused")
	}
	if a := e.do("/x", "x-api-key", "k"); a.status != 200 || a.get("x-ratelimit-limit") != "5" {
		t.Fatalf("after reload: %d limit %q", a.status, a.get("x-ratelimit-limit"))
	}
	e.reset()
	e.open(`{"rules":[{"id":"c","limit":0,"window":"1m"}]}`)
	if st := e.host.StartPlugin(); st == types.OnPluginStartStatusOK {
		t.Fatal("bad update accepted")
	}
	if a := e.do("/x", "x-api-key", "k2"); a.status != 200 || a.get("x-ratelimit-limit") != "5" {
		t.Fatalf("previous rules must keep serving: %d limit %q", a.status, a.get("x-ratelimit-limit"))
	}
}

// The module's imports and exports are ABI-exact, it imports only the WASI functions
// every Envoy with a Wasm runtime offers, and _initialize calls only what Envoy's
// start-up allow-list admits (README "Supported proxies"). The calls are printed so a
// change shows in the test log.
func TestFilterABIAndStartup(t *testing.T) {
	wasm := wasmtest.FilterWasm(t)
	wasmtest.CheckABI(t, wasm)
	wasmtest.CheckWASIImports(t, wasm)
	wasmtest.CheckStartup(t, wasm)
	calls, err := wasmtest.StartupWASICalls(wasm)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("_initialize calls: %v", calls)
}
