package plugin_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// TestLevers pins the answers under the emergency levers and for gRPC callers: what a
// client sees for each request of a sequence.
func TestLevers(t *testing.T) {
	const grpcCT = "content-type: application/grpc"
	type step struct {
		headers []string
		want    string
		grpc    int32 // the gRPC status asked of the proxy (-1: none)
	}
	for _, tc := range []struct {
		name   string
		config string
		down   bool // the sync service is unreachable
		steps  []step
	}{
		{"enforcement shadow", `{"enforcement":"shadow","key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
			"rules":[{"id":"api","limit":1,"window":"1m"}]}`, false, []step{
			{[]string{"x-api-key: k1"}, `200`, -1},
			{[]string{"x-api-key: k1"}, `200 | x-ratelimit-shadow: api`, -1},
		}},
		{"enforcement off", `{"enforcement":"off","key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
			"deny":["sk_revoked_*"],"rules":[{"id":"api","limit":1,"window":"1m"}]}`, false, []step{
			{[]string{"x-api-key: k1"}, `200`, -1},
			{[]string{"x-api-key: k1"}, `200`, -1},
			{[]string{"x-api-key: sk_revoked_1"}, `403 | body {"error":{"code":"FORBIDDEN","message":"API key is not allowed","details":{"matched":"sk_revoked_*"}}}`, -1},
		}},
		{"grpc", cfgOne, false, []step{
			{[]string{"x-api-key: k1", grpcCT}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 2 | x-ratelimit-reset: 1700000020 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=2;t=20`, -1},
			{[]string{"x-api-key: k1", "content-type: application/grpc+proto"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 1 | x-ratelimit-reset: 1700000040 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=1;t=40`, -1},
			{[]string{"x-api-key: k1", grpcCT}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000060 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=60`, -1},
			{[]string{"x-api-key: k1", grpcCT}, `429 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000060 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=20 | retry-after: 20 | x-ratelimit-rule: api | body rate limited by rule api; retry after 20 s`, 8},
			{[]string{"x-api-key: k1", "content-type: application/json"}, `429 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000060 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=20 | retry-after: 20 | x-ratelimit-rule: api | body {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 3 requests per 60 seconds exceeded","details":{"limit":3,"window_seconds":60,"retry_after_seconds":20,"reset_at":"2023-11-14T22:14:20Z","rule":"api"}}}`, -1},
			{[]string{"x-api-key: k1", "content-type: application/grpcx"}, `429 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000060 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=20 | retry-after: 20 | x-ratelimit-rule: api | body {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 3 requests per 60 seconds exceeded","details":{"limit":3,"window_seconds":60,"retry_after_seconds":20,"reset_at":"2023-11-14T22:14:20Z","rule":"api"}}}`, -1},
		}},
		{"grpc deny and fail closed", `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"deny":["sk_revoked_*"],
			"sync":{"cluster":"svc","interval_ms":100,"breaker_failures":1},
			"rules":[{"id":"closed","fail":"closed","limit":3,"window":"1m"}]}`, true, []step{
			{[]string{"x-api-key: sk_revoked_1", grpcCT}, `403 | body denied by sk_revoked_*`, 7},
			{[]string{"x-api-key: k1", grpcCT}, `503 | x-ratelimit-limit: 3 | x-ratelimit-remaining: -1 | x-ratelimit-reset: 1700000021 | x-ratelimit-policy: degraded | ratelimit-policy: "closed-1m";q=3;w=60 | retry-after: 1 | x-ratelimit-rule: closed | body rate limiter unavailable for rule closed; retry after 1 s`, 14},
		}},
		{"degraded limit", `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
			"sync":{"cluster":"svc","interval_ms":100,"breaker_failures":1},
			"rules":[{"id":"api","limit":3,"window":"1m","degraded_limit":1}]}`, true, []step{
			{[]string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 1 | x-ratelimit-remaining: -1 | x-ratelimit-reset: 1700000061 | x-ratelimit-policy: degraded | ratelimit-policy: "api-1m";q=1;w=60`, -1},
			{[]string{"x-api-key: k1"}, `429 | x-ratelimit-limit: 1 | x-ratelimit-remaining: -1 | x-ratelimit-reset: 1700000061 | x-ratelimit-policy: degraded | ratelimit-policy: "api-1m";q=1;w=60 | retry-after: 60 | x-ratelimit-rule: api | body {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 1 request per 60 seconds exceeded","details":{"limit":1,"window_seconds":60,"retry_after_seconds":60,"reset_at":"2023-11-14T22:14:21Z","rule":"api"}}}`, -1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, tc.config)
			if tc.down {
				g.down = true
				for range 5 {
					g.tick(100)
				}
			}
			for i, st := range tc.steps {
				s := g.send("/v1/x", st.headers...)
				if !s.Decided {
					t.Fatalf("request %d not decided", i)
				}
				if got := answer(s); got != st.want {
					t.Errorf("request %d:\n got %s\nwant %s", i, got, st.want)
				}
				grpc := int32(-1)
				if s.Local != nil {
					grpc = s.Local.GRPCStatus
					ct := ""
					for _, kv := range s.Local.Headers {
						if kv[0] == "content-type" {
							ct = kv[1]
						}
					}
					if wantCT := map[bool]string{true: "", false: "application/json"}[st.grpc >= 0]; ct != wantCT {
						t.Errorf("request %d: local reply content-type %q, want %q (the proxy sets gRPC's)", i, ct, wantCT)
					}
				}
				if grpc != st.grpc {
					t.Errorf("request %d: grpc status %d, want %d", i, grpc, st.grpc)
				}
			}
		})
	}
}

// TestRolloutEnforcesItsShare: with rollout_percent 10 a limit of 1 refuses the second
// request of 10 % ± 2 % of 10,000 keys, and exactly of the keys rule.RolledOut names;
// the others carry the shadow header instead.
func TestRolloutEnforcesItsShare(t *testing.T) {
	g := newGateway(t, `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"canary","limit":1,"window":"1h","rollout_percent":10}]}`)
	r := &rule.Rule{ID: "canary", ShadowBP: 9000}
	const keys = 10000
	refused := 0
	for i := range keys {
		key := "k" + strconv.Itoa(i)
		g.send("/v1/x", "x-api-key: "+key)
		s := g.send("/v1/x", "x-api-key: "+key)
		enforced := s.Status() == 429
		if enforced {
			refused++
		} else if !strings.Contains(answer(s), "x-ratelimit-shadow: canary") {
			t.Fatalf("key %s: admitted without the shadow header: %s", key, answer(s))
		}
		if enforced != r.RolledOut(key) {
			t.Fatalf("key %s: refused %v, rule.RolledOut %v", key, enforced, r.RolledOut(key))
		}
	}
	if share := float64(refused) / keys * 100; share < 8 || share > 12 {
		t.Fatalf("enforced on %.2f %% of keys, want 10 ± 2", share)
	}
	t.Logf("enforced on %d of %d keys", refused, keys)
}
