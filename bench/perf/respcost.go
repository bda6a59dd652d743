package perf

import (
	"github.com/tollgate-rl/tollgate/internal/llmapi"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// Response-based cost (cost_from): what it adds to a request whose rule does not use it,
// and what following a response for its cost takes, from interleaved rounds of the
// compiled module on BenchRequest with a response of about 2 KB of generated text.

// BeforeResponseCost is the revision before the filter followed response bodies: its
// module, built the shipping way, shows what a rule set without cost_from pays now.
const BeforeResponseCost = "88190c4"

const benchRule = `{"id":"api","match":{"prefix":"/v1/search"},"limit":1000000,"window":"1s","cost":1`

// otherRule is a second rule BenchRequest does not match (its path is elsewhere); with
// cost_from appended it is the rule set's one cost_from rule.
const otherRule = `{"id":"llm","match":{"prefix":"/v1/chat"},"limit":1000000,"window":"1m","cost":1`

// RespCostNoneConfig has no rule with cost_from: BenchRequest's rule and otherRule.
var RespCostNoneConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[` + benchRule + `},` + otherRule + `}]}`)

// RespCostOtherConfig is RespCostNoneConfig with otherRule taking its cost from the
// response: the two differ by cost_from alone.
var RespCostOtherConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[` + benchRule + `},` + otherRule +
	`,"cost_from":{"body":"usage.total_tokens"}}]}`)

// RespCostConfig is RespCostNoneConfig with BenchRequest's rule taking its cost from the
// response (a header, or the body's usage.total_tokens).
func RespCostConfig(format string) []byte {
	from := `{"body":"usage.total_tokens"}`
	if format == "header" {
		from = `{"header":"` + llmapi.TokensHeader + `"}`
	}
	return []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[` + benchRule + `,"cost_from":` + from + `},` + otherRule + `}]}`)
}

// LLMUpstream is a completion reporting 5 tokens in format, with 2,000 bytes of text
// (the event stream: 32 events).
func LLMUpstream(format string) *wazerohost.Response {
	h, body := llmapi.Response(format, 5, 2000)
	r := &wazerohost.Response{Status: 200, Body: body}
	for _, kv := range h {
		r.Header = append(r.Header, wazerohost.Pair{kv[0], kv[1]})
	}
	return r
}

// RespCost is the decision cost of one request (and its response) in each case.
type RespCost struct {
	// Before is the module of BeforeResponseCost, None the current one, both without a
	// cost_from rule; Other has one that this request does not match. All three get the
	// JSON response.
	Before, None, Other Cost
	// Plain[f] is the current module without cost_from on the response of format f;
	// Charged[f] with the request's rule taking its cost from it.
	Plain, Charged map[string]Cost
}

// OtherRatio is a request's cost when another rule uses cost_from over none does.
func (r RespCost) OtherRatio() float64 { return ratio(r.Other.NsPerRequest, r.None.NsPerRequest) }

// NoneRatio is the current module's cost without cost_from over the module before it.
func (r RespCost) NoneRatio() float64 { return ratio(r.None.NsPerRequest, r.Before.NsPerRequest) }

// ParseNs is what following a response of format f for its cost adds, in ns.
func (r RespCost) ParseNs(f string) float64 {
	return r.Charged[f].NsPerRequest - r.Plain[f].NsPerRequest
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// MeasureRespCost measures filter and before (the module of BeforeResponseCost; nil
// leaves Before empty) side by side.
func MeasureRespCost(filter, before []byte, o CostOptions) (RespCost, error) {
	req := BenchRequest("k-bench")
	mods := []CostModule{
		{Name: "filter, no cost_from rule", Wasm: filter, Config: RespCostNoneConfig, Request: req, Upstream: LLMUpstream("json")},
		{Name: "filter, a cost_from rule the request does not match", Wasm: filter, Config: RespCostOtherConfig, Request: req, Upstream: LLMUpstream("json")},
	}
	for _, f := range llmapi.Formats {
		mods = append(mods,
			CostModule{Name: "filter, no cost_from, " + f + " response", Wasm: filter, Config: RespCostNoneConfig, Request: req, Upstream: LLMUpstream(f)},
			CostModule{Name: "filter, cost_from " + f, Wasm: filter, Config: RespCostConfig(f), Request: req, Upstream: LLMUpstream(f)})
	}
	if before != nil {
		mods = append(mods, CostModule{Name: "filter at " + BeforeResponseCost + ", no cost_from rule", Wasm: before, Config: RespCostNoneConfig, Request: req, Upstream: LLMUpstream("json")})
	}
	costs, err := MeasureCosts(mods, o)
	if err != nil {
		return RespCost{}, err
	}
	r := RespCost{None: costs[0], Other: costs[1], Plain: map[string]Cost{}, Charged: map[string]Cost{}}
	for i, f := range llmapi.Formats {
		r.Plain[f], r.Charged[f] = costs[2+2*i], costs[3+2*i]
	}
	if before != nil {
		r.Before = costs[len(costs)-1]
	}
	return r, nil
}
