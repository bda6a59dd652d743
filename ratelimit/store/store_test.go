package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// t0 is the virtual clock's start: the first microsecond of a minute, so a fixed window
// of a minute or less cannot roll over under a test that advances the clock by less.
const t0 = int64(1_700_000_040_000_000)

// modes are the deployments every mode-independent test runs on.
var modes = []Mode{Standalone, Cluster}

// uniq returns a caller key no other test (or earlier run on a reused server) uses.
func uniq(prefix string) string { return fmt.Sprint(prefix, "-", rand.Uint64()) }

// mkDelta is a delta reporting nothing yet on (key, rule) with a limit of 100 per minute.
func mkDelta(kind algo.Kind, key, rule string) wire.Delta {
	if kind == algo.Calendar {
		p := algo.CalendarParams(100, algo.Day, 0)
		return wire.Delta{Key: key, Rule: rule, Algo: uint8(kind), Limit: 100, WindowMs: uint32(p.WindowUs / 1000), Burst: uint32(p.Burst)}
	}
	return wire.Delta{Key: key, Rule: rule, Algo: uint8(kind), Limit: 100, WindowMs: 60_000}
}

// clockedStore is a store whose scripts read a virtual clock starting at t0.
func clockedStore(t testing.TB, mode Mode, tweak func(*Config)) (*Store, *int64) {
	t.Helper()
	s, _ := newStore(t, mode, tweak)
	now := t0
	s.SetTestClock(func() int64 { return now })
	return s, &now
}

// stored reads a bucket as the script left it.
func stored(t testing.TB, s *Store, d *wire.Delta) lease.Bucket {
	t.Helper()
	v, err := s.rdb.Get(context.Background(), BucketKey(d.Key, d.Rule, d.Tier, d.Window)).Bytes()
	if err != nil {
		t.Fatalf("GET bucket of %q/%q: %v", d.Key, d.Rule, err)
	}
	return lease.ParseValue(v)
}

// consumed is what the stored algorithm state says was taken from a fixed-window bucket.
func consumed(t testing.TB, s *Store, d *wire.Delta, now int64) int64 {
	t.Helper()
	return lease.ParamsOf(d).Capacity() - algo.Available(lease.ParamsOf(d), stored(t, s, d).State, now)
}

// TestRefusals: a delta the store cannot apply is answered StateRefused with its reason
// and writes nothing, and the rest of its batch is applied as if it were alone.
func TestRefusals(t *testing.T) {
	refuseBanned := func(d *wire.Delta) string {
		if d.Rule == "banned" {
			return "unknown rule \"banned\""
		}
		return ""
	}
	tests := []struct {
		name   string
		bad    func(good wire.Delta) wire.Delta
		refuse func(*wire.Delta) string
		want   string // substring of the reason
	}{
		{"empty key", func(d wire.Delta) wire.Delta { d.Key = ""; return d }, nil, "key: empty"},
		{"empty rule", func(d wire.Delta) wire.Delta { d.Rule = ""; return d }, nil, "rule: empty"},
		{"limit 0", func(d wire.Delta) wire.Delta { d.Rule, d.Limit = "other", 0; return d }, nil, "limit: must be in [1, "},
		{"unknown algorithm", func(d wire.Delta) wire.Delta { d.Rule, d.Algo = "other", 9; return d }, nil, "unknown algorithm 9"},
		{"window 0", func(d wire.Delta) wire.Delta { d.Rule, d.WindowMs = "other", 0; return d }, nil, "window: must be in [1000, "},
		{"more than one permit per µs", func(d wire.Delta) wire.Delta { d.Rule, d.Limit, d.WindowMs = "other", 1001, 1; return d }, nil, "more than one permit per µs"},
		{"bucket twice in the batch", func(d wire.Delta) wire.Delta { return d }, nil, "appears twice"},
		{"Options.Refuse", func(d wire.Delta) wire.Delta { d.Rule = "banned"; return d }, refuseBanned, "unknown rule"},
	}
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			s, clock := clockedStore(t, mode, nil)
			ctx := context.Background()
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					good := mkDelta(algo.FixedWindow, uniq("refusal"), "api")
					good.Over = 5
					bad := tc.bad(good)
					bad.Over = 7
					b := &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{good, bad}}
					out, err := s.Apply(ctx, b, Options{Idempotent: true, Refuse: tc.refuse})
					if err != nil {
						t.Fatal(err)
					}
					st := out.States[1]
					if st.Flags != wire.StateRefused || !strings.Contains(st.Reason, tc.want) {
						t.Fatalf("bad delta: flags %b reason %q, want refused with %q", st.Flags, st.Reason, tc.want)
					}
					if out.Refused != 1 || out.Results[1] != (lease.SyncResult{}) {
						t.Fatalf("refused %d, result %+v: want 1 refusal and no script result", out.Refused, out.Results[1])
					}
					if out.States[0].Flags&wire.StateRefused != 0 || out.Results[0].NowUs != *clock {
						t.Fatalf("good delta not applied: %+v", out.States[0])
					}
					// The good delta is charged once (a duplicate is not charged on top) and
					// a refused bucket of its own is not created.
					if got := consumed(t, s, &good, *clock); got != 5 {
						t.Fatalf("good bucket consumed %d, want 5", got)
					}
					if bk := BucketKey(bad.Key, bad.Rule, bad.Tier, bad.Window); bad.Rule != good.Rule {
						if n := s.rdb.Exists(ctx, bk).Val(); n != 0 {
							t.Fatalf("refused delta wrote %q", bk)
						}
					}
				})
			}
		})
	}
}

// TestBatchShape: a batch without a node cannot be made idempotent and is invalid as a
// whole; an empty batch is a heartbeat (the gateway counts in the fleet and learns its
// size).
func TestBatchShape(t *testing.T) {
	s, _ := clockedStore(t, Standalone, nil)
	ctx := context.Background()
	d := mkDelta(algo.TokenBucket, uniq("shape"), "api")
	tests := []struct {
		name    string
		batch   wire.Batch
		wantErr error
	}{
		{"no node", wire.Batch{Seq: 1, Deltas: []wire.Delta{d}}, ErrInvalid},
		{"no node, no deltas", wire.Batch{Seq: 1}, ErrInvalid},
		{"heartbeat", wire.Batch{Node: uniq("gw"), Seq: 1}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := s.Apply(ctx, &tc.batch, Options{Idempotent: true})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				if n := s.rdb.Exists(ctx, BucketKey(d.Key, d.Rule, d.Tier, d.Window)).Val(); n != 0 {
					t.Fatal("an invalid batch was applied")
				}
				return
			}
			if len(out.States) != 0 || out.Nodes < 1 {
				t.Fatalf("heartbeat: %d states, fleet %d", len(out.States), out.Nodes)
			}
		})
	}
}

// TestKeyNames pins the key layout of RATIONALE.md §5: the caller key is the hash tag,
// except where it would end the tag early or leave it empty.
func TestKeyNames(t *testing.T) {
	hashed := func(key string) string {
		return "tg:{~" + strconv.FormatUint(xxhash.Sum64String(key), 16) + "}" + strconv.Itoa(len(key)) + ":" + key
	}
	tests := []struct {
		name, key, rule, tier string
		window                uint8
		bucket, penalty       string
	}{
		{"plain", "sk_live_1", "api", "", 0, "tg:{sk_live_1}:api:0", "tg:{sk_live_1}:p"},
		{"tier and window", "sk_live_1", "api", "pro", 2, "tg:{sk_live_1}:api:2:pro", "tg:{sk_live_1}:p"},
		{"colons", "10.0.0.1:443", "r:1", "", 1, "tg:{10.0.0.1:443}:r:1:1", "tg:{10.0.0.1:443}:p"},
		{"opening brace", "a{b", "api", "", 0, "tg:{a{b}:api:0", "tg:{a{b}:p"},
		{"closing brace", "a}b", "api", "", 0, hashed("a}b") + ":api:0", hashed("a}b") + ":p"},
		{"braced", "{x}", "api", "", 0, hashed("{x}") + ":api:0", hashed("{x}") + ":p"},
		{"empty", "", "api", "", 0, hashed("") + ":api:0", hashed("") + ":p"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := BucketKey(tc.key, tc.rule, tc.tier, tc.window); got != tc.bucket {
				t.Errorf("BucketKey = %q, want %q", got, tc.bucket)
			}
			if got := PenaltyKey(tc.key); got != tc.penalty {
				t.Errorf("PenaltyKey = %q, want %q", got, tc.penalty)
			}
		})
	}
}

// TestKeysInRedis applies a batch for awkward caller keys and reads back what Redis
// holds: the exact key names, bucket and penalty in one slot (as Redis computes it), the
// gateway's idempotency record on the lowest slot of each node it touched, and a TTL on
// every key the sync writes.
func TestKeysInRedis(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			s, _ := clockedStore(t, mode, nil)
			ctx := context.Background()
			node := uniq("gw:layout")
			base := uniq("layout")
			var keys []string
			for _, k := range []string{"", ":a:b", "{c}", "d}", "e{", "{f"} {
				keys = append(keys, base+k)
			}
			for i := 0; i < 20; i++ { // enough keys that every cluster primary gets some
				keys = append(keys, fmt.Sprint(base, "-", i))
			}
			b := &wire.Batch{Node: node, Seq: 7}
			for _, k := range keys {
				d := mkDelta(algo.FixedWindow, k, "r:1")
				d.Tier, d.Window = "pro", 1
				d.Over, d.Rejected, d.Early = 100, 1, 1 // spent and early: a penalty record
				b.Deltas = append(b.Deltas, d)
			}
			out, err := s.Apply(ctx, b, Options{Idempotent: true})
			if err != nil {
				t.Fatal(err)
			}
			for i, k := range keys {
				if out.States[i].PenaltyLevel != 1 {
					t.Fatalf("key %q: penalty level %d, want 1", k, out.States[i].PenaltyLevel)
				}
				bk, pk := BucketKey(k, "r:1", "pro", 1), PenaltyKey(k)
				for _, name := range []string{bk, pk} {
					if ttl := s.rdb.PTTL(ctx, name).Val(); ttl <= 0 {
						t.Fatalf("%q: PTTL %v, want a TTL", name, ttl)
					}
				}
				if mode == Cluster {
					a, b := s.rdb.ClusterKeySlot(ctx, bk).Val(), s.rdb.ClusterKeySlot(ctx, pk).Val()
					if a != b {
						t.Fatalf("key %q: bucket in slot %d, penalty in slot %d", k, a, b)
					}
				}
			}
			// The idempotency record: one per node served, on that node's lowest slot.
			lowest := map[string]int{"": 0} // standalone: slot 0
			if mode == Cluster {
				lowest = map[string]int{}
				slots, err := s.rdb.ClusterSlots(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, sl := range slots {
					a := sl.Nodes[0].Addr
					if f, ok := lowest[a]; !ok || sl.Start < f {
						lowest[a] = sl.Start
					}
				}
			}
			if len(lowest) != map[Mode]int{Standalone: 1, Cluster: 3}[mode] {
				t.Fatalf("%d primaries", len(lowest))
			}
			for addr, slot := range lowest {
				rk := idemKey(slot, node)
				if mode == Cluster {
					if got := s.rdb.ClusterKeySlot(ctx, rk).Val(); got != int64(slot) {
						t.Fatalf("record %q in slot %d, want %d (lowest of %s)", rk, got, slot, addr)
					}
				}
				rec, err := s.rdb.HGet(ctx, rk, "0").Result()
				if err != nil || !strings.HasPrefix(rec, "7|") {
					t.Fatalf("record %q field 0: %q, %v; want seq 7", rk, rec, err)
				}
				if ttl := s.rdb.PTTL(ctx, rk).Val(); ttl <= 0 || ttl > s.cfg.IdempotencyTTL {
					t.Fatalf("record %q: PTTL %v, want (0, %v]", rk, ttl, s.cfg.IdempotencyTTL)
				}
			}
		})
	}
}

// TestReturnedLease: a lease given back stops counting at once, and the bucket value
// drops its lease header when nothing is leased out and the demand counted with the
// lease has aged out (two epochs): an idle bucket costs the algorithm state alone.
func TestReturnedLease(t *testing.T) {
	s, clock := clockedStore(t, Standalone, nil)
	ctx := context.Background()
	epochUs := s.cfg.Lease.EpochMs * 1000
	for k := 0; k < numKinds; k++ {
		kind := algo.Kind(k)
		t.Run(kind.String(), func(t *testing.T) {
			*clock = t0
			node := uniq("gw")
			d := mkDelta(kind, uniq("returned"), "api")
			d.Over, d.ElapsedMs = 3, 100
			apply := func(seq uint64, d wire.Delta) wire.State {
				t.Helper()
				out, err := s.Apply(ctx, &wire.Batch{Node: node, Seq: seq, Deltas: []wire.Delta{d}}, Options{Idempotent: true})
				if err != nil {
					t.Fatal(err)
				}
				return out.States[0]
			}
			st := apply(1, d)
			if st.Lease == 0 {
				t.Fatalf("no lease granted: %+v", st)
			}
			*clock += 1000
			ret := mkDelta(kind, d.Key, d.Rule)
			ret.Returned, ret.Epoch, ret.ElapsedMs = st.Lease, st.Epoch, 1
			st2 := apply(2, ret)
			bu := stored(t, s, &d)
			if bu.Leases.Outstanding() != 0 || st2.Held != 0 || st2.Lease != 0 {
				t.Fatalf("after the return: outstanding %d, reply %+v", bu.Leases.Outstanding(), st2)
			}
			if want := algo.Available(lease.ParamsOf(&d), bu.State, *clock); st2.Remaining != want {
				t.Fatalf("remaining %d with nothing leased out, want the state's %d", st2.Remaining, want)
			}
			*clock += 2 * epochUs
			idle := mkDelta(kind, d.Key, d.Rule)
			apply(3, idle)
			v, err := s.rdb.Get(ctx, BucketKey(d.Key, d.Rule, d.Tier, d.Window)).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			if len(v) > 0 && v[0] == 0x21 {
				t.Fatalf("idle bucket still carries a lease header: %x", v)
			}
		})
	}
}

// snapshot is DUMP and absolute expiry of every key a test watches: a replay must leave
// both exactly as they were (a rewrite of the same bytes would still move the expiry).
func snapshot(t testing.TB, s *Store, keys []string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range keys {
		dump, err := s.rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("DUMP %q: %v", k, err)
		}
		exp, err := s.rdb.PExpireTime(ctx, k).Result()
		if err != nil {
			t.Fatalf("PEXPIRETIME %q: %v", k, err)
		}
		out[k] = fmt.Sprintf("%x@%d", dump, exp)
	}
	return out
}

// idemKeys lists the gateway's idempotency records a batch can touch: one per Redis
// node, at the node's lowest slot.
func idemKeys(t testing.TB, s *Store, node string) []string {
	t.Helper()
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return []string{idemKey(0, node)}
	}
	tab, err := s.slots.get(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, slot := range tab.first {
		out = append(out, idemKey(slot, node))
	}
	return out
}

// TestReplay: a batch sent again with the same (node, seq) — its reply was lost — is
// answered with the lease fields of the first application at the first server time, and
// changes no key; an older seq is a replay that hands over nothing. Either way each
// bucket holds the first grant once, not twice.
func TestReplay(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			s, clock := clockedStore(t, mode, nil)
			ctx := context.Background()
			node := uniq("gw")
			b := &wire.Batch{Node: node, Seq: 10}
			for i := 0; i < 30; i++ {
				d := mkDelta(algo.Kind(i%numKinds), uniq("replay"), "api")
				d.Over, d.ElapsedMs = 3, 100
				if i%3 == 0 {
					d.Over, d.Rejected, d.Early = 100, 1, 1 // a penalty record too
				}
				b.Deltas = append(b.Deltas, d)
			}
			first, err := s.Apply(ctx, b, Options{Idempotent: true})
			if err != nil {
				t.Fatal(err)
			}
			keys := idemKeys(t, s, node)
			for _, d := range b.Deltas {
				keys = append(keys, BucketKey(d.Key, d.Rule, d.Tier, d.Window))
				if d.Early > 0 {
					keys = append(keys, PenaltyKey(d.Key))
				}
			}
			before := snapshot(t, s, keys)
			grants := 0
			for i := range b.Deltas {
				grants += int(first.States[i].Lease)
			}
			if grants == 0 {
				t.Fatal("no grant to hand over")
			}
			tests := []struct {
				name  string
				seq   uint64
				grant bool // the recorded lease fields are answered
			}{
				{"same seq", 10, true},
				{"same seq again", 10, true},
				{"older seq", 9, false},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					*clock += 300_000 // a retry comes later, in the same epoch
					rb := *b
					rb.Seq = tc.seq
					out, err := s.Apply(ctx, &rb, Options{Idempotent: true})
					if err != nil {
						t.Fatal(err)
					}
					for i := range b.Deltas {
						f, r := first.Results[i], out.Results[i]
						want := lease.SyncResult{Replay: true, Allowed: true, NowUs: f.NowUs}
						if tc.grant {
							want.Grant, want.Held, want.Epoch, want.ValidUs, want.LowWater = f.Grant, f.Held, f.Epoch, f.ValidUs, f.LowWater
						}
						if r != want {
							t.Fatalf("delta %d:\n got %+v\nwant %+v", i, r, want)
						}
						if out.States[i].Flags&wire.StateReplay == 0 {
							t.Fatalf("delta %d: no StateReplay flag", i)
						}
					}
					if after := snapshot(t, s, keys); !maps.Equal(before, after) {
						for k := range before {
							if before[k] != after[k] {
								t.Errorf("%q changed:\n%s\n%s", k, before[k], after[k])
							}
						}
						t.FailNow()
					}
				})
			}
			for i, d := range b.Deltas {
				bu := stored(t, s, &d)
				if got, want := bu.Leases.Outstanding(), first.Results[i].Grant; got != want {
					t.Fatalf("delta %d: outstanding %d, want the one grant %d", i, got, want)
				}
			}
		})
	}
}

// flushScripts empties the script cache of every server (a restart, or a promoted
// replica that never loaded the script).
func flushScripts(t testing.TB, s *Store) {
	t.Helper()
	ctx := context.Background()
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

// TestNoScriptRecovery: after SCRIPT FLUSH the batch's calls answer NOSCRIPT; the store
// loads the script again and the same batch goes through, applied once.
func TestNoScriptRecovery(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			s, m := newStore(t, mode, nil)
			now := t0
			s.SetTestClock(func() int64 { return now })
			ctx := context.Background()
			for round := 0; round < 2; round++ { // twice: the second flush finds a loaded script again
				flushScripts(t, s)
				b := &wire.Batch{Node: uniq("gw"), Seq: 1}
				for i := 0; i < 250; i++ {
					d := mkDelta(algo.FixedWindow, uniq("noscript"), "api")
					d.Over = 2
					b.Deltas = append(b.Deltas, d)
				}
				reloads := m.reloads.Load()
				if _, err := s.Apply(ctx, b, Options{Idempotent: true}); err != nil {
					t.Fatalf("round %d: batch after SCRIPT FLUSH: %v", round, err)
				}
				if m.reloads.Load() == reloads {
					t.Fatalf("round %d: no script reload counted", round)
				}
				for i, d := range b.Deltas {
					if got := consumed(t, s, &d, now); got != 2 {
						t.Fatalf("round %d delta %d: consumed %d, want 2", round, i, got)
					}
				}
			}
		})
	}
}

// pipelineCounter counts, per server, the pipelines that carried script calls and the
// script calls in them: what went over the network, seen from the client.
type pipelineCounter struct {
	mu    sync.Mutex
	pipes map[string]int
	calls map[string]int
}

func (c *pipelineCounter) hook(addr string) redis.Hook { return counterHook{c, addr} }

type counterHook struct {
	c    *pipelineCounter
	addr string
}

func (h counterHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h counterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h counterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if name := c.Name(); name == "evalsha" || name == "eval" {
				n++
			}
		}
		if n > 0 {
			h.c.mu.Lock()
			h.c.pipes[h.addr]++
			h.c.calls[h.addr] += n
			h.c.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// TestBatchCost: a batch of 1,000 deltas over more than 500 slots costs, on every Redis
// node, one round trip and ceil(n/100) script calls for its n deltas there (RATIONALE.md
// §5), counted by the servers (INFO commandstats) and by the client (pipelines sent).
func TestBatchCost(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			cfg := Config{Mode: mode, Lease: testLease, Addrs: standalone.Addrs()}
			if mode == Cluster {
				cfg.Addrs = cluster.Addrs()
			}
			rdb, err := NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			pc := &pipelineCounter{pipes: map[string]int{}, calls: map[string]int{}}
			var primaries []*redis.Client
			switch c := rdb.(type) {
			case *redis.ClusterClient:
				c.OnNewNode(func(n *redis.Client) { n.AddHook(pc.hook(n.Options().Addr)) })
				var mu sync.Mutex // ForEachMaster runs the function on every primary at once
				if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
					mu.Lock()
					defer mu.Unlock()
					primaries = append(primaries, redis.NewClient(&redis.Options{Addr: n.Options().Addr, DisableIdentity: true}))
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			case *redis.Client:
				c.AddHook(pc.hook(""))
				primaries = append(primaries, redis.NewClient(&redis.Options{Addr: cfg.Addrs[0], DisableIdentity: true}))
			}
			s, err := New(rdb, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			now := t0
			s.SetTestClock(func() int64 { return now })
			b := &wire.Batch{Node: uniq("gw"), Seq: 1}
			slots := map[int]bool{}
			perNode := map[string]int{}
			base := uniq("cost")
			for i := 0; i < 1000; i++ {
				d := mkDelta(algo.Kind(i%numKinds), fmt.Sprint(base, "-", i), "api")
				d.Over = 1
				b.Deltas = append(b.Deltas, d)
				slots[Slot(KeyPrefix(d.Key))] = true
				if mode == Cluster {
					perNode[primaryOf(t, s, KeyPrefix(d.Key))]++
				} else {
					perNode[cfg.Addrs[0]]++
				}
			}
			if mode == Cluster && len(slots) <= 500 {
				t.Fatalf("only %d slots", len(slots))
			}
			// The fleet's once-a-second refresh (a script call of its own) is not part of
			// a batch's cost: let a heartbeat start it and finish before counting.
			if _, err := s.Apply(ctx, &wire.Batch{Node: b.Node, Seq: 0}, Options{Idempotent: true}); err != nil {
				t.Fatal(err)
			}
			s.fleet.wg.Wait()
			for _, p := range primaries {
				defer p.Close()
				if err := p.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Apply(ctx, b, Options{Idempotent: true}); err != nil {
				t.Fatal(err)
			}
			for _, p := range primaries {
				addr := p.Options().Addr
				info, err := p.InfoMap(ctx, "commandstats").Result()
				if err != nil {
					t.Fatal(err)
				}
				stats := info["Commandstats"]
				want := (perNode[addr] + maxPerCall - 1) / maxPerCall
				got := 0
				if v, ok := stats["cmdstat_evalsha"]; ok {
					fmt.Sscanf(v, "calls=%d", &got)
				}
				if got != want || stats["cmdstat_eval"] != "" {
					t.Errorf("%s: %d deltas cost %d EVALSHA (eval: %q), want %d", addr, perNode[addr], got, stats["cmdstat_eval"], want)
				}
				hookAddr := addr
				if mode == Standalone {
					hookAddr = ""
				}
				pc.mu.Lock()
				if pc.pipes[hookAddr] != 1 || pc.calls[hookAddr] != want {
					t.Errorf("%s: %d pipelines carrying %d script calls, want 1 carrying %d", addr, pc.pipes[hookAddr], pc.calls[hookAddr], want)
				}
				pc.mu.Unlock()
				t.Logf("%s: %d deltas, %d EVALSHA in one round trip", addr, perNode[addr], got)
			}
		})
	}
}

// TestClockStepsBack: Redis's clock steps back across a lease-epoch boundary after a
// grant (a primary's clock corrected, or a failover to a replica whose clock is
// behind). The script compares epochs as signed differences: the lease is found in the
// epoch it was stored in, what the gateway used of it is charged, what it keeps is
// renewed and nothing is reclaimed.
func TestClockStepsBack(t *testing.T) {
	s, clock := clockedStore(t, Standalone, nil)
	ctx := context.Background()
	epochUs := s.cfg.Lease.EpochMs * 1000
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.FixedWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			node := uniq("gw")
			d := mkDelta(kind, uniq("stepback"), "api")
			d.Over, d.ElapsedMs = 4, 100
			*clock = t0 + epochUs + 1000
			out, err := s.Apply(ctx, &wire.Batch{Node: node, Seq: 1, Deltas: []wire.Delta{d}}, Options{Idempotent: true})
			if err != nil {
				t.Fatal(err)
			}
			r1 := out.Results[0]
			if r1.Grant < 4 {
				t.Fatalf("grant %d", r1.Grant)
			}
			later := *clock
			*clock = t0 + epochUs - 1000 // 2 ms back, into the epoch before
			rep := mkDelta(kind, d.Key, d.Rule)
			rep.Leased, rep.Held, rep.Epoch, rep.ElapsedMs = 2, uint32(r1.Grant-2), r1.Epoch, 100
			out, err = s.Apply(ctx, &wire.Batch{Node: node, Seq: 2, Deltas: []wire.Delta{rep}}, Options{Idempotent: true})
			if err != nil {
				t.Fatal(err)
			}
			r2 := out.Results[0]
			if r2.Reclaimed != 0 || r2.Held != r1.Grant-2 || r2.Epoch != r1.Epoch {
				t.Fatalf("after the step back: reclaimed %d, held %d (want %d), epoch %d (lease's %d)", r2.Reclaimed, r2.Held, r1.Grant-2, r2.Epoch, r1.Epoch)
			}
			bu := stored(t, s, &d)
			if got := bu.Leases.Outstanding(); got != r2.Held+r2.Grant {
				t.Fatalf("outstanding %d, want held %d + grant %d", got, r2.Held, r2.Grant)
			}
			if got := consumed(t, s, &d, later); got != 6 {
				t.Fatalf("charged %d, want 4 + 2", got)
			}
		})
	}
}
