package perf

import (
	"fmt"
	"sort"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/host"
)

// LocalRuleConfig is the plugin configuration of the decision-cost benchmark: one
// token-bucket rule keyed by x-api-key, decided locally (no sync section), with a limit
// the benchmark never reaches, so every request takes the admit path.
var LocalRuleConfig = []byte(`{"rules":[{"id":"api","limit":1000000,"window":"1s"}]}`)

// BenchRequest is the request every decision-cost measurement sends: what a client
// behind an edge proxy sends, with the headers Envoy's connection manager would have
// added already present (so the host does not generate a request id per request).
func BenchRequest(key string) *host.Request {
	return &host.Request{
		Method:    "GET",
		Path:      "/v1/search?q=tollgate",
		Authority: "api.example.com",
		Header: []host.Pair{
			{"user-agent", "tollgate-bench/1"},
			{"accept", "application/json"},
			{"x-api-key", key},
			{"x-forwarded-proto", "http"},
			{"x-request-id", "7d1b5c1e-3a4f-4c1e-9b7a-2f6c1d0e8a11"},
		},
		RemoteAddr: "10.1.2.3:50123",
		LocalAddr:  "10.0.0.1:8080",
	}
}

// UpstreamOK is the upstream answer every Exchange gets.
var UpstreamOK = &host.Response{Status: 200, Header: []host.Pair{{"content-type", "application/json"}, {"content-length", "2"}}, Body: nil}

// Cost is the decision cost of one module.
type Cost struct {
	Module   string
	Requests int64 // requests in the timed rounds
	// NsPerRequest is the median over rounds of the wall time of one Exchange:
	// proxy_on_context_create, proxy_on_request_headers, proxy_on_response_headers,
	// proxy_on_log, proxy_on_done, proxy_on_delete.
	NsPerRequest float64
	// RoundsNs is every round's ns per request (the spread shows the noise).
	RoundsNs []float64
	// HostCalls is host function calls per request by name (from a separate counted
	// run); AllocsPerRequest is proxy_on_memory_allocate calls per request (host→guest
	// allocations), HostCallsPerRequest all host function calls per request.
	HostCalls           map[string]float64
	HostCallsPerRequest float64
	AllocsPerRequest    float64
	Status              int // status of the last answer (all must be 200)
}

// CostOptions sizes a decision-cost measurement.
type CostOptions struct {
	Rounds      int           // timed rounds (default 7)
	Round       time.Duration // length of one round (default 300 ms)
	CountedReqs int           // requests of the counted run (default 20,000)
}

func (o CostOptions) withDefaults() CostOptions {
	if o.Rounds <= 0 {
		o.Rounds = 7
	}
	if o.Round <= 0 {
		o.Round = 300 * time.Millisecond
	}
	if o.CountedReqs <= 0 {
		o.CountedReqs = 20_000
	}
	return o
}

// MeasureCost runs the same request through wasm (one worker, Exchange: no goroutine,
// timer or HTTP) and reports ns per request and, from a second host with
// host.Config.CountHostCalls, the host calls and host→guest allocations per request.
func MeasureCost(name string, wasm, pluginConfig []byte, o CostOptions) (Cost, error) {
	o = o.withDefaults()
	c := Cost{Module: name}
	req := BenchRequest("k-bench")

	h, err := host.New(host.Config{Wasm: wasm, PluginConfig: pluginConfig, Workers: 1, LogLevel: host.LogWarn})
	if err != nil {
		return c, fmt.Errorf("%s: %w", name, err)
	}
	defer h.Close()
	exchange := func(n int) error {
		for i := 0; i < n; i++ {
			resp, err := h.Exchange(0, req, UpstreamOK)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			c.Status = resp.Status
			if resp.Status != 200 {
				return fmt.Errorf("%s: status %d (%s)", name, resp.Status, resp.Body)
			}
		}
		return nil
	}
	if err := exchange(5000); err != nil { // warm-up: buckets created, caches hot
		return c, err
	}
	// Size a chunk to about 10 ms so the clock is read rarely.
	t0 := time.Now()
	if err := exchange(1000); err != nil {
		return c, err
	}
	chunk := max(100, int(10*time.Millisecond/max(time.Since(t0)/1000, 1)))
	for r := 0; r < o.Rounds; r++ {
		var n int64
		start := time.Now()
		for time.Since(start) < o.Round {
			if err := exchange(chunk); err != nil {
				return c, err
			}
			n += int64(chunk)
		}
		c.Requests += n
		c.RoundsNs = append(c.RoundsNs, float64(time.Since(start).Nanoseconds())/float64(n))
	}
	c.NsPerRequest = median(c.RoundsNs)

	hc, err := host.New(host.Config{Wasm: wasm, PluginConfig: pluginConfig, Workers: 1, LogLevel: host.LogWarn, CountHostCalls: true})
	if err != nil {
		return c, fmt.Errorf("%s (counted): %w", name, err)
	}
	defer hc.Close()
	for i := 0; i < 1000; i++ { // the first requests create buckets; count the steady state
		if _, err := hc.Exchange(0, req, UpstreamOK); err != nil {
			return c, fmt.Errorf("%s (counted): %w", name, err)
		}
	}
	before := hc.HostCalls()
	for i := 0; i < o.CountedReqs; i++ {
		if _, err := hc.Exchange(0, req, UpstreamOK); err != nil {
			return c, fmt.Errorf("%s (counted): %w", name, err)
		}
	}
	after := hc.HostCalls()
	c.HostCalls = map[string]float64{}
	for k, v := range after {
		d := float64(v-before[k]) / float64(o.CountedReqs)
		if d == 0 {
			continue
		}
		if k == "proxy_on_memory_allocate" {
			c.AllocsPerRequest = d
		} else {
			c.HostCallsPerRequest += d
		}
		c.HostCalls[k] = d
	}
	return c, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Percentile returns the p-th percentile (0..100) of sorted durations.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}
