package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// gwLease is a lease as a gateway holds it: n still usable, pending used since the
// last report (still reserved at the service until reported).
type gwLease struct {
	n, pending int64
	epoch      uint32
}

// gateway is one simulated gateway with its own Store (as if each talked to its own
// service replica): what it holds per bucket, and what it admitted.
type gateway struct {
	name     string
	s        *Store
	rng      *rand.Rand
	held     map[string]gwLease // bucket key -> lease
	skipped  map[string]bool    // not reported last round
	seq      uint64
	dead     bool
	last     bool // reports everything this round, then dies
	demand   int64
	admitted map[string]int64
	over     map[string]int64 // overshoot the service reported for this gateway's charges
}

// TestConcurrentSync runs gateways concurrently on shared buckets, on a virtual clock, in
// rounds: each uses its lease for its demand, reports (renewing what it keeps, returning
// now and then, admitting a little outside any lease as a cold start does) or skips a
// round, and acquires when its lease falls short; one gateway dies half-way with leases
// in hand. After every round:
//
//   - Redis's outstanding leases equal what the gateways hold unreleased (a dead
//     gateway's until its epoch is reclaimed): no grant, renewal or return is lost or
//     counted twice when scripts of several service instances interleave;
//   - admitted + outstanding ≤ capacity + refill since the start + reported overshoot:
//     leases are reservations, so the bucket never hands out more than it holds.
func TestConcurrentSync(t *testing.T) {
	kinds := []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingWindowLog}
	const (
		gateways = 4
		rounds   = 80
		stepUs   = 250_000 // 8 rounds per epoch of testLease
		limit    = 200
		windowMs = 10_000
	)
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			var clock atomic.Int64
			clock.Store(t0)
			start := t0
			epochUs := testLease.EpochMs * 1000
			base := uniq("conc")
			deltaFor := func(k algo.Kind) wire.Delta {
				return wire.Delta{Key: fmt.Sprint(base, "-", k), Rule: "api", Algo: uint8(k), Limit: limit, WindowMs: windowMs}
			}
			gws := make([]*gateway, gateways)
			for i := range gws {
				s, _ := newStore(t, mode, nil)
				s.SetTestClock(clock.Load)
				gws[i] = &gateway{name: uniq(fmt.Sprint("gw", i)), s: s, rng: rand.New(rand.NewPCG(uint64(i), 7)),
					held: map[string]gwLease{}, skipped: map[string]bool{}, admitted: map[string]int64{}, over: map[string]int64{}}
			}
			var stats struct{ grants, renewals, returns, acquires, refusedAcquires, cold atomic.Int64 }
			for round := 0; round < rounds; round++ {
				now := clock.Add(stepUs)
				switch round {
				case rounds / 2:
					gws[0].last = true
				case rounds/2 + 1:
					gws[0].dead = true // with its leases: stranded until reclaimed
					stranded := int64(0)
					for _, l := range gws[0].held {
						stranded += l.n
					}
					if stranded == 0 {
						t.Fatal("the gateway died with no lease: nothing to reclaim")
					}
				}
				for _, g := range gws {
					g.demand = 25 // overload: the buckets run dry, leases are scarce
					if round < rounds/4 {
						g.demand = 4 // within the limit: leases cover the demand
					}
				}
				var wg sync.WaitGroup
				errs := make(chan error, gateways)
				for _, g := range gws {
					if g.dead {
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := g.round(ctx, kinds, deltaFor, now, &stats); err != nil {
							errs <- fmt.Errorf("round %d %s: %w", round, g.name, err)
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				for _, k := range kinds {
					d := deltaFor(k)
					bk := BucketKey(d.Key, d.Rule, d.Tier, d.Window)
					bu := stored(t, gws[1].s, &d)
					if bu.Leases.Epoch != uint32(now/epochUs) {
						t.Fatalf("round %d %s: stored epoch %d, clock in %d", round, k, bu.Leases.Epoch, now/epochUs)
					}
					var held, pending, admitted, overshoot int64
					for _, g := range gws {
						l := g.held[bk]
						if !g.dead || int64(uint32(now/epochUs)-l.epoch) <= 1 { // a dead gateway's lease counts until reclaimed
							held += l.n
							pending += l.pending
						}
						admitted += g.admitted[bk]
						overshoot += g.over[bk]
					}
					if out := bu.Leases.Outstanding(); out != held+pending {
						t.Fatalf("round %d %s: Redis has %d outstanding, gateways hold %d and used %d unreported", round, k, out, held, pending)
					}
					refill := (limit*(now-start)/1000 + windowMs - 1) / windowMs
					if bound := limit + refill + overshoot; admitted+held > bound {
						t.Fatalf("round %d %s: admitted %d + leased %d > capacity %d + refill %d + overshoot %d",
							round, k, admitted, held, limit, refill, overshoot)
					}
				}
			}
			// The rounds must have exercised what they claim to test.
			for name, n := range map[string]int64{"grants": stats.grants.Load(), "renewals": stats.renewals.Load(), "returns": stats.returns.Load(),
				"acquires": stats.acquires.Load(), "refused acquires": stats.refusedAcquires.Load(), "cold admissions": stats.cold.Load()} {
				if n == 0 {
					t.Errorf("no %s in %d rounds", name, rounds)
				}
			}
			t.Logf("grants %d, renewals %d, returns %d, acquires %d (%d refused), cold admissions %d", stats.grants.Load(), stats.renewals.Load(),
				stats.returns.Load(), stats.acquires.Load(), stats.refusedAcquires.Load(), stats.cold.Load())
		})
	}
}

// round is one gateway's sync interval: demand on every bucket, then one batch with the
// buckets it reports and one acquire per bucket whose lease fell short.
func (g *gateway) round(ctx context.Context, kinds []algo.Kind, deltaFor func(algo.Kind) wire.Delta, now int64,
	stats *struct{ grants, renewals, returns, acquires, refusedAcquires, cold atomic.Int64 }) error {
	b := &wire.Batch{Node: g.name}
	var acquires []wire.Delta
	for _, k := range kinds {
		d := deltaFor(k)
		bk := BucketKey(d.Key, d.Rule, d.Tier, d.Window)
		l := g.held[bk]
		demand := g.rng.Int64N(g.demand)
		used := min(l.n, demand)
		g.admitted[bk] += used
		short := demand - used
		d.Leased, d.Epoch = uint32(l.pending+used), l.epoch
		d.ElapsedMs = 250
		if g.skipped[bk] {
			d.ElapsedMs = 500
		}
		keep := l.n - used
		if g.rng.IntN(6) == 0 {
			d.Returned = uint32(keep) // gives it back (not needed)
			keep = 0
		}
		d.Held = uint32(keep)
		switch {
		case short > 0 && !g.last && g.rng.IntN(2) == 0:
			d.Flags |= wire.FlagAcquire
			d.Over = uint32(short)
			acquires = append(acquires, d)
		case !g.skipped[bk] && !g.last && used == demand && d.Returned == 0 && g.rng.IntN(4) == 0:
			// within its lease: not reported this round (the service still holds the lease)
			g.skipped[bk] = true
			g.held[bk] = gwLease{l.n - used, l.pending + used, l.epoch}
			continue
		default:
			if l.n == 0 && short > 0 && g.rng.IntN(3) == 0 {
				d.Over = uint32(min(short, 3)) // admitted cold, before the first reply
				g.admitted[bk] += int64(d.Over)
				stats.cold.Add(1)
			} else {
				d.Rejected = uint32(short)
			}
			b.Deltas = append(b.Deltas, d)
		}
		g.skipped[bk] = false
	}
	fold := func(d *wire.Delta, r *lease.SyncResult) {
		bk := BucketKey(d.Key, d.Rule, d.Tier, d.Window)
		g.held[bk] = gwLease{n: r.Held + r.Grant, epoch: r.Epoch}
		g.over[bk] += r.Overshoot
		if r.Grant > 0 {
			stats.grants.Add(1)
		}
		if r.Held > 0 {
			stats.renewals.Add(1)
		}
		if d.Returned > 0 {
			stats.returns.Add(1)
		}
	}
	g.seq++
	b.Seq = g.seq
	out, err := g.s.Apply(ctx, b, Options{Idempotent: true})
	if err != nil {
		return err
	}
	for i := range b.Deltas {
		fold(&b.Deltas[i], &out.Results[i])
	}
	for _, d := range acquires {
		out, err := g.s.Apply(ctx, &wire.Batch{Node: g.name, Deltas: []wire.Delta{d}}, Options{})
		if err != nil {
			return err
		}
		r := &out.Results[0]
		stats.acquires.Add(1)
		bk := BucketKey(d.Key, d.Rule, d.Tier, d.Window)
		if r.Allowed {
			g.admitted[bk] += int64(d.Over)
		} else {
			stats.refusedAcquires.Add(1)
		}
		fold(&d, r)
	}
	return nil
}
