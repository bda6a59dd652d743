package store

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// twin is the Go model of Redis: shared/lease.Sync on in-memory buckets.
type twin struct {
	buckets map[string]*lease.Bucket
	pens    map[string]*lease.Penalty
}

// apply runs the batch's deltas in the order the store's script calls apply them.
func (tw *twin) apply(b *wire.Batch, now int64, cfg lease.SyncConfig, clustered bool) []lease.SyncResult {
	out := make([]lease.SyncResult, len(b.Deltas))
	var order []int
	for _, g := range plan(b, clustered) {
		order = append(order, g.idx...)
	}
	for _, i := range order {
		d := &b.Deltas[i]
		bk := BucketKey(d.Key, d.Rule, d.Window)
		bu := tw.buckets[bk]
		if bu == nil {
			bu = &lease.Bucket{}
			tw.buckets[bk] = bu
		}
		pk := PenaltyKey(d.Key)
		pen := tw.pens[pk]
		if pen == nil {
			pen = &lease.Penalty{}
			tw.pens[pk] = pen
		}
		out[i] = lease.Sync(bu, pen, b.Node, b.Worker, b.Seq, d, now, cfg)
	}
	return out
}

// TestDifferential drives the Lua scripts and the Go twin with the same random batches
// and the same clock and requires identical answers and identical stored fields after
// every batch, for every algorithm, on a standalone server and on a cluster.
func TestDifferential(t *testing.T) {
	for _, mode := range []Mode{Standalone, Cluster} {
		for k := 0; k < numKinds; k++ {
			kind := algo.Kind(k)
			t.Run(fmt.Sprintf("%s/%s", mode, kind), func(t *testing.T) {
				t.Parallel()
				var clock int64
				s, _ := newStore(t, mode, nil)
				s.nowUs = func() int64 { return clock }
				differential(t, s, kind, uint64(k)+11, &clock)
			})
		}
	}
}

func differential(t *testing.T, s *Store, kind algo.Kind, seed uint64, clock *int64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 42))
	cfg := s.cfg.Lease
	tw := &twin{buckets: map[string]*lease.Bucket{}, pens: map[string]*lease.Penalty{}}
	prefix := fmt.Sprintf("diff-%s-%d-%d", kind, seed, time.Now().UnixNano()) // fresh keys on every run
	keys := []string{prefix + "-a", prefix + "-b", prefix + "-we}ird", ""}
	keys[3] = prefix + "-{c}"
	type params struct {
		kind                   algo.Kind
		limit, windowMs, burst uint32
	}
	// Each rule has its own algorithm, so one caller key's deltas span several scripts.
	rulesP := map[string]params{
		"r1":  {kind, 20, 1000, 0},
		"r2":  {(kind + 1) % algo.Kind(numKinds), 50, 10_000, 80},
		"r:3": {(kind + 3) % algo.Kind(numKinds), 7, 2000, 3},
	}
	ruleIDs := []string{"r1", "r2", "r:3"}
	nodes := []string{"n1", "n2", "n:3"}
	seqs := map[string]uint64{}
	local := map[string]int64{} // node|bucket -> lease the node believes it holds
	var history []wire.Batch
	*clock = 1_700_000_000_000_000 + int64(rng.IntN(1_000_000))
	var replays, grants, reclaims, refusals, penalties, overshoots int

	for step := 0; step < 150; step++ {
		var b wire.Batch
		if len(history) > 0 && rng.IntN(8) == 0 {
			b = history[rng.IntN(len(history))] // a retried (or late duplicate) batch
		} else {
			b.Node = nodes[rng.IntN(len(nodes))]
			b.Worker = uint32(rng.IntN(2))
			id := fmt.Sprint(b.Node, "/", b.Worker)
			seqs[id] += uint64(1 + rng.IntN(3))
			b.Seq = seqs[id]
			used := map[string]bool{}
			for n := 1 + rng.IntN(4); n > 0; n-- {
				key, rl := keys[rng.IntN(len(keys))], ruleIDs[rng.IntN(len(ruleIDs))]
				win := uint8(rng.IntN(2))
				bk := BucketKey(key, rl, win)
				if used[bk] {
					continue
				}
				used[bk] = true
				p := rulesP[rl]
				d := wire.Delta{Key: key, Rule: rl, Window: win, Algo: uint8(p.kind), Limit: p.limit, WindowMs: p.windowMs * uint32(win+1), Burst: p.burst}
				lk := b.Node + "|" + bk
				if l := local[lk]; l > 0 {
					d.Leased = uint32(rng.Int64N(l + 1))
					local[lk] -= int64(d.Leased)
					if rng.IntN(6) == 0 {
						d.Returned = uint32(local[lk])
						local[lk] = 0
					}
				}
				if rng.IntN(2) == 0 {
					d.Over = uint32(rng.IntN(int(p.limit)/2 + 1))
				}
				d.Rejected = uint32(rng.IntN(4))
				if rng.IntN(12) == 0 {
					d.Early = 1
				}
				if rng.IntN(10) == 0 {
					d.Flags |= wire.FlagStrict
				}
				if rng.IntN(15) == 0 {
					d.Flags |= wire.FlagNew
				}
				if rng.IntN(8) == 0 {
					d.Flags |= wire.FlagDegraded
				}
				b.Deltas = append(b.Deltas, d)
			}
			if step%40 == 39 {
				// A large batch: several script calls per algorithm (maxPerCall).
				for i := 0; i < 3*maxPerCall; i++ {
					d := wire.Delta{Key: fmt.Sprint(prefix, "-bulk-", step, "-", i), Rule: "r1", Algo: uint8(kind), Limit: 20, WindowMs: 1000, Over: uint32(i % 25)}
					b.Deltas = append(b.Deltas, d)
				}
			}
			history = append(history, b)
		}
		switch rng.IntN(25) {
		case 0:
			*clock += cfg.LeaseTTLUs + int64(rng.IntN(2_000_000)) // a silence: leases expire
		default:
			*clock += int64(rng.IntN(400_000))
		}
		now := *clock
		out, err := s.Apply(ctx, &b)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		_, clustered := s.rdb.(*redis.ClusterClient)
		want := tw.apply(&b, now, cfg, clustered)
		for i := range b.Deltas {
			if out.Results[i] != want[i] {
				t.Fatalf("step %d delta %d (%+v):\nlua %+v\ngo  %+v", step, i, b.Deltas[i], out.Results[i], want[i])
			}
			r := &want[i]
			replays += b2i(r.Replay)
			grants += b2i(!r.Replay && r.Grant > 0)
			reclaims += b2i(r.Reclaimed > 0)
			refusals += b2i(!r.Allowed)
			penalties += b2i(r.Level > 1)
			overshoots += b2i(r.Overshoot > 0)
			if !want[i].Replay && want[i].Grant > 0 {
				local[b.Node+"|"+BucketKey(b.Deltas[i].Key, b.Deltas[i].Rule, b.Deltas[i].Window)] += want[i].Grant
			}
		}
		if out.ServerTimeUs != now {
			t.Fatalf("step %d: server time %d, clock %d", step, out.ServerTimeUs, now)
		}
		compareStored(t, s, tw, &b, step)
	}
	// The sequence must have exercised every branch worth comparing.
	for name, n := range map[string]int{"replays": replays, "grants": grants, "reclaims": reclaims, "strict refusals": refusals, "penalty levels > 1": penalties, "overshoots": overshoots} {
		if n == 0 {
			t.Errorf("no %s in the random sequence: the comparison did not cover them", name)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// compareStored checks every key the batch touched against the twin.
func compareStored(t *testing.T, s *Store, tw *twin, b *wire.Batch, step int) {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	for i := range b.Deltas {
		d := &b.Deltas[i]
		for _, k := range []string{BucketKey(d.Key, d.Rule, d.Window), PenaltyKey(d.Key)} {
			if seen[k] {
				continue
			}
			seen[k] = true
			got, err := s.rdb.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]string
			if bu := tw.buckets[k]; bu != nil {
				want = bu.Fields()
			} else {
				want = tw.pens[k].Fields()
			}
			if !maps.Equal(got, want) {
				t.Fatalf("step %d: key %q differs:\nredis %v\ngo    %v", step, k, sorted(got), sorted(want))
			}
		}
	}
}

func sorted(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(out)
	return out
}
