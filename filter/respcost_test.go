//go:build !wasip1

package main

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/llmapi"
	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// llmUpstream answers like an LLM API: each response reports the tokens the request
// asks for in x-test-tokens, in format, with contentBytes of text.
func llmUpstream(format string, contentBytes int) wasmhost.Upstream {
	return func(_ context.Context, req *wasmhost.Request) (*wasmhost.Response, error) {
		tokens, _ := strconv.ParseInt(req.Get("x-test-tokens"), 10, 64)
		h, body := llmapi.Response(format, tokens, contentBytes)
		resp := &wasmhost.Response{Status: 200, Body: body}
		for _, kv := range h {
			resp.Header = append(resp.Header, wasmhost.Pair{kv[0], kv[1]})
		}
		return resp, nil
	}
}

func llmRequest(key string, tokens int64) *wasmhost.Request {
	r := keyRequest("/v1/chat/completions", key)
	r.Method = "POST"
	r.Header = append(r.Header, wasmhost.Pair{"x-test-tokens", strconv.FormatInt(tokens, 10)})
	return r
}

// The compiled filter charges what responses report: a key with 10,000 tokens a minute
// is admitted while its bucket covers the estimate and refused once its responses used
// 10,000 tokens (at most one response's worth more), with the refusal's headers, for a
// header, a JSON body and an event stream (bodies in 16 KiB chunks, the SSE usage event
// split across them).
func TestResponseCost(t *testing.T) {
	for _, format := range llmapi.Formats {
		t.Run(format, func(t *testing.T) {
			from := `{"body":"usage.total_tokens"}`
			if format == "header" {
				from = `{"header":"` + llmapi.TokensHeader + `"}`
			}
			h := newGateway(t, wasmhost.Config{Workers: 2, Upstream: llmUpstream(format, 40_000),
				PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[{"id":"llm",
					"match":{"prefix":"/v1/chat"},"limit":10000,"window":"1m","cost":10,"cost_from":` + from + `}]}`)})
			rng := rand.New(rand.NewPCG(5, 6))
			var used int64
			for i := 0; ; i++ {
				if i > 200 {
					t.Fatal("never refused")
				}
				tokens := 300 + rng.Int64N(600)
				r := h.Handle(llmRequest("k", tokens))
				if r.Status == 200 {
					used += tokens
					continue
				}
				if r.Status != 429 {
					t.Fatalf("request %d: status %d", i, r.Status)
				}
				if used < 10000 || used > 10000+900 {
					t.Fatalf("refused after %d tokens used, want 10000..10900", used)
				}
				if r.Get("x-ratelimit-limit") != "10000" || r.Get("x-ratelimit-remaining") != "0" || r.Get("retry-after") == "" {
					t.Errorf("refusal headers: %v", r.Header)
				}
				t.Logf("refused after %d requests, %d tokens", i, used)
				break
			}
			m := h.Metrics()
			if m["tollgate.response_cost_missing"] != 0 {
				t.Errorf("%d responses' cost not found", m["tollgate.response_cost_missing"])
			}
			if want := used - 10*m["tollgate.requests_allowed"]; m["tollgate.response_cost_charged"] != want {
				t.Errorf("charged %d beyond the estimates, want %d", m["tollgate.response_cost_charged"], want)
			}
		})
	}
}

// A 10 MB response is not buffered: the filter reads it chunk by chunk and keeps at most
// max_body_bytes of it, so the module's memory does not grow with the body, and the
// usage at its end is still found (JSON: in the body's tail; event stream: its last
// event).
func TestResponseCostLargeBody(t *testing.T) {
	for _, format := range []string{"json", "sse"} {
		t.Run(format, func(t *testing.T) {
			h := newGateway(t, wasmhost.Config{Workers: 1, Upstream: llmUpstream(format, 10<<20),
				PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"llm",
					"limit":1000000,"window":"1m","cost":1,"cost_from":{"body":"usage.total_tokens"}}]}`)})
			// One large response first: the body buffers reach their size.
			if r := h.Handle(llmRequest("k", 5)); r.Status != 200 || len(r.Body) < 10<<20 {
				t.Fatalf("status %d, %d bytes", r.Status, len(r.Body))
			}
			before := memorySizes(h)[0]
			const n = 2
			for i := 0; i < n; i++ {
				if r := h.Handle(llmRequest("k", 1001)); r.Status != 200 {
					t.Fatalf("status %d", r.Status)
				}
			}
			after := memorySizes(h)[0]
			t.Logf("module memory %d KiB before %d responses of 10 MiB, %d KiB after", before>>10, n, after>>10)
			if after >= 10<<20 || after-before > 1<<20 {
				t.Errorf("module memory %d KiB, grown by %d KiB over %d responses of 10 MiB: the body is being held", after>>10, (after-before)>>10, n)
			}
			m := h.Metrics()
			if m["tollgate.response_cost_missing"] != 0 || m["tollgate.response_cost_charged"] != 4+n*1000 {
				t.Errorf("charged %d, missing %d; want %d charged beyond the estimates, none missing",
					m["tollgate.response_cost_charged"], m["tollgate.response_cost_missing"], 4+n*1000)
			}
		})
	}
}
