package perf

import (
	"fmt"
	"sort"
	"time"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// DefaultKeyConfig is one local token-bucket rule (no sync section) with the default
// key — x-api-key, falling back to the client IP — and a limit the benchmark never
// reaches, so every request takes the admit path.
var DefaultKeyConfig = []byte(`{"rules":[{"id":"api","limit":1000000,"window":"1s"}]}`)

// BenchRequest is the request every decision-cost measurement sends: what a client
// behind an edge proxy sends, with the headers Envoy's connection manager would have
// added already present (so the host does not generate a request id per request).
func BenchRequest(key string) *wazerohost.Request {
	return &wazerohost.Request{
		Method:    "GET",
		Path:      "/v1/search?q=tollgate",
		Authority: "api.example.com",
		Header: []wazerohost.Pair{
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
var UpstreamOK = &wazerohost.Response{Status: 200, Header: []wazerohost.Pair{{"content-type", "application/json"}, {"content-length", "2"}}, Body: nil}

// Cost is the decision cost of one module.
type Cost struct {
	Module   string
	Requests int64 // requests in the timed rounds
	// NsPerRequest is the median over interleaved rounds of the wall time of one Exchange:
	// proxy_on_context_create, proxy_on_request_headers, proxy_on_response_headers,
	// proxy_on_log (when the module exports it), proxy_on_done, proxy_on_delete (when
	// the module exports it).
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
	// GuestNsPerRequest is the CPU time per request spent in the module's own code
	// (from a CPU profile of at least 1 s more, see ProfileGuest), when profiled.
	GuestNsPerRequest float64
	// ProfiledNsPerRequest is all CPU time sampled in the timed rounds per request.
	ProfiledNsPerRequest float64
	Native               bool // measured natively (CostModule.Native)
}

// CostOptions sizes a decision-cost measurement.
type CostOptions struct {
	Rounds      int           // timed rounds per module (default 9)
	Round       time.Duration // length of one round (default 300 ms)
	CountedReqs int           // requests of the counted run (default 20,000)
	Profile     bool          // profile ≥ 1 s more per module (GuestNsPerRequest)
}

func (o CostOptions) withDefaults() CostOptions {
	if o.Rounds <= 0 {
		o.Rounds = 9
	}
	if o.Round <= 0 {
		o.Round = 300 * time.Millisecond
	}
	if o.CountedReqs <= 0 {
		o.CountedReqs = 20_000
	}
	return o
}

// CostModule is one module of the decision-cost comparison.
type CostModule struct {
	Name   string
	Wasm   []byte
	Config []byte // plugin configuration
	// Request and Upstream, when set, replace BenchRequest("k-bench") and UpstreamOK.
	Request  *wazerohost.Request
	Upstream *wazerohost.Response
	// Native runs Config through the plugin's own code compiled natively
	// (filter/nativehost, an in-process host of Go maps) instead of a module; Wasm is
	// ignored, and nothing is profiled or counted (the row says what the same logic
	// costs without wasm).
	Native bool
}

func (m *CostModule) exchange() (*wazerohost.Request, *wazerohost.Response) {
	req, up := m.Request, m.Upstream
	if req == nil {
		req = BenchRequest("k-bench")
	}
	if up == nil {
		up = UpstreamOK
	}
	return req, up
}

// MeasureCosts runs the same request through each module (one worker each, Exchange:
// no goroutine, timer or HTTP) and reports ns per request. The timed rounds are
// interleaved — round r of every module before round r+1 of any — so that other work on
// the machine disturbs every module alike. Then, per module, a profiled phase measures
// the CPU spent in the module's own code (when o.Profile), and a second host with
// wazerohost.Config.CountHostCalls counts host calls and host→guest allocations per request.
func MeasureCosts(mods []CostModule, o CostOptions) ([]Cost, error) {
	o = o.withDefaults()
	costs := make([]Cost, len(mods))
	runs := make([]func(n int) error, len(mods))
	chunks := make([]int, len(mods))
	for i, m := range mods {
		costs[i].Module, costs[i].Native = m.Name, m.Native
		if m.Native {
			run, err := nativeRun(&costs[i], m)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			runs[i] = run
		} else {
			h, err := wazerohost.New(wazerohost.Config{Wasm: m.Wasm, PluginConfig: m.Config, Workers: 1, LogLevel: wazerohost.LogWarn})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			defer h.Close()
			c, name := &costs[i], m.Name
			req, up := m.exchange()
			runs[i] = func(n int) error {
				for k := 0; k < n; k++ {
					resp, err := h.Exchange(0, req, up)
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
		}
		if err := runs[i](5000); err != nil { // warm-up: buckets created, caches hot
			return nil, err
		}
		// Size a chunk to about 10 ms so the clock is read rarely.
		t0 := time.Now()
		if err := runs[i](1000); err != nil {
			return nil, err
		}
		chunks[i] = max(100, int(10*time.Millisecond/max(time.Since(t0)/1000, 1)))
	}
	round := func(i int) (n int64, err error) {
		start := time.Now()
		for time.Since(start) < o.Round {
			if err := runs[i](chunks[i]); err != nil {
				return n, err
			}
			n += int64(chunks[i])
		}
		costs[i].RoundsNs = append(costs[i].RoundsNs, float64(time.Since(start).Nanoseconds())/float64(n))
		return n, nil
	}
	for r := 0; r < o.Rounds; r++ {
		for i := range mods {
			n, err := round(i)
			if err != nil {
				return nil, err
			}
			costs[i].Requests += n
		}
	}
	for i, m := range mods {
		c := &costs[i]
		c.NsPerRequest = median(c.RoundsNs)
		if m.Native {
			continue
		}
		if o.Profile {
			var n int64
			guest, total, err := ProfileGuest(func() error {
				// At least 1 s: the profiler samples every 10 ms.
				for start := time.Now(); time.Since(start) < max(3*o.Round, time.Second); {
					k, err := round(i)
					if err != nil {
						return err
					}
					n += k
					c.RoundsNs = c.RoundsNs[:len(c.RoundsNs)-1] // profiled rounds are not timed ones
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			c.GuestNsPerRequest = float64(guest.Nanoseconds()) / float64(n)
			c.ProfiledNsPerRequest = float64(total.Nanoseconds()) / float64(n)
		}
		if err := countCalls(c, m, o.CountedReqs); err != nil {
			return nil, err
		}
	}
	return costs, nil
}

// countCalls fills c's host-call counts from a host that counts them.
func countCalls(c *Cost, m CostModule, n int) error {
	req, up := m.exchange()
	hc, err := wazerohost.New(wazerohost.Config{Wasm: m.Wasm, PluginConfig: m.Config, Workers: 1, LogLevel: wazerohost.LogWarn, CountHostCalls: true})
	if err != nil {
		return fmt.Errorf("%s (counted): %w", m.Name, err)
	}
	defer hc.Close()
	for i := 0; i < 1000; i++ { // the first requests create buckets; count the steady state
		if _, err := hc.Exchange(0, req, up); err != nil {
			return fmt.Errorf("%s (counted): %w", m.Name, err)
		}
	}
	before := hc.HostCalls()
	for i := 0; i < n; i++ {
		if _, err := hc.Exchange(0, req, up); err != nil {
			return fmt.Errorf("%s (counted): %w", m.Name, err)
		}
	}
	after := hc.HostCalls()
	c.HostCalls = map[string]float64{}
	for k, v := range after {
		d := float64(v-before[k]) / float64(n)
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
	return nil
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
