package plugin

import (
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/keyhash"
)

// TestKeyNames: the cache answers every key's own name, whether its slot holds it, is
// empty or holds another key (200 keys through 64 slots, twice, in two orders).
func TestKeyNames(t *testing.T) {
	var c keyNames
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = "sk_" + strconv.Itoa(i)
	}
	for _, order := range []string{"forward", "backward", "forward again"} {
		t.Run(order, func(t *testing.T) {
			for i := range keys {
				k := keys[i]
				if order == "backward" {
					k = keys[len(keys)-1-i]
				}
				if got, want := string(c.name(k)), keyhash.String(k); got != want {
					t.Fatalf("name(%q) = %q, want %q", k, got, want)
				}
			}
		})
	}
}
