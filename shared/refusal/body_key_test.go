package refusal

import (
	"encoding/json"
	"testing"
)

func TestBodyKeyMissingGolden(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		rule   string
	}{
		{"body_401_key_missing", 401, "api"},
		{"body_403_key_missing", 403, "tenant.users"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendBodyKeyMissing(nil, tt.status, tt.rule)
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
			golden(t, tt.name, got)
		})
	}
}
