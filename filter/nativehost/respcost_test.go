package nativehost_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// llm answers like an LLM API whose responses used tokens: the count in a header, in a
// JSON body's usage object, or in the last event of a server-sent event stream; the body
// arrives in chunks of chunk bytes.
func llm(format string, tokens int64, chunk int) nativehost.Upstream {
	var u nativehost.Upstream
	var body string
	switch format {
	case "header":
		u.Headers = [][2]string{{"content-type", "application/json"}, {"x-tokens-used", strconv.FormatInt(tokens, 10)}}
		body = `{"choices":[{"text":"hello"}]}`
	case "json":
		u.Headers = [][2]string{{"content-type", "application/json"}}
		body = fmt.Sprintf(`{"id":"c1","choices":[{"message":{"content":%q}}],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}`,
			strings.Repeat("lorem ", 50), tokens-3, tokens)
	case "sse":
		u.Headers = [][2]string{{"content-type", "text/event-stream; charset=utf-8"}}
		body = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n" +
			fmt.Sprintf("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":%d}}\n\n", tokens) +
			"data: [DONE]\n\n"
	}
	for len(body) > 0 {
		n := min(chunk, len(body))
		u.Body = append(u.Body, []byte(body[:n]))
		body = body[n:]
	}
	return u
}

const tokenRule = `"id":"llm","match":{"prefix":"/v1/chat"},"limit":10000,"window":"1m","cost":1`

func costFrom(format string) string {
	if format == "header" {
		return `"cost_from":{"header":"x-tokens-used"}`
	}
	return `"cost_from":{"body":"usage.total_tokens"}`
}

// A key with 10,000 tokens a minute, on one gateway deciding alone: requests are
// admitted while the bucket covers their estimate (1 token) and each is charged what its
// response used, so the key is refused once its responses used 10,000 tokens — at most
// one response's worth later — with a Retry-After that waits out the debt.
func TestResponseCostLocal(t *testing.T) {
	for _, format := range []string{"header", "json", "sse"} {
		t.Run(format, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 7))
			var next int64
			now := int64(1_700_000_000_000_000)
			h, err := nativehost.New(nativehost.Config{
				Workers: 2, Clock: func() int64 { return now },
				PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[{` + tokenRule + `,` + costFrom(format) + `}]}`),
				Upstream: func([][2]string) nativehost.Upstream {
					return llm(format, next, 1+rng.IntN(40))
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			var used int64
			for i := 0; ; i++ {
				if i > 1000 {
					t.Fatal("never refused")
				}
				next = 300 + rng.Int64N(600)
				s := h.Request(i%2, [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
				if s.Admitted() {
					used += next
					continue
				}
				if s.Status() != 429 {
					t.Fatalf("request %d: status %d", i, s.Status())
				}
				if used < 10000 || used > 10000+900 {
					t.Fatalf("refused after %d tokens used, want 10000..10900 (the limit, plus at most one response)", used)
				}
				// The debt (used - 10000 + the estimate) refills at 10,000 a minute.
				retry, _ := strconv.ParseInt(s.Header("retry-after"), 10, 64)
				if want := (used - 10000 + 1) * 6 / 1000; retry < want {
					t.Errorf("retry-after %ds, want at least %ds for a debt of %d tokens", retry, want, used-10000)
				}
				if s.Header("x-ratelimit-remaining") != "0" || s.Header("x-ratelimit-limit") != "10000" {
					t.Errorf("refusal headers: remaining %q limit %q", s.Header("x-ratelimit-remaining"), s.Header("x-ratelimit-limit"))
				}
				t.Logf("refused after %d requests, %d tokens", i, used)
				break
			}
			if n := h.Metric("tollgate.response_cost_missing"); n != 0 {
				t.Errorf("%d responses' cost not found", n)
			}
			if got, want := h.Metric("tollgate.response_cost_charged"), used-h.Metric("tollgate.requests_allowed"); got != want {
				t.Errorf("charged %d beyond the estimates, want %d", got, want)
			}
		})
	}
}

// A response without its cost (no header, a body without usage, a malformed value, a
// body too large to find it in, a stream reset before it came) is charged the estimate
// and counted.
func TestResponseCostMissing(t *testing.T) {
	big := nativehost.Upstream{Headers: [][2]string{{"content-type", "application/json"}}}
	for range 20 {
		big.Body = append(big.Body, []byte(strings.Repeat("x", 4096)))
	}
	tests := []struct {
		name, from string
		up         nativehost.Upstream
	}{
		{"no header", `{"header":"x-tokens-used"}`, nativehost.Upstream{}},
		{"malformed header", `{"header":"x-tokens-used"}`, nativehost.Upstream{Headers: [][2]string{{"x-tokens-used", "12 tokens"}}}},
		{"no usage", `{"body":"usage.total_tokens"}`, nativehost.Upstream{Body: [][]byte{[]byte(`{"id":"x"}`)}}},
		{"string usage", `{"body":"usage.total_tokens"}`, nativehost.Upstream{Body: [][]byte{[]byte(`{"usage":{"total_tokens":"9"}}`)}}},
		{"too large", `{"body":"usage.total_tokens","max_body_bytes":1024}`, big},
		{"reset", `{"body":"usage.total_tokens"}`, nativehost.Upstream{Headers: [][2]string{{"content-type", "text/event-stream"}},
			Body: [][]byte{[]byte("data: {\"usage\":null}\n\n")}, Reset: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := int64(1_700_000_000_000_000)
			h, err := nativehost.New(nativehost.Config{
				Clock:        func() int64 { return now },
				PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"llm","limit":10,"window":"1m","cost":3,"cost_from":` + tt.from + `}]}`),
				Upstream:     func([][2]string) nativehost.Upstream { return tt.up },
			})
			if err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for range 5 {
				if h.Request(0, [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "k"}}, nil).Admitted() {
					admitted++
				}
			}
			if admitted != 3 {
				t.Errorf("%d admitted, want 3 (each charged its estimate of 3 out of 10)", admitted)
			}
			if n := h.Metric("tollgate.response_cost_missing"); n != 3 {
				t.Errorf("response_cost_missing %d, want 3", n)
			}
		})
	}
}

// Four gateways syncing one key's 10,000 tokens a minute: a charge beyond a gateway's
// lease is reported at the next sync as consumption beyond it, which the service charges
// in full, and the gateway refuses on its own count until then. So the fleet stops
// within the limit, its refill, and per gateway the responses that ended before the
// service heard of them (RATIONALE.md: "Response-based cost").
func TestResponseCostFleet(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var next int64
	f := &fleet{t: t, now: 1_700_000_000_000_000, svc: memservice.New(lease.SyncConfig{})}
	f.svc.NoPenalty = true
	cfg := []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100,"stale_ms":500},"rules":[{` + tokenRule + `,"cost_from":{"body":"usage.total_tokens"}}]}`)
	for g := 0; g < 4; g++ {
		h, err := nativehost.New(nativehost.Config{
			Workers: 2, PluginConfig: cfg, Clock: func() int64 { return f.now },
			Properties: map[string]string{"node.id": "gw-" + strconv.Itoa(g)},
			Upstream:   func([][2]string) nativehost.Upstream { return llm("sse", next, 64) },
		})
		if err != nil {
			t.Fatal(err)
		}
		f.gws = append(f.gws, h)
	}
	f.tick(100)
	var used, admitted int64
	refusedInARow := 0
	for i := 0; refusedInARow < 40; i++ {
		if i > 5000 {
			t.Fatal("the fleet never stopped admitting")
		}
		next = 300 + rng.Int64N(600)
		s := f.gws[i%4].Request((i/4)%2, [][2]string{{":method", "POST"}, {":path", "/v1/chat"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
		f.deliver()
		if s.Admitted() {
			used += next
			admitted++
			refusedInARow = 0
		} else {
			refusedInARow++
		}
		f.tick(20) // the fleet ends a response every 20 ms: each gateway one per 80 ms
	}
	elapsedMs := (f.now - 1_700_000_000_000_000) / 1000
	// The limit, its refill over the run, and per gateway what its responses reported
	// before the service heard of it: those ending within a sync interval (100 ms: at
	// most 2 here) plus the one it admitted last.
	bound := 10000 + 10000*elapsedMs/60000 + 4*(2+1)*900
	t.Logf("%d requests admitted, %d tokens used over %d ms (bound %d)", admitted, used, elapsedMs, bound)
	if used > bound {
		t.Errorf("the fleet let %d tokens be used, more than the bound %d", used, bound)
	}
	if used < 10000 {
		t.Errorf("the fleet stopped after %d tokens, before the limit", used)
	}
	for range 20 {
		f.tick(100)
	}
	b := f.svc.Bucket("k", "llm", "", 0, f.now)
	if b == nil {
		t.Fatal("no bucket at the service")
	}
}
