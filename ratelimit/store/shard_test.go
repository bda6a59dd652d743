package store

import (
	"context"
	"errors"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestShardErrors: a batch whose Redis node is gone fails with one ShardError naming
// its deltas (what the service logs per failing shard); a healthy one has none.
func TestShardErrors(t *testing.T) {
	srv := redistest.StartStandalone(t)
	s, err := Open(Config{Mode: Standalone, Addrs: srv.Addrs(), Lease: testLease}, &countingMetrics{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	batch := func(seq uint64) *wire.Batch {
		return &wire.Batch{Node: "gw-shard", Seq: seq, Deltas: []wire.Delta{
			{Key: "a", Rule: "r", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 1},
			{Key: "b", Rule: "r", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 1},
		}}
	}
	for _, tt := range []struct {
		name       string
		kill       bool
		wantShards int
	}{
		{"healthy", false, 0},
		{"node gone", true, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.kill {
				if err := srv.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			out, err := s.Apply(context.Background(), batch(uint64(2+tt.wantShards)), Options{Idempotent: true})
			if tt.wantShards == 0 {
				if err != nil || len(out.ShardErrors) != 0 {
					t.Fatalf("Apply: %v, shard errors %v", err, out.ShardErrors)
				}
				return
			}
			if !errors.Is(err, ErrUnavailable) || out == nil || len(out.ShardErrors) != tt.wantShards || out.ShardErrors[0].Deltas != 2 || out.ShardErrors[0].Err == nil {
				t.Fatalf("Apply: %v, outcome %+v", err, out)
			}
		})
	}
}
