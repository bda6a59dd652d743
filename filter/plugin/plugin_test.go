package plugin_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

// t0 is the virtual clock's start: a whole second, so reset times are easy to read.
const t0 = 1_700_000_000_000_000

// gateway is one worker of the filter on nativehost with a clock the test moves.
type gateway struct {
	t   *testing.T
	now int64
	h   *nativehost.Host
	// down fails every callout (the sync service is unreachable).
	down bool
}

func newGateway(t *testing.T, config string) *gateway {
	t.Helper()
	g := &gateway{t: t, now: t0}
	h, err := nativehost.New(nativehost.Config{PluginConfig: []byte(config), Clock: func() int64 { return g.now }, Seed: 1})
	if err != nil {
		t.Fatalf("starting the plugin: %v", err)
	}
	g.h = h
	return g
}

// send runs one request with the given extra headers ("name: value").
func (g *gateway) send(path string, headers ...string) *nativehost.Stream {
	req := [][2]string{{":method", "GET"}, {":path", path}, {":authority", "api.example.com"}}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ": ")
		req = append(req, [2]string{name, value})
	}
	s := g.h.Request(0, req, map[string]string{"source.address": "10.1.2.3:50000"})
	g.settle()
	return s
}

// settle fails every waiting callout while the service is down, repeatedly (a failed
// callout can cause another).
func (g *gateway) settle() {
	for g.down {
		cs := g.h.TakeCallouts()
		if len(cs) == 0 {
			return
		}
		for _, c := range cs {
			g.h.Fail(c, false)
		}
	}
}

// tick advances the clock by ms and fires the worker's tick.
func (g *gateway) tick(ms int64) {
	g.now += ms * 1000
	g.h.Tick(0)
	g.settle()
}

// answer is what a client sees: the status and the rate-limit headers, in order.
func answer(s *nativehost.Stream) string {
	h := s.Response
	if s.Local != nil {
		h = s.Local.Headers
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(int(s.Status())))
	for _, kv := range h {
		if kv[0] == "content-type" {
			continue
		}
		b.WriteString(" | " + kv[0] + ": " + kv[1])
	}
	if s.Local != nil {
		b.WriteString(" | body " + string(s.Local.Body))
	}
	return b.String()
}

const (
	cfgOne = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"api","limit":3,"window":"1m"}]}`
	cfgThree = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"api","limit":100,"window":"1m"},
		         {"id":"search","match":{"prefix":"/v1/search"},"algorithm":"gcra","limit":10,"window":"1s","burst":2},
		         {"id":"tenant","key":{"source":"header","name":"x-tenant"},"algorithm":"fixed_window","limit":5,"window":"1h"}]}`
	cfgLists = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"allow":["sk_internal_*"],"deny":["sk_revoked_*","192.0.2.0/24"],
		"rules":[{"id":"api","limit":3,"window":"1m"}]}`
	cfgShadow = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"api","limit":100,"window":"1m"},{"id":"dry","shadow":true,"limit":1,"window":"1m"}]}`
	cfgSync = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100,"breaker_failures":1},
		"rules":[{"id":"api","limit":3,"window":"1m"},{"id":"closed","match":{"prefix":"/pay"},"fail":"closed","limit":3,"window":"1m"}]}`
)

// TestAnswers pins the decision and every header of each answer for a sequence of
// requests: admitted requests carry the limit, what is left and when it resets; a 429
// names the rule and says when to retry; multi-rule requests report the most
// restrictive window and list every window in the policy.
func TestAnswers(t *testing.T) {
	type step struct {
		advanceMs int64
		path      string
		headers   []string
		want      string
	}
	for _, tc := range []struct {
		name   string
		config string
		steps  []step
	}{
		{"one rule", cfgOne, []step{
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 2 | x-ratelimit-reset: 1700000020 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=2;t=20`},
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 1 | x-ratelimit-reset: 1700000040 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=1;t=40`},
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000060 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=60`},
			{0, "/v1/x", []string{"x-api-key: k1"}, `429 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000060 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=20 | retry-after: 20 | x-ratelimit-rule: api | body {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 3 requests per 60 seconds exceeded","details":{"limit":3,"window_seconds":60,"retry_after_seconds":20,"reset_at":"2023-11-14T22:14:20Z","rule":"api"}}}`},
			{30_000, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000080 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=0;t=50`},
			{0, "/v1/x", []string{"x-api-key: k2"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 2 | x-ratelimit-reset: 1700000050 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=2;t=20`},
			{0, "/v1/x", nil, `200`}, // no key: no rule applies, and no headers are added
		}},
		{"three rules", cfgThree, []step{
			{0, "/v1/search?q=a", []string{"x-api-key: k1", "x-tenant: acme"}, `200 | x-ratelimit-limit: 10 | x-ratelimit-remaining: 1 | x-ratelimit-reset: 1700000001 | ratelimit-policy: "api-1m";q=100;w=60, "search-1s";q=10;w=1, "tenant-1h";q=5;w=3600 | ratelimit: "search-1s";r=1;t=1`},
			{0, "/v1/search?q=a", []string{"x-api-key: k1", "x-tenant: acme"}, `200 | x-ratelimit-limit: 10 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000001 | ratelimit-policy: "api-1m";q=100;w=60, "search-1s";q=10;w=1, "tenant-1h";q=5;w=3600 | ratelimit: "search-1s";r=0;t=1`},
			{0, "/v1/search?q=a", []string{"x-api-key: k1", "x-tenant: acme"}, `429 | x-ratelimit-limit: 10 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700000001 | ratelimit-policy: "api-1m";q=100;w=60, "search-1s";q=10;w=1, "tenant-1h";q=5;w=3600 | ratelimit: "search-1s";r=0;t=1 | retry-after: 1 | x-ratelimit-rule: search | body {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 10 requests per second exceeded","details":{"limit":10,"window_seconds":1,"retry_after_seconds":1,"reset_at":"2023-11-14T22:13:21Z","rule":"search"}}}`},
			{0, "/v1/other", []string{"x-api-key: k1", "x-tenant: acme"}, `200 | x-ratelimit-limit: 5 | x-ratelimit-remaining: 2 | x-ratelimit-reset: 1700002800 | ratelimit-policy: "api-1m";q=100;w=60, "tenant-1h";q=5;w=3600 | ratelimit: "tenant-1h";r=2;t=2800`},
			{0, "/v1/other", []string{"x-api-key: k1", "x-tenant: acme"}, `200 | x-ratelimit-limit: 5 | x-ratelimit-remaining: 1 | x-ratelimit-reset: 1700002800 | ratelimit-policy: "api-1m";q=100;w=60, "tenant-1h";q=5;w=3600 | ratelimit: "tenant-1h";r=1;t=2800`},
			{0, "/v1/other", []string{"x-api-key: k1", "x-tenant: acme"}, `200 | x-ratelimit-limit: 5 | x-ratelimit-remaining: 0 | x-ratelimit-reset: 1700002800 | ratelimit-policy: "api-1m";q=100;w=60, "tenant-1h";q=5;w=3600 | ratelimit: "tenant-1h";r=0;t=2800`},
			{0, "/v1/other", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 100 | x-ratelimit-remaining: 94 | x-ratelimit-reset: 1700000004 | ratelimit-policy: "api-1m";q=100;w=60 | ratelimit: "api-1m";r=94;t=4`},
		}},
		{"lists", cfgLists, []step{
			{0, "/v1/x", []string{"x-api-key: sk_internal_1"}, `200 | x-ratelimit-policy: bypass`},
			{0, "/v1/x", []string{"x-api-key: sk_revoked_1"}, `403 | body {"error":{"code":"FORBIDDEN","message":"API key is not allowed","details":{"matched":"sk_revoked_*"}}}`},
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 2 | x-ratelimit-reset: 1700000020 | ratelimit-policy: "api-1m";q=3;w=60 | ratelimit: "api-1m";r=2;t=20`},
		}},
		{"service down", cfgSync, []step{
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: -1 | x-ratelimit-reset: 1700000021 | x-ratelimit-policy: degraded | ratelimit-policy: "api-1m";q=3;w=60`},
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: -1 | x-ratelimit-reset: 1700000041 | x-ratelimit-policy: degraded | ratelimit-policy: "api-1m";q=3;w=60`},
			{0, "/pay", []string{"x-api-key: k1"}, `503 | x-ratelimit-limit: 3 | x-ratelimit-remaining: -1 | x-ratelimit-reset: 1700000061 | x-ratelimit-policy: degraded | ratelimit-policy: "api-1m";q=3;w=60, "closed-1m";q=3;w=60 | retry-after: 1 | x-ratelimit-rule: closed | body {"error":{"code":"RATE_LIMITER_UNAVAILABLE","message":"Rate limiter is temporarily unavailable","details":{"retry_after_seconds":1,"rule":"closed"}}}`},
		}},
		{"shadow", cfgShadow, []step{
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 100 | x-ratelimit-remaining: 99 | x-ratelimit-reset: 1700000001 | ratelimit-policy: "api-1m";q=100;w=60 | ratelimit: "api-1m";r=99;t=1`},
			{0, "/v1/x", []string{"x-api-key: k1"}, `200 | x-ratelimit-limit: 100 | x-ratelimit-remaining: 98 | x-ratelimit-reset: 1700000002 | ratelimit-policy: "api-1m";q=100;w=60 | ratelimit: "api-1m";r=98;t=2 | x-ratelimit-shadow: dry`},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, tc.config)
			if strings.Contains(tc.config, `"sync"`) {
				g.down = true
				for range 5 {
					g.tick(100)
				}
			}
			for i, st := range tc.steps {
				g.now += st.advanceMs * 1000
				s := g.send(st.path, st.headers...)
				if !s.Decided {
					t.Fatalf("request %d not decided", i)
				}
				if got := answer(s); got != st.want {
					t.Errorf("request %d:\n got %s\nwant %s", i, got, st.want)
				}
			}
		})
	}
}
