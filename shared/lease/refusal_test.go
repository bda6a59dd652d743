package lease

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestRefusal: what the service refuses a delta for, whatever its backend, and that the
// reason fits a wire State.
func TestRefusal(t *testing.T) {
	good := wire.Delta{Key: "k", Rule: "r", Algo: uint8(algo.FixedWindow), Limit: 10, WindowMs: 1000}
	tests := []struct {
		name string
		edit func(d *wire.Delta)
		want string // prefix; "" for accepted
	}{
		{"accepted", func(*wire.Delta) {}, ""},
		{"empty key", func(d *wire.Delta) { d.Key = "" }, "key: empty"},
		{"empty rule", func(d *wire.Delta) { d.Rule = "" }, "rule: empty"},
		{"key checked first", func(d *wire.Delta) { d.Key, d.Rule = "", "" }, "key: empty"},
		{"limit 0", func(d *wire.Delta) { d.Limit = 0 }, "params: limit: "},
		{"unknown algorithm", func(d *wire.Delta) { d.Algo = 200 }, "params: algorithm: "},
		{"window 0", func(d *wire.Delta) { d.WindowMs = 0 }, "params: window: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := good
			tc.edit(&d)
			got := Refusal(&d)
			if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) || len(got) > wire.MaxTagLen {
				t.Fatalf("Refusal = %q, want prefix %q within %d bytes", got, tc.want, wire.MaxTagLen)
			}
		})
	}
	if got := TruncateReason(strings.Repeat("x", 100)); len(got) != wire.MaxTagLen {
		t.Fatalf("TruncateReason kept %d bytes, want %d", len(got), wire.MaxTagLen)
	}
}
