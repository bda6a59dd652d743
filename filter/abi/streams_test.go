package abi

import (
	"math/rand/v2"
	"testing"
)

// idStream is a Stream that remembers the id it was stored under.
type idStream struct{ id uint32 }

func (idStream) OnRequestHeaders(int, bool) Action  { return Continue }
func (idStream) OnResponseHeaders(int, bool) Action { return Continue }
func (idStream) OnLog()                             {}
func (idStream) OnDone()                            {}

// TestStreamTable runs the table against a Go map under the id patterns hosts produce:
// sequential ids with a few long-lived streams among them (the runs a lookup probes past),
// ids that collide on the table's low bits, and random ids; every lookup, removal and the
// count must agree with the map after every step.
func TestStreamTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(rng *rand.Rand, i int) uint32
	}{
		{"sequential", func(_ *rand.Rand, i int) uint32 { return uint32(i + 2) }},
		{"same low bits", func(_ *rand.Rand, i int) uint32 { return uint32(i) << 8 }},
		{"random", func(rng *rand.Rand, _ int) uint32 { return rng.Uint32() % 512 }},
		{"zero and wrap", func(_ *rand.Rand, i int) uint32 { return uint32(i) - 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var tab streamTable
			ref := map[uint32]bool{}
			var open []uint32
			check := func(id uint32) {
				t.Helper()
				got := tab.get(id)
				if ref[id] != (got != nil) || (got != nil && got.(idStream).id != id) {
					t.Fatalf("get(%d) = %v, want present %v", id, got, ref[id])
				}
			}
			for i := 0; i < 20_000; i++ {
				id := tc.next(rng, i)
				tab.put(id, idStream{id})
				if !ref[id] {
					open = append(open, id)
				}
				ref[id] = true
				check(id)
				// Close streams at random, mostly the newest (short requests), now and
				// then an old one (a long-lived stream ends).
				for len(open) > 0 && rng.IntN(3) > 0 {
					k := len(open) - 1 - rng.IntN(min(len(open), 4))
					if rng.IntN(50) == 0 {
						k = rng.IntN(len(open))
					}
					gone := open[k]
					open = append(open[:k], open[k+1:]...)
					if got := tab.remove(gone); got == nil || got.(idStream).id != gone {
						t.Fatalf("remove(%d) = %v for an open stream", gone, got)
					}
					delete(ref, gone)
					check(gone)
				}
				if (tab.remove(id+1<<31) != nil) != ref[id+1<<31] {
					t.Fatalf("remove of an absent id %d disagreed", id+1<<31)
				}
				if tab.n != len(ref) {
					t.Fatalf("n = %d, want %d", tab.n, len(ref))
				}
				for _, o := range open[max(0, len(open)-8):] {
					check(o)
				}
			}
			for id := range ref {
				check(id)
			}
		})
	}
}
