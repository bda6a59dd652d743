package ingestgen

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestBatch(t *testing.T) {
	g := New("p", 41)
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := g.Batch(rng), g.Batch(rng)
	if a.Seq != 42 || b.Seq != 43 {
		t.Errorf("sequence numbers %d, %d, want 42, 43", a.Seq, b.Seq)
	}
	seen := map[string]bool{}
	for _, d := range a.Deltas {
		if seen[d.Key] {
			t.Fatalf("key %s twice in one batch", d.Key)
		}
		seen[d.Key] = true
		if !strings.HasPrefix(d.Key, "p-") || d.Leased > 2 || d.Over > 1 || d.Rejected > 1 {
			t.Fatalf("delta out of shape: %+v", d)
		}
	}
	if len(a.Deltas) != Batch {
		t.Errorf("%d deltas, want %d", len(a.Deltas), Batch)
	}
}
