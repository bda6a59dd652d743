package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

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
		{"limit 0", func(d wire.Delta) wire.Delta { d.Rule, d.Limit = "other", 0; return d }, nil, "limit 0 not in"},
		{"unknown algorithm", func(d wire.Delta) wire.Delta { d.Rule, d.Algo = "other", 9; return d }, nil, "unknown algorithm 9"},
		{"window 0", func(d wire.Delta) wire.Delta { d.Rule, d.WindowMs = "other", 0; return d }, nil, "window 0 µs"},
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
