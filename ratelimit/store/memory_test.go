package store

import (
	"context"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestMemoryPerBucket measures MEMORY USAGE of one bucket per algorithm while gateways
// hold leases on it, synced twice by each of 1 and 16 gateways. A bucket names no
// gateway (RATIONALE.md §2, §5), so the fleet adds only the few bytes of larger counts:
// at most 128 bytes with one gateway and 160 with sixteen.
func TestMemoryPerBucket(t *testing.T) {
	s, clock := clockedStore(t, Standalone, nil)
	ctx := context.Background()
	tests := []struct {
		gateways int
		maxBytes int64
	}{
		{1, 128},
		{16, 160},
	}
	for k := 0; k < numKinds; k++ {
		kind := algo.Kind(k)
		for _, tc := range tests {
			d0 := mkDelta(kind, uniq("mem"), "api")
			held := map[int]wire.State{}
			for sync := 0; sync < 2; sync++ {
				for g := 0; g < tc.gateways; g++ {
					*clock += 10_000
					d := d0
					d.Over, d.ElapsedMs = 3, 100
					if l := held[g]; l.Lease+l.Held > 0 {
						d.Over, d.Leased, d.Held, d.Epoch = 0, 1, l.Lease+l.Held-1, l.Epoch
					}
					b := &wire.Batch{Node: uniq("gw"), Seq: uint64(sync + 1), Deltas: []wire.Delta{d}}
					out, err := s.Apply(ctx, b, Options{Idempotent: true})
					if err != nil {
						t.Fatal(err)
					}
					held[g] = out.States[0]
				}
			}
			bu := stored(t, s, &d0)
			if bu.Leases.Outstanding() == 0 {
				t.Fatalf("%s, %d gateways: no lease outstanding", kind, tc.gateways)
			}
			n, err := s.MemoryUsage(ctx, d0.Key, d0.Rule, d0.Tier, d0.Window)
			if err != nil {
				t.Fatal(err)
			}
			// The log keeps a run per report time in its window, by design (O(limit),
			// shared/algo/ENCODING.md): its length beyond a fixed-size state's 13 bytes is
			// the algorithm's, not the fleet's, and is not held to the budget.
			logged := max(int64(len(bu.State))-13, 0)
			t.Logf("%-22s %2d gateway(s) x 2 syncs, %3d leased out: %3d bytes (state %d bytes)", kind, tc.gateways, bu.Leases.Outstanding(), n, len(bu.State))
			if n-logged > tc.maxBytes {
				t.Errorf("%s, %d gateways: %d bytes (%d of them log runs), want at most %d", kind, tc.gateways, n, logged, tc.maxBytes)
			}
		}
	}
}
