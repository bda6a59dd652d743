package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

func fixedWindow(key, rule string, limit uint32) wire.Delta {
	return wire.Delta{Key: key, Rule: rule, Algo: uint8(algo.FixedWindow), Limit: limit, WindowMs: 3_600_000}
}

func TestValidate(t *testing.T) {
	ok := fixedWindow("k", "r", 10)
	tests := []struct {
		name  string
		batch wire.Batch
		want  string // substring of the error; "" for valid
	}{
		{"valid", wire.Batch{Node: "n", Deltas: []wire.Delta{ok}}, ""},
		{"empty batch", wire.Batch{Node: "n"}, ""},
		{"no node", wire.Batch{Deltas: []wire.Delta{ok}}, "node: empty"},
		{"empty key", wire.Batch{Node: "n", Deltas: []wire.Delta{fixedWindow("", "r", 10)}}, "delta[0].key: empty"},
		{"empty rule", wire.Batch{Node: "n", Deltas: []wire.Delta{fixedWindow("k", "", 10)}}, "delta[0].rule: empty"},
		{"zero limit", wire.Batch{Node: "n", Deltas: []wire.Delta{fixedWindow("k", "r", 0)}}, "limit 0"},
		{"unknown algorithm", wire.Batch{Node: "n", Deltas: []wire.Delta{{Key: "k", Rule: "r", Algo: 9, Limit: 1, WindowMs: 1000}}}, "unknown algorithm"},
		{"zero window", wire.Batch{Node: "n", Deltas: []wire.Delta{{Key: "k", Rule: "r", Limit: 1}}}, "window"},
		{"duplicate bucket", wire.Batch{Node: "n", Deltas: []wire.Delta{ok, ok}}, "appears twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(&tc.batch)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

func TestKeyLayout(t *testing.T) {
	tests := []struct{ key, rule string }{
		{"plain", "r"}, {"", "r"}, {"}", "r"}, {"a}b", "r"}, {"{x}", "r"}, {"a:b", "c"}, {"~abc", "r"},
	}
	seen := map[string]string{}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			bk, pk := BucketKey(tc.key, tc.rule, 3), PenaltyKey(tc.key)
			if redistest.Slot(bk) != redistest.Slot(pk) {
				t.Fatalf("bucket %q and penalty %q hash to different slots", bk, pk)
			}
			if prev, dup := seen[bk]; dup {
				t.Fatalf("%q and %q share bucket key %q", prev, tc.key, bk)
			}
			seen[bk] = tc.key
			if rule, w, ok := splitBucketKey(KeyPrefix(tc.key), bk); !ok || rule != tc.rule || w != 3 {
				t.Fatalf("splitBucketKey(%q) = %q, %d, %v", bk, rule, w, ok)
			}
		})
	}
}

func FuzzKeyPrefix(f *testing.F) {
	f.Add("k", "r", "k2")
	f.Add("}", "a:b", "")
	f.Add("a}b", "x", "a")
	f.Fuzz(func(t *testing.T, k1, rule, k2 string) {
		if strings.Contains(rule, "}") {
			return // rule ids are validated by shared/rule and never contain '}'
		}
		b1, p1 := BucketKey(k1, rule, 0), PenaltyKey(k1)
		if redistest.Slot(b1) != redistest.Slot(p1) {
			t.Fatalf("key %q: bucket and penalty in different slots", k1)
		}
		if k1 != k2 && BucketKey(k2, rule, 0) == b1 {
			t.Fatalf("keys %q and %q collide", k1, k2)
		}
	})
}

// TestIdempotentBatch: the same batch twice is applied once and answered the same.
func TestIdempotentBatch(t *testing.T) {
	for _, mode := range []Mode{Standalone, Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			s, _ := newStore(t, mode, nil)
			ctx := context.Background()
			key := fmt.Sprint("idem-", rand.Uint64())
			b := wire.Batch{Node: "n1", Worker: 1, Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{fixedWindow(key, "r", 100), fixedWindow(key+"x", "r", 100)}}
			b.Deltas[0].Over, b.Deltas[1].Over = 30, 5
			first, err := s.Apply(ctx, &b)
			if err != nil {
				t.Fatal(err)
			}
			second, err := s.Apply(ctx, &b)
			if err != nil {
				t.Fatal(err)
			}
			for i := range b.Deltas {
				f, g := first.States[i], second.States[i]
				if f.Lease == 0 || f.Lease != g.Lease || f.LeaseHeld != g.LeaseHeld || f.Remaining != g.Remaining {
					t.Fatalf("delta %d: first %+v, retry %+v", i, f, g)
				}
				if !second.Results[i].Replay {
					t.Fatalf("delta %d applied twice", i)
				}
			}
			if got := first.States[0].Remaining + int64(first.States[0].LeaseHeld); got != 70 {
				t.Fatalf("remaining+held = %d, want 100-30", got)
			}
		})
	}
}

// TestNoScriptRecovery: scripts flushed from the server (restart, or failover to a
// replica that never loaded them) are loaded again inside a pipelined batch.
func TestNoScriptRecovery(t *testing.T) {
	for _, mode := range []Mode{Standalone, Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			s, m := newStore(t, mode, nil)
			ctx := context.Background()
			flush := func() {
				var err error
				if cc, ok := s.rdb.(*redis.ClusterClient); ok {
					err = cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() })
				} else {
					err = s.rdb.ScriptFlush(ctx).Err()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			flush()
			b := wire.Batch{Node: "n", Seq: 1}
			for i := 0; i < 50; i++ {
				d := fixedWindow(fmt.Sprint("noscript-", i, "-", rand.Uint64()), "r", 10)
				d.Algo = uint8(i % numKinds)
				d.WindowMs = 1000
				d.Over = 1
				b.Deltas = append(b.Deltas, d)
			}
			if _, err := s.Apply(ctx, &b); err != nil {
				t.Fatalf("batch after SCRIPT FLUSH: %v", err)
			}
			if m.reloads.Load() == 0 {
				t.Fatal("no script reload counted")
			}
		})
	}
}

// TestClusterBatchSpansSlots: one batch over many slots (all three shards) works with
// no CROSSSLOT, and each key is where its slot says.
func TestClusterBatchSpansSlots(t *testing.T) {
	s, _ := newStore(t, Cluster, nil)
	ctx := context.Background()
	b := wire.Batch{Node: "n", Seq: 1}
	slots := map[int]bool{}
	for i := 0; i < 1000; i++ {
		key := fmt.Sprint("span-", i, "-", rand.Uint32())
		d := fixedWindow(key, "r", 1000)
		d.Over = uint32(i%7 + 1)
		b.Deltas = append(b.Deltas, d)
		slots[redistest.Slot(BucketKey(key, "r", 0))] = true
	}
	out, err := s.Apply(ctx, &b)
	if err != nil {
		t.Fatal(err)
	}
	if len(slots) < 500 {
		t.Fatalf("only %d slots covered", len(slots))
	}
	for i, st := range out.States {
		if got := st.Remaining + int64(st.LeaseHeld); got != 1000-int64(b.Deltas[i].Over) {
			t.Fatalf("delta %d: remaining %d + held %d, want %d", i, st.Remaining, st.LeaseHeld, 1000-b.Deltas[i].Over)
		}
	}
}

// TestConcurrentSync: many goroutines (4 nodes × 3 workers) sync one bucket at once,
// spending their leases; leases never exceed the bucket and the accounting identity
// holds at the end: permits taken == Σ(Leased+Over) + Σ outstanding.
func TestConcurrentSync(t *testing.T) {
	for _, mode := range []Mode{Standalone, Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			s, _ := newStore(t, mode, nil)
			// A clock that moves 1 ms per batch from the start of an hour: the fixed window
			// cannot roll under the test and leases cannot expire, so Available is
			// exactly limit − net permits taken.
			var clock atomic.Int64
			clock.Store(time.Now().UnixMicro()/3_600_000_000*3_600_000_000 + 1)
			s.nowUs = func() int64 { return clock.Add(1000) }
			ctx := context.Background()
			key := fmt.Sprint("conc-", rand.Uint64())
			const limit = 100_000
			var mu sync.Mutex
			local := map[string]int64{}
			var reported int64
			var wg sync.WaitGroup
			errs := make(chan error, 12)
			for n := 0; n < 4; n++ {
				for w := 0; w < 3; w++ {
					wg.Add(1)
					go func(node string, worker uint32) {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(n), uint64(w)))
						for seq := uint64(1); seq <= 40; seq++ {
							d := fixedWindow(key, "r", limit)
							mu.Lock()
							d.Leased = uint32(min(local[node], rng.Int64N(50)))
							local[node] -= int64(d.Leased)
							mu.Unlock()
							d.Over = uint32(rng.IntN(30))
							b := wire.Batch{Node: node, Worker: worker, Seq: seq, Deltas: []wire.Delta{d}}
							out, err := s.Apply(ctx, &b)
							if err != nil {
								errs <- err
								return
							}
							st := out.States[0]
							if int64(st.LeaseHeld) > limit {
								errs <- fmt.Errorf("node %s holds %d of a %d bucket", node, st.LeaseHeld, limit)
								return
							}
							mu.Lock()
							local[node] += int64(st.Lease)
							reported += int64(d.Leased) + int64(d.Over)
							mu.Unlock()
						}
					}(fmt.Sprint("node-", n), uint32(w))
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			fields, err := s.rdb.HGetAll(ctx, BucketKey(key, "r", 0)).Result()
			if err != nil {
				t.Fatal(err)
			}
			bu, ignored := lease.ParseBucket(fields)
			if ignored != 0 {
				t.Fatalf("%d unknown fields in %v", ignored, fields)
			}
			taken := limit - algo.Available(bu.Params, bu.State, clock.Load())
			if out := bu.Outstanding(); taken != reported+out || out > limit {
				t.Fatalf("taken %d, reported %d + outstanding %d (limit %d)", taken, reported, out, limit)
			}
			var held int64
			for n, l := range local {
				if l != bu.Nodes[n].Outstanding {
					t.Fatalf("node %s believes it holds %d, Redis says %d", n, l, bu.Nodes[n].Outstanding)
				}
				held += l
			}
			if held == 0 || reported == 0 {
				t.Fatalf("test did nothing: held %d, reported %d", held, reported)
			}
		})
	}
}

// TestLateDeltasAfterOutage: consumption a gateway admitted while Redis was down is
// charged when it finally gets through, including to a restarted (empty) server whose
// script cache is empty.
func TestLateDeltasAfterOutage(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := Config{Addrs: srv.Addrs(), Lease: testLease, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond}
	m := &countingMetrics{}
	s, err := Open(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	d := fixedWindow("late", "r", 100)
	d.Over = 10
	b := wire.Batch{Node: "n", Seq: 1, Deltas: []wire.Delta{d}}
	if _, err := s.Apply(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	// The gateway keeps admitting on its own and resends a batch carrying all of it.
	b.Seq, b.Deltas[0].Over = 2, 40
	budget := time.Duration(s.cfg.MaxRetries+1) * s.cfg.AttemptBudget()
	actx, cancel := context.WithTimeout(ctx, budget)
	_, err = s.Apply(actx, &b)
	cancel()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("apply with Redis down: %v, want ErrUnavailable", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	out, err := s.Apply(ctx, &b)
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got := out.States[0].Remaining + int64(out.States[0].LeaseHeld); got != 60 {
		t.Fatalf("restarted bucket: remaining+held %d, want 100-40", got)
	}
	if m.reloads.Load() == 0 {
		t.Fatal("restarted server needed no script reload?")
	}
}

// TestMemoryPerBucket logs MEMORY USAGE of one bucket per algorithm, synced by one node
// with one worker and by 4 nodes × 2 workers (the hash grows with the fleet).
func TestMemoryPerBucket(t *testing.T) {
	s, _ := newStore(t, Standalone, nil)
	ctx := context.Background()
	for k := 0; k < numKinds; k++ {
		kind := algo.Kind(k)
		for _, fleet := range []struct{ nodes, workers int }{{1, 1}, {4, 2}} {
			key := fmt.Sprint("mem-", kind, "-", fleet.nodes, "-", rand.Uint32())
			seq := uint64(0)
			for n := 0; n < fleet.nodes; n++ {
				for w := 0; w < fleet.workers; w++ {
					seq++
					d := wire.Delta{Key: key, Rule: "api", Algo: uint8(kind), Limit: 100, WindowMs: 60_000, Over: 3}
					b := wire.Batch{Node: fmt.Sprint("gw-", n, ".example"), Worker: uint32(w), Seq: uint64(time.Now().UnixMicro()) + seq, Deltas: []wire.Delta{d}}
					if _, err := s.Apply(ctx, &b); err != nil {
						t.Fatal(err)
					}
				}
			}
			n, err := s.MemoryUsage(ctx, key, "api", 0)
			if err != nil {
				t.Fatal(err)
			}
			if n <= 0 {
				t.Fatalf("MEMORY USAGE %d", n)
			}
			t.Logf("%-24s %d node(s) × %d worker(s): %d bytes", kind, fleet.nodes, fleet.workers, n)
		}
	}
}

// TestSentinel: the store finds the primary through a Sentinel.
func TestSentinel(t *testing.T) {
	sen, err := redistest.LaunchSentinel(standalone.Addr(), "tollgate", redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sen.Stop()
	s, _ := newStore(t, Sentinel, func(c *Config) { c.Addrs, c.MasterName = sen.Addrs(), "tollgate" })
	d := fixedWindow(fmt.Sprint("sentinel-", rand.Uint64()), "r", 10)
	d.Over = 4
	out, err := s.Apply(context.Background(), &wire.Batch{Node: "n", Seq: 1, Deltas: []wire.Delta{d}})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.States[0].Remaining + int64(out.States[0].LeaseHeld); got != 6 {
		t.Fatalf("remaining+held %d, want 6", got)
	}
}

// TestFleetSize: gateways seen by any instance count in Reply.Nodes of every instance.
func TestFleetSize(t *testing.T) {
	srv := redistest.StartStandalone(t)
	open := func() *Store {
		s, err := Open(Config{Addrs: srv.Addrs(), Lease: testLease}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	ctx := context.Background()
	apply := func(s *Store, node string) uint32 {
		out, err := s.Apply(ctx, &wire.Batch{Node: node, Seq: 1})
		if err != nil {
			t.Fatal(err)
		}
		return out.Nodes
	}
	for i := 0; i < 3; i++ {
		apply(a, fmt.Sprint("gw-", i))
	}
	if n := apply(a, "gw-0"); n != 3 {
		t.Fatalf("instance a counts %d nodes after hearing from 3", n)
	}
	// b hears only from gw-9 but learns the others from rl:nodes. Each instance records
	// and reads the set at most once a second, in the background: bounded wait.
	deadline := time.Now().Add(10 * time.Second)
	for {
		apply(a, "gw-0")
		if n := apply(b, "gw-9"); n == 4 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("instance b counts %d nodes, want 4", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
