package rls

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// TestLevers: the rate limit service applies the rule set's enforcement and a rule's
// rollout as the filter does (rule.Config.Shadowed): under shadow a spent bucket is
// reported, not refused; under off nothing is charged; with rollout_percent the keys
// rule.Rule.RolledOut names are refused and the others shadowed.
func TestLevers(t *testing.T) {
	const rules = `"rules": [{"id": "lever", "limit": 1, "window": "1h",
		"descriptors": {"domain": "levers", "entries": [{"key": "api_key"}]}}]`
	for _, tc := range []struct {
		name, doc string
		// second is the answer to a key's second call; shadow names the rule in
		// x-ratelimit-shadow.
		second rlsv3.RateLimitResponse_Code
		shadow bool
	}{
		{"on", `{"enforcement": "on", ` + rules + `}`, rlsv3.RateLimitResponse_OVER_LIMIT, false},
		{"shadow", `{"enforcement": "shadow", ` + rules + `}`, rlsv3.RateLimitResponse_OK, true},
		{"off", `{"enforcement": "off", ` + rules + `}`, rlsv3.RateLimitResponse_OK, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, opts{})
			e.putRules(t, tc.doc)
			req := &rlsv3.RateLimitRequest{Domain: "levers", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", uniq("lever"))}}
			for i := 1; i <= 2; i++ {
				resp, err := e.call(t, secret, req)
				if err != nil {
					t.Fatal(err)
				}
				want := rlsv3.RateLimitResponse_OK
				if i == 2 {
					want = tc.second
				}
				if resp.OverallCode != want {
					t.Fatalf("call %d: %v, want %v", i, resp.OverallCode, want)
				}
				if got := headers(resp)[header.XShadow] != ""; i == 2 && got != tc.shadow {
					t.Errorf("call %d: shadow header %v, want %v", i, got, tc.shadow)
				}
			}
		})
	}
	t.Run("rollout", func(t *testing.T) {
		e := start(t, opts{})
		e.putRules(t, `{"rules": [{"id": "canary", "limit": 1, "window": "1h", "rollout_percent": 30,
			"descriptors": {"domain": "canary", "entries": [{"key": "api_key"}]}}]}`)
		r := &rule.Rule{ID: "canary", ShadowBP: 7000}
		enforced := 0
		for i := range 100 {
			key := uniq("c")
			req := &rlsv3.RateLimitRequest{Domain: "canary", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", key)}}
			var resp *rlsv3.RateLimitResponse
			for range 2 {
				var err error
				if resp, err = e.call(t, secret, req); err != nil {
					t.Fatal(err)
				}
			}
			refused := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
			if refused != r.RolledOut(key) {
				t.Fatalf("key %d: refused %v, rule.RolledOut %v", i, refused, r.RolledOut(key))
			}
			if refused {
				enforced++
			}
		}
		if enforced == 0 || enforced == 100 {
			t.Fatalf("%d of 100 keys enforced at 30 %%", enforced)
		}
	})
}
