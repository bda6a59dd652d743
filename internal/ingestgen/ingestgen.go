// Package ingestgen generates the sync batches the service's ingest benchmarks apply
// (ratelimit/service's BenchmarkRawBatch and BenchmarkSyncHTTP, and bench/perf's
// RunIngest for BENCHMARKS.md): 1,000 deltas of distinct keys out of 10,000, as one
// worker of one of 8 gateways sends them. One generator, so the two measure the same
// batches.
package ingestgen

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const (
	Keys     = 10_000 // the key space
	Batch    = 1000   // deltas per batch, of distinct keys
	Gateways = 8      // node ids the batches come from
)

// Gen makes batches of keys named <prefix>-<n>, each with the next sequence number.
// It is safe for concurrent use.
type Gen struct {
	prefix string
	seq    atomic.Uint64
}

// New returns a generator whose sequence numbers start after first.
func New(prefix string, first uint64) *Gen {
	g := &Gen{prefix: prefix}
	g.seq.Store(first)
	return g
}

// Batch builds one batch from rng: a token bucket of 1,000 a minute per key, each delta
// reporting 0–2 leased, 0–1 over and 0–1 refused.
func (g *Gen) Batch(rng *rand.Rand) *wire.Batch {
	b := &wire.Batch{Node: fmt.Sprint("gw-", rng.IntN(Gateways)), Seq: g.seq.Add(1)}
	seen := make(map[int]bool, Batch)
	for len(b.Deltas) < Batch {
		k := rng.IntN(Keys)
		if seen[k] {
			continue
		}
		seen[k] = true
		b.Deltas = append(b.Deltas, wire.Delta{
			Key: fmt.Sprint(g.prefix, "-", k), Rule: "api", Algo: uint8(algo.TokenBucket),
			Limit: 1000, WindowMs: 60_000, Leased: uint32(rng.IntN(3)), Over: uint32(rng.IntN(2)), Rejected: uint32(rng.IntN(2)),
		})
	}
	return b
}
