package perf

// Concurrency-limit cost: the same filter module deciding the same request (BenchRequest)
// under a token-bucket rule, and under the same rule with max_in_flight (never reached:
// every request takes a slot and gives it back when its stream ends), in interleaved
// rounds.

// InFlightOffConfig is the rule without max_in_flight.
var InFlightOffConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},
	"rules":[{"id":"api","limit":1000000,"window":"1s"}]}`)

// InFlightOnConfig is the same rule with max_in_flight.
var InFlightOnConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},
	"rules":[{"id":"api","limit":1000000,"window":"1s","max_in_flight":1000000}]}`)

// InFlightCost is the decision cost of one request without and with the slot.
type InFlightCost struct {
	Off, On Cost
}

// Ratio is the cost with max_in_flight over the cost without.
func (c InFlightCost) Ratio() float64 {
	if c.Off.NsPerRequest <= 0 {
		return 0
	}
	return c.On.NsPerRequest / c.Off.NsPerRequest
}

// MeasureInFlightCost measures filter (the compiled module) under both configurations,
// side by side in one run (MeasureCosts' interleaved rounds).
func MeasureInFlightCost(filter []byte, o CostOptions) (InFlightCost, error) {
	costs, err := MeasureCosts([]CostModule{
		{Name: "filter, rate limit", Wasm: filter, Config: InFlightOffConfig},
		{Name: "filter, rate limit + max_in_flight", Wasm: filter, Config: InFlightOnConfig},
	}, o)
	if err != nil {
		return InFlightCost{}, err
	}
	return InFlightCost{Off: costs[0], On: costs[1]}, nil
}
