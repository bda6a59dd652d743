// Package layering holds the test that keeps the module's rooms in their order: pure
// shared packages at the bottom, the internal helpers on them, the filter, the service
// and the deploy files beside each other on those, and the benchmarks and the
// end-to-end suite on top. A package may import its own room or a lower layer, never a
// higher one and never a peer room of its own layer (the filter and the service share
// only what lives in shared/ and internal/).
package layering

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/tollgate-rl/tollgate/"

// layers: the top-level directory of each room and its layer (higher imports lower).
var layers = map[string]int{
	"shared":    0,
	"internal":  1,
	"filter":    2,
	"ratelimit": 2,
	"deploy":    2,
	"bench":     3,
	"e2e":       3,
}

func room(path string) string {
	r, _, _ := strings.Cut(strings.TrimPrefix(path, module), "/")
	return r
}

// TestNoImportPointsUp lists every package's non-test imports with go list and fails on
// one that points to a higher layer or to a peer room. Tests may import harnesses from
// anywhere (a filter test starts the sync service), so only the packages themselves are
// held to the order.
func TestNoImportPointsUp(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from := f[0]
		rf, ok := layers[room(from)]
		if !ok {
			t.Errorf("%s: room %q has no layer in this test", from, room(from))
			continue
		}
		pkgs++
		for _, to := range f[1:] {
			if !strings.HasPrefix(to, module) || room(to) == room(from) {
				continue
			}
			rt, ok := layers[room(to)]
			switch {
			case !ok:
				t.Errorf("%s imports %s, whose room has no layer", from, to)
			case rt > rf:
				t.Errorf("%s (layer %d) imports %s (layer %d): an import pointing up", from, rf, to, rt)
			case rt == rf:
				t.Errorf("%s imports %s: peer rooms of layer %d share only lower layers", from, to, rf)
			}
		}
	}
	if pkgs < 50 {
		t.Fatalf("go list named %d packages of the module; expected the whole tree", pkgs)
	}
}
