package perf

import (
	"fmt"
	"sort"
	"time"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// TelemetryConfig is LocalConfig's token-bucket rule (never reached) with the filter's
// telemetry — per-rule stats and the decision metadata for the access log — on or off.
func TelemetryConfig(on bool) []byte {
	return []byte(fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"telemetry":{"rule_stats":%t,"decision_metadata":%t},`+
		`"rules":[{"id":"api","algorithm":"token_bucket","limit":1000000,"window":"1s"}]}`, on, on))
}

// TelemetryCost is the decision cost of one module with its telemetry off and on.
type TelemetryCost struct {
	// Off and On are MeasureCosts' figures for each (ns per request, host calls).
	Off, On Cost
	// PairRatios are on/off time ratios of back-to-back chunks of about 2 ms each (the
	// order alternating), so that load from elsewhere on the machine, which shifts by
	// far more than the difference between rounds of 300 ms, hits both sides of a pair
	// alike.
	PairRatios []float64
}

// Overhead is the share the telemetry adds to the decision time (0.05: 5 %): the median
// of the pair ratios, or the ratio of the medians when there are none.
func (c TelemetryCost) Overhead() float64 {
	if len(c.PairRatios) > 0 {
		return median(c.PairRatios) - 1
	}
	if c.Off.NsPerRequest <= 0 {
		return 0
	}
	return c.On.NsPerRequest/c.Off.NsPerRequest - 1
}

// MeasureTelemetry measures the filter module wasm with TelemetryConfig off and on:
// MeasureCosts for each, then o.Rounds × 100 pairs of back-to-back chunks.
func MeasureTelemetry(wasm []byte, o CostOptions) (TelemetryCost, error) {
	o = o.withDefaults()
	costs, err := MeasureCosts([]CostModule{
		{Name: "Tollgate filter, telemetry off", Wasm: wasm, Config: TelemetryConfig(false)},
		{Name: "Tollgate filter, telemetry on (per-rule stats, decision metadata)", Wasm: wasm, Config: TelemetryConfig(true)},
	}, o)
	if err != nil {
		return TelemetryCost{}, err
	}
	c := TelemetryCost{Off: costs[0], On: costs[1]}
	var hosts [2]*wazerohost.Host
	for i, on := range []bool{false, true} {
		h, err := wazerohost.New(wazerohost.Config{Wasm: wasm, PluginConfig: TelemetryConfig(on), Workers: 1, LogLevel: wazerohost.LogWarn})
		if err != nil {
			return c, err
		}
		defer h.Close()
		hosts[i] = h
	}
	if c.PairRatios, err = PairRatios(hosts[0], hosts[1], c.Off.NsPerRequest, 100*o.Rounds); err != nil {
		return c, fmt.Errorf("telemetry pair: %w", err)
	}
	return c, nil
}

// PairModules is PairRatios of two modules on one worker each with the same plugin
// configuration: b/a time ratios.
func PairModules(a, b, config []byte, nsPerRequest float64, pairs int) ([]float64, error) {
	var hosts [2]*wazerohost.Host
	for i, wasm := range [][]byte{a, b} {
		h, err := wazerohost.New(wazerohost.Config{Wasm: wasm, PluginConfig: config, Workers: 1, LogLevel: wazerohost.LogWarn})
		if err != nil {
			return nil, err
		}
		defer h.Close()
		hosts[i] = h
	}
	return PairRatios(hosts[0], hosts[1], nsPerRequest, pairs)
}

// PairRatios times BenchRequest through a and b in back-to-back chunks of about 2 ms
// each (nsPerRequest sizes them; the order alternates) after a warm-up, and returns
// pairs b/a ratios, sorted: load from elsewhere on the machine, which shifts by far
// more than a small difference between rounds of 300 ms, hits both sides of a pair
// alike.
func PairRatios(a, b *wazerohost.Host, nsPerRequest float64, pairs int) ([]float64, error) {
	hosts := [2]*wazerohost.Host{a, b}
	req := BenchRequest("k-bench")
	chunk := func(h *wazerohost.Host, n int) (time.Duration, error) {
		start := time.Now()
		for k := 0; k < n; k++ {
			if resp, err := h.Exchange(0, req, UpstreamOK); err != nil || resp.Status != 200 {
				return 0, fmt.Errorf("status %v, err %v", resp, err)
			}
		}
		return time.Since(start), nil
	}
	for _, h := range hosts { // warm-up
		if _, err := chunk(h, 5000); err != nil {
			return nil, err
		}
	}
	n := max(20, int(2*time.Millisecond/time.Duration(max(nsPerRequest, 1))))
	ratios := make([]float64, 0, pairs)
	for p := 0; p < pairs; p++ {
		first := p % 2
		var d [2]time.Duration
		for _, i := range []int{first, 1 - first} {
			var err error
			if d[i], err = chunk(hosts[i], n); err != nil {
				return nil, err
			}
		}
		ratios = append(ratios, float64(d[1])/float64(d[0]))
	}
	sort.Float64s(ratios)
	return ratios, nil
}
