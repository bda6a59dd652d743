package refusal

import (
	"encoding/json"
	"testing"
)

func TestBodyConcurrencyGolden(t *testing.T) {
	for _, tt := range []struct {
		name  string
		limit int64
		rule  string
	}{
		{"body_429_concurrency", 20, "llm"},
		{"body_429_concurrency_one", 1, `odd "rule"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendBodyConcurrency(nil, tt.limit, 1, tt.rule)
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
			golden(t, tt.name, got)
		})
	}
}
