package perf

// Match-condition cost: the same filter module deciding the same request (BenchRequest)
// under a rule that selects it by one path prefix, and under one that selects it by
// host, path prefix and a header's exact value, in interleaved rounds.

// MatchPrefixConfig selects BenchRequest by its path prefix alone.
var MatchPrefixConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},
	"rules":[{"id":"api","match":{"prefix":"/v1/search"},"limit":1000000,"window":"1s"}]}`)

// MatchThreeConfig selects BenchRequest by host, path prefix and an exact header value.
var MatchThreeConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},
	"rules":[{"id":"api","match":{"hosts":["api.example.com"],"prefix":"/v1/search",
	  "headers":[{"name":"x-forwarded-proto","exact":"http"}]},"limit":1000000,"window":"1s"}]}`)

// MatchCost is the decision cost of one request under both rules.
type MatchCost struct {
	Prefix, Three Cost
}

// Ratio is the three-condition decision's cost over the single-prefix one's.
func (m MatchCost) Ratio() float64 {
	if m.Prefix.NsPerRequest <= 0 {
		return 0
	}
	return m.Three.NsPerRequest / m.Prefix.NsPerRequest
}

// MeasureMatchCost measures filter (the compiled module) under both configurations,
// side by side in one run (MeasureCosts' interleaved rounds).
func MeasureMatchCost(filter []byte, o CostOptions) (MatchCost, error) {
	costs, err := MeasureCosts([]CostModule{
		{Name: "filter, prefix match", Wasm: filter, Config: MatchPrefixConfig},
		{Name: "filter, host + prefix + header exact", Wasm: filter, Config: MatchThreeConfig},
	}, o)
	if err != nil {
		return MatchCost{}, err
	}
	return MatchCost{Prefix: costs[0], Three: costs[1]}, nil
}
