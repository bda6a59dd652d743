package store

import (
	"context"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// usageStore is a store on a server of its own: tg:params and the command statistics
// are server-wide.
func usageStore(t *testing.T) (*Store, *int64) {
	t.Helper()
	srv := redistest.StartStandalone(t)
	s, err := Open(Config{Addrs: srv.Addrs(), Lease: testLease}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	now := t0
	s.SetTestClock(func() int64 { return now })
	return s, &now
}

// usageDeltas are the buckets one caller key has: two windows of one rule, a tier, and
// a rule of another algorithm.
func usageDeltas(key string) []wire.Delta {
	a := mkDelta(algo.TokenBucket, key, "api")
	a1 := mkDelta(algo.FixedWindow, key, "api")
	a1.Window, a1.WindowMs, a1.Limit = 1, 3_600_000, 1000
	pro := mkDelta(algo.GCRA, key, "api")
	pro.Tier, pro.Limit = "pro", 500
	up := mkDelta(algo.SlidingWindowCounter, key, "upload")
	up.Limit = 10
	ds := []wire.Delta{a, a1, pro, up}
	for i := range ds {
		ds[i].Over, ds[i].ElapsedMs = 4, 100
	}
	ds[3].Over, ds[3].Rejected, ds[3].Early = 10, 1, 1 // spent and early: a penalty
	return ds
}

// TestUsageAndReset: usage lists every bucket of a caller key with what the script
// stored, and reset deletes exactly those and the penalty; both name the keys from
// tg:params, never scanning the keyspace.
func TestUsageAndReset(t *testing.T) {
	s, _ := usageStore(t)
	ctx := context.Background()
	for _, key := range []string{"sk_live_a:b", "odd}key"} {
		t.Run(key, func(t *testing.T) {
			other := key + "-other" // the same buckets of another caller: untouched
			var applied *Outcome
			for _, k := range []string{key, other} {
				ds := usageDeltas(k)
				out, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: ds}, Options{Idempotent: true})
				if err != nil {
					t.Fatal(err)
				}
				if k == key {
					applied = out
				}
			}
			if err := s.rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			u, err := s.Usage(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			ds := usageDeltas(key)
			if len(u.Buckets) != len(ds) {
				t.Fatalf("%d buckets, want %d: %+v", len(u.Buckets), len(ds), u.Buckets)
			}
			for i, d := range ds {
				var got *BucketUsage
				for j := range u.Buckets {
					if u.Buckets[j].RedisKey == BucketKey(d.Key, d.Rule, d.Tier, d.Window) {
						got = &u.Buckets[j]
					}
				}
				if got == nil {
					t.Fatalf("no bucket %q in %+v", BucketKey(d.Key, d.Rule, d.Tier, d.Window), u.Buckets)
				}
				st, r := applied.States[i], applied.Results[i]
				want := BucketUsage{RedisKey: got.RedisKey, Rule: d.Rule, Tier: d.Tier, Window: int(d.Window), Algorithm: algo.Kind(d.Algo).String(),
					Limit: int64(d.Limit), WindowMs: int64(d.WindowMs), Burst: int64(d.Burst), Remaining: st.Remaining,
					Available: st.Remaining + r.Grant, ResetInMs: int64(st.ResetInMs), Outstanding: r.Grant}
				if *got != want {
					t.Errorf("bucket %d:\n got %+v\nwant %+v", i, *got, want)
				}
			}
			if u.Penalty.Level != 1 || u.Penalty.RemainingMs <= 0 {
				t.Errorf("penalty %+v, want level 1 cooling down", u.Penalty)
			}
			n, err := s.Reset(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len(ds))+1 {
				t.Fatalf("reset deleted %d keys, want %d buckets and the penalty", n, len(ds)+1)
			}
			if u, err := s.Usage(ctx, key); err != nil || len(u.Buckets) != 0 || u.Penalty.Level != 0 {
				t.Fatalf("after reset: %+v, %v", u, err)
			}
			if u, err := s.Usage(ctx, other); err != nil || len(u.Buckets) != len(ds) {
				t.Fatalf("the other caller after reset: %+v, %v", u, err)
			}
			info, err := s.rdb.InfoMap(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []string{"cmdstat_scan", "cmdstat_keys"} {
				if v, ok := info["Commandstats"][c]; ok {
					t.Errorf("usage and reset ran %s: %s", c, v)
				}
			}
		})
	}
}

// TestRefusedDeltaParams: tg:params records the parameters of buckets the store applied.
// A refused delta (parameters out of range, or a rule the service does not have) must
// not overwrite them: usage and reset would then read the caller's buckets with the
// wrong algorithm, or with none at all.
func TestRefusedDeltaParams(t *testing.T) {
	s, _ := usageStore(t)
	ctx := context.Background()
	good := mkDelta(algo.TokenBucket, uniq("params"), "api")
	good.Over = 4
	field := paramsField(good.Rule, good.Window, good.Tier)
	want := lease.FormatParams(lease.ParamsOf(&good))
	refuseGCRA := func(d *wire.Delta) string {
		if algo.Kind(d.Algo) == algo.GCRA {
			return "rule api is a token bucket here"
		}
		return ""
	}
	tests := []struct {
		name   string
		bad    func(wire.Delta) wire.Delta
		refuse func(*wire.Delta) string
	}{
		{"limit 0", func(d wire.Delta) wire.Delta { d.Limit = 0; return d }, nil},
		{"unknown algorithm", func(d wire.Delta) wire.Delta { d.Algo = 9; return d }, nil},
		{"Options.Refuse", func(d wire.Delta) wire.Delta { d.Algo = uint8(algo.GCRA); return d }, refuseGCRA},
	}
	if _, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{good}}, Options{Idempotent: true}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := tc.bad(good)
			bad.Key = uniq("params")
			// With an applied delta beside it: a batch refused as a whole writes nothing.
			other := mkDelta(algo.FixedWindow, bad.Key, "other")
			out, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{other, bad}}, Options{Idempotent: true, Refuse: tc.refuse})
			if err != nil || out.Refused != 1 {
				t.Fatalf("refused %d, %v: want the delta refused", out.Refused, err)
			}
			if got := s.rdb.HGet(ctx, paramsKey, field).Val(); got != want {
				t.Fatalf("tg:params %q = %q after a refused delta, want %q", field, got, want)
			}
			u, err := s.Usage(ctx, good.Key)
			if err != nil || len(u.Buckets) != 1 || u.Buckets[0].Algorithm != algo.TokenBucket.String() || u.Buckets[0].Limit != 100 {
				t.Fatalf("usage of the applied bucket: %+v, %v", u, err)
			}
		})
	}
}

// TestUsageReclaimedLeases: usage reports the leases the script would still count at
// the time of reading. A lease whose epoch (or window) has ended is reclaimed, even
// though no call has touched the bucket since to rewrite it.
func TestUsageReclaimedLeases(t *testing.T) {
	s, clock := usageStore(t)
	ctx := context.Background()
	epochUs := s.cfg.Lease.EpochMs * 1000
	tests := []struct {
		name    string
		kind    algo.Kind
		later   int64 // µs after the grant
		counted bool  // the grant is still outstanding
	}{
		{"token_bucket same epoch", algo.TokenBucket, 1000, true},
		{"token_bucket next epoch", algo.TokenBucket, epochUs, true},
		{"token_bucket two epochs on", algo.TokenBucket, 2 * epochUs, false},
		{"fixed_window next epoch", algo.FixedWindow, epochUs, true},
		{"fixed_window two epochs on", algo.FixedWindow, 2 * epochUs, false},
		{"fixed_window next window", algo.FixedWindow, 60_000_000, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			*clock = t0
			d := mkDelta(tc.kind, uniq("reclaim"), "api")
			d.Over, d.ElapsedMs = 4, 100
			out, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{d}}, Options{Idempotent: true})
			if err != nil {
				t.Fatal(err)
			}
			grant := out.Results[0].Grant
			if grant == 0 {
				t.Fatal("no lease granted")
			}
			*clock += tc.later
			u, err := s.Usage(ctx, d.Key)
			if err != nil || len(u.Buckets) != 1 {
				t.Fatalf("usage: %+v, %v", u, err)
			}
			got := u.Buckets[0]
			want := int64(0)
			if tc.counted {
				want = grant
			}
			if got.Outstanding != want || got.Remaining != got.Available-want {
				t.Fatalf("outstanding %d, remaining %d of %d available: want %d outstanding", got.Outstanding, got.Remaining, got.Available, want)
			}
		})
	}
}
