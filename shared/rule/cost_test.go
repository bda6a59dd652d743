package rule

import "testing"

func TestParseCostFrom(t *testing.T) {
	tests := []struct {
		name, doc string
		want      *CostFrom
	}{
		{"none", `{}`, nil},
		{"header", `{"cost_from":{"header":"X-Tokens-Used"}}`, &CostFrom{Header: "x-tokens-used", MaxBodyBytes: DefaultMaxBodyBytes}},
		{"body", `{"cost_from":{"body":"usage.total_tokens"}}`, &CostFrom{Body: "usage.total_tokens", MaxBodyBytes: DefaultMaxBodyBytes}},
		{"body index and cap", `{"cost_from":{"body":"choices.0.usage.n","max_body_bytes":4096}}`, &CostFrom{Body: "choices.0.usage.n", MaxBodyBytes: 4096}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := `{"rules":[{"id":"llm","limit":10000,"window":"1m","cost":50` + tt.doc[1:len(tt.doc)-1]
			if tt.doc != `{}` {
				doc = `{"rules":[{"id":"llm","limit":10000,"window":"1m","cost":50,` + tt.doc[1:len(tt.doc)-1]
			}
			c, err := Parse([]byte(doc + `}]}`))
			if err != nil {
				t.Fatal(err)
			}
			r := &c.Rules[0]
			if r.Cost != 50 {
				t.Errorf("cost (the estimate) = %d, want 50", r.Cost)
			}
			switch got := r.CostFrom; {
			case (got == nil) != (tt.want == nil):
				t.Fatalf("cost_from = %+v, want %+v", got, tt.want)
			case got != nil && *got != *tt.want:
				t.Errorf("cost_from = %+v, want %+v", *got, *tt.want)
			}
		})
	}
}
