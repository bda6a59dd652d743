package plugin_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/internal/shareddata"
)

// quietHost is a plugin.Host that allocates nothing per request itself, so that
// testing.AllocsPerRun counts only the plugin's allocations: shared data through one
// reused buffer (as the wasm binding does), response headers kept in a reused slice.
type quietHost struct {
	shared  *shareddata.Store
	val     []byte
	request [][2]string
	added   [][2]string
	status  uint32 // of the last local reply
	metrics []int64
	now     int64
	state   []byte // the last property set (the decision metadata)
	// response is the upstream's response headers; chunk the body chunk being delivered.
	response [][2]string
	chunk    []byte
}

var errQuiet = errors.New("quiet host: not available")

func (h *quietHost) RequestHeaders() ([][2]string, error) { return h.request, nil }
func (h *quietHost) AddResponseHeaders(pairs [][2]string) error {
	h.added = append(h.added, pairs...)
	return nil
}
func (h *quietHost) SendLocalReply(status uint32, _ string, _ []byte, headers [][2]string, _ int32) error {
	h.status = status
	h.added = append(h.added, headers...)
	return nil
}
func (h *quietHost) SharedGet(key string) ([]byte, uint32, bool, error) {
	var cas uint32
	var ok bool
	h.val, cas, ok = h.shared.AppendGet(h.val[:0], key)
	return h.val, cas, ok, nil
}
func (h *quietHost) SharedSet(key string, value []byte, cas uint32) (bool, error) {
	return h.shared.Set(key, value, cas), nil
}
func (h *quietHost) Property(...string) ([]byte, error) { return nil, errQuiet }
func (h *quietHost) SetTickPeriod(uint32) error         { return nil }
func (h *quietHost) SetProperty(_ string, v []byte) error {
	h.state = append(h.state[:0], v...)
	return nil
}
func (h *quietHost) AppendProperty(dst []byte, path ...string) ([]byte, error) {
	if len(path) > 0 && path[len(path)-1] == "sub" {
		return append(dst, "user-1"...), nil
	}
	return dst, errQuiet
}
func (h *quietHost) HTTPCall(string, [][2]string, []byte, uint32) (uint32, error) {
	return 0, errQuiet
}
func (h *quietHost) ResponseHeader(name string) (string, bool) {
	for _, kv := range h.response {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}
func (h *quietHost) ResponseBody(start, max int) ([]byte, error) {
	return h.chunk[start:min(len(h.chunk), start+max)], nil
}
func (h *quietHost) ResumeRequest() error             { return nil }
func (h *quietHost) SetEffectiveContext(uint32) error { return nil }
func (h *quietHost) RootID() uint32                   { return 1 }
func (h *quietHost) Log(plugin.LogLevel, string)      {}
func (h *quietHost) DefineMetric(plugin.MetricKind, string) (uint32, error) {
	h.metrics = append(h.metrics, 0)
	return uint32(len(h.metrics) - 1), nil
}
func (h *quietHost) IncrementMetric(id uint32, delta int64) { h.metrics[id] += delta }
func (h *quietHost) RecordMetric(id uint32, value uint64)   { h.metrics[id] = int64(value) }
func (h *quietHost) NowUs() int64                           { return h.now }
func (h *quietHost) Seed() uint64                           { return 1 }

// TestRequestAllocations: an admitted request allocates nothing in steady state, for one
// rule and for three (the plugin's share of the guest heap allocations the compiled
// module's test counts; a heap allocation per request is garbage the module's collector
// must then sweep on every worker).
func TestRequestAllocations(t *testing.T) {
	const limits = `"limit":1000000` // never reached: every request is admitted
	for _, tc := range []struct {
		name, config string
		headers      int // rate-limit headers every answer carries
	}{
		{"one rule", `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api",` + limits + `,"window":"1s"}]}`, 5},
		{"three rules", `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api",` + limits + `,"window":"1s"},
			{"id":"search","match":{"prefix":"/v1/search","methods":["GET"]},"algorithm":"gcra",` + limits + `,"window":"1s","burst":1000000},
			{"id":"tenant","key":{"source":"header","name":"x-tenant"},"algorithm":"sliding_window_counter",` + limits + `,"window":"10s"}]}`, 5},
		{"default key", `{"rules":[{"id":"api",` + limits + `,"window":"1s"}]}`, 5},
		{"metadata key", `{"rules":[{"id":"api","key":{"source":"composite","parts":[{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.sub"},
			{"source":"header","name":"x-tenant"}]},` + limits + `,"window":"1s"}]}`, 5},
		{"match conditions and query key", `{"rules":[{"id":"api","key":{"source":"query","name":"q"},"match":{"hosts":["api.example.com"],"prefix":"/v1",
			"headers":[{"name":"x-tenant","exact":"acme"},{"name":"user-agent","regex":"^tollgate"}],"query":[{"name":"q"}],"not":{"methods":["DELETE"]}},` + limits + `,"window":"1s"}]}`, 5},
		// The levers cost nothing per request: a rollout (this key is in the enforced 90 %),
		// a degraded limit, and a shadowed rule (the key outside a 1 % rollout).
		{"levers", `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api",` + limits + `,"window":"1s","rollout_percent":90,"degraded_limit":10},
			{"id":"canary",` + limits + `,"window":"1s","rollout_percent":1}]}`, 5},
		// Response-based cost: the charge from a response header, and from a JSON body
		// (streamed in one chunk) and a server-sent event stream.
		{"cost from header", `{"rules":[{"id":"api",` + limits + `,"window":"1s","cost_from":{"header":"x-tokens-used"}}]}`, 5},
		{"cost from json body", `{"rules":[{"id":"api",` + limits + `,"window":"1s","cost_from":{"body":"usage.total_tokens"}}]}`, 5},
		{"cost from event stream", `{"rules":[{"id":"api",` + limits + `,"window":"1s","cost_from":{"body":"usage.total_tokens"}}]}`, 5},
		// A slot taken and given back per request (a rule with only max_in_flight adds no
		// headers to an admitted request).
		{"max_in_flight", `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"llm","max_in_flight":20},
			{"id":"api",` + limits + `,"window":"1s","max_in_flight":1000}]}`, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &quietHost{shared: shareddata.New(), now: t0, request: [][2]string{
				{":method", "GET"}, {":path", "/v1/search?q=tollgate"}, {":authority", "api.example.com"},
				{"user-agent", "tollgate-test/1"}, {"x-api-key", "k-alloc"}, {"x-tenant", "acme"},
			}}
			var body []byte
			switch tc.name {
			case "cost from header":
				h.response = [][2]string{{"x-tokens-used", "2"}}
			case "cost from json body":
				h.response = [][2]string{{"content-type", "application/json"}}
				body = []byte(`{"id":"c","usage":{"prompt_tokens":1,"total_tokens":2}}`)
			case "cost from event stream":
				h.response = [][2]string{{"content-type", "text/event-stream"}}
				body = []byte("data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_tokens\":2}}\n\ndata: [DONE]\n\n")
			}
			p := plugin.New(h)
			if !p.OnPluginStart([]byte(tc.config)) {
				t.Fatal("configuration refused")
			}
			id := uint32(2)
			request := func() {
				id += 2
				h.now += 10
				h.added = h.added[:0]
				s := p.NewStream(id)
				s.OnRequestHeaders(len(h.request), true)
				s.OnResponseHeaders(len(h.response), len(body) == 0)
				if len(body) > 0 {
					h.chunk = body
					s.OnResponseBody(len(body), true)
				}
				s.OnLog()
				s.OnDone()
			}
			for range 1000 {
				request()
			}
			if !strings.HasPrefix(string(h.state), "rule=") {
				t.Fatalf("decision metadata %q, want one set per request", h.state)
			}
			if len(h.added) != tc.headers || h.status != 0 {
				t.Fatalf("answer (local reply %d) carries %d headers, want %d: %v", h.status, len(h.added), tc.headers, h.added)
			}
			if allocs := testing.AllocsPerRun(1000, request); allocs != 0 {
				t.Errorf("%.1f allocations per request, want 0", allocs)
			}
		})
	}
}

// BenchmarkRequest is the plugin's own cost of one admitted single-rule request,
// natively (the compiled module's cost is measured by bench/perf).
func BenchmarkRequest(b *testing.B) {
	h := &quietHost{shared: shareddata.New(), now: t0, request: [][2]string{
		{":method", "GET"}, {":path", "/v1/search?q=tollgate"}, {":authority", "api.example.com"},
		{"user-agent", "tollgate-bench/1"}, {"accept", "application/json"}, {"x-api-key", "k-bench"},
		{"x-forwarded-proto", "http"}, {"x-request-id", "7d1b5c1e-3a4f-4c1e-9b7a-2f6c1d0e8a11"},
	}}
	p := plugin.New(h)
	if !p.OnPluginStart([]byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":1000000,"window":"1s"}]}`)) {
		b.Fatal("configuration refused")
	}
	id := uint32(2)
	b.ReportAllocs()
	for b.Loop() {
		id += 2
		h.now += 10
		h.added = h.added[:0]
		s := p.NewStream(id)
		s.OnRequestHeaders(len(h.request), true)
		s.OnResponseHeaders(0, true)
		s.OnDone()
	}
}
