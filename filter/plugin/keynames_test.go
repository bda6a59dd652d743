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
				if got, want := string(c.name("", k)), keyhash.String(k); got != want {
					t.Fatalf("name(%q) = %q, want %q", k, got, want)
				}
			}
		})
	}
	// A secret (a reconfiguration sets or changes it) renames every key, cached or not.
	for _, secret := range []string{"s3cret", "rotated", ""} {
		for _, k := range keys[:80] {
			want := keyhash.String(k)
			if secret != "" {
				want = string(keyhash.AppendKeyed(nil, secret, k))
			}
			if got := string(c.name(secret, k)); got != want {
				t.Fatalf("name(%q, %q) = %q, want %q", secret, k, got, want)
			}
		}
	}
}
