package rule_test

import (
	"fmt"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// Parse a rule set, then ask which rules apply to a request, under which caller key,
// with which limits and cost.
func Example() {
	cfg, err := rule.Parse([]byte(`{
		"key":   {"source": "header", "name": "x-api-key"},
		"tiers": [{"name": "pro", "keys": ["sk_pro_*"]}],
		"rules": [
			{"id": "search", "match": {"prefix": "/search"}, "limit": 30, "window": "1m",
			 "costs": [{"prefix": "/search/deep", "cost": 10}]},
			{"id": "plan", "limit": 100, "window": "1m", "tiers": {"pro": {"limit": 1000, "window": "1m"}}}
		]
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	headers := map[string]string{"x-api-key": "sk_pro_42"}
	req := &rule.Request{Method: "GET", Path: "/search/deep/x", Header: func(name string) (string, bool) {
		v, ok := headers[name]
		return v, ok
	}}
	for _, a := range cfg.Apply(req, nil) {
		w := a.Windows[0]
		fmt.Printf("%s: key %s, tier %q, %d per %s (%s), cost %d\n", a.Rule.ID, a.Key, a.Tier,
			w.Limit, rule.FormatWindow(w.WindowUs), rule.AlgorithmName(w.Kind), a.Cost)
	}
	// Output:
	// search: key sk_pro_42, tier "", 30 per 1m (token_bucket), cost 10
	// plan: key sk_pro_42, tier "pro", 1000 per 1m (token_bucket), cost 1
}

// A rule set with mistakes is refused with every one of them, each naming its field.
func ExampleParse_errors() {
	_, err := rule.Parse([]byte(`{"rules": [
		{"id": "a", "limit": 0, "window": "1 minute"},
		{"id": "b", "algorithm": "leaky", "limit": 10, "window": "1m", "fail": "maybe"}
	]}`))
	for _, fe := range rule.All(err) {
		fmt.Println(fe)
	}
	// Output:
	// rules[0].limit: must be > 0, got 0
	// rules[0].window: invalid duration "1 minute" (want e.g. "500ms", "1m", "1h30m", "30d" or integer milliseconds)
	// rules[1].algorithm: unknown algorithm "leaky" (want token_bucket, gcra, sliding_window_log, sliding_window_counter or fixed_window)
	// rules[1].fail: must be "open" or "closed", got "maybe"
}
