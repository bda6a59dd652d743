package perf

import "fmt"

// TelemetryConfig is LocalConfig's token-bucket rule (never reached) with the filter's
// telemetry — per-rule stats and the decision metadata for the access log — on or off.
func TelemetryConfig(on bool) []byte {
	return []byte(fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"telemetry":{"rule_stats":%t,"decision_metadata":%t},`+
		`"rules":[{"id":"api","algorithm":"token_bucket","limit":1000000,"window":"1s"}]}`, on, on))
}

// TelemetryCost is the decision cost of one module with its telemetry off and on, timed
// in interleaved rounds (MeasureCosts), so the difference is what per-rule stats and the
// decision metadata cost a request.
type TelemetryCost struct {
	Off, On Cost
}

// Overhead is the share the telemetry adds to the decision time (0.05: 5 %).
func (c TelemetryCost) Overhead() float64 {
	if c.Off.NsPerRequest <= 0 {
		return 0
	}
	return c.On.NsPerRequest/c.Off.NsPerRequest - 1
}

// MeasureTelemetry measures the filter module wasm with TelemetryConfig off and on.
func MeasureTelemetry(wasm []byte, o CostOptions) (TelemetryCost, error) {
	costs, err := MeasureCosts([]CostModule{
		{Name: "Tollgate filter, telemetry off", Wasm: wasm, Config: TelemetryConfig(false)},
		{Name: "Tollgate filter, telemetry on (per-rule stats, decision metadata)", Wasm: wasm, Config: TelemetryConfig(true)},
	}, o)
	if err != nil {
		return TelemetryCost{}, err
	}
	return TelemetryCost{Off: costs[0], On: costs[1]}, nil
}
