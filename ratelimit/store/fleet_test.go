package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestSentinel: the store finds the primary through a Sentinel and applies batches there.
func TestSentinel(t *testing.T) {
	const name = "tollgate"
	sen, err := redistest.LaunchSentinel(standalone.Addr(), name, redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sen.Stop()
	s, _ := newStore(t, Sentinel, func(c *Config) { c.Addrs, c.MasterName = sen.Addrs(), name })
	now := t0
	s.SetTestClock(func() int64 { return now })
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	d := mkDelta(algo.FixedWindow, uniq("sentinel"), "api")
	d.Over = 4
	if _, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{d}}, Options{Idempotent: true}); err != nil {
		t.Fatal(err)
	}
	// Read back from the primary itself, not through the Sentinel client.
	direct, _ := newStore(t, Standalone, nil)
	if got := consumed(t, direct, &d, now); got != 4 {
		t.Fatalf("primary holds %d consumed, want 4", got)
	}
}

// TestFleetSize: the fleet size (tg:nodes) counts the gateways any service instance
// heard from, and forgets those silent for longer than FleetWindow.
func TestFleetSize(t *testing.T) {
	srv := redistest.StartStandalone(t) // tg:nodes is global: a server of its own
	// Longer than the refresh period (a second): each instance refreshes its gateways'
	// entries once a period, so a shorter window would drop live ones between refreshes.
	const window = 2 * time.Second
	open := func() *Store {
		s, err := Open(Config{Addrs: srv.Addrs(), Lease: testLease, FleetWindow: window}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	ctx := context.Background()
	heartbeat := func(s *Store, node string) uint32 {
		t.Helper()
		out, err := s.Apply(ctx, &wire.Batch{Node: node, Seq: uint64(time.Now().UnixMicro())}, Options{Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		return out.Nodes
	}
	// Each instance records and reads the set at most once a second, in the background:
	// the counts converge within a bounded wait.
	waitFor := func(what string, want uint32, beat func() (uint32, uint32)) {
		t.Helper()
		deadline := time.Now().Add(3 * window)
		for {
			na, nb := beat()
			if na == want && nb == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: instances count %d and %d gateways, want %d", what, na, nb, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("four gateways over two instances", 4, func() (uint32, uint32) {
		for i := 0; i < 3; i++ {
			heartbeat(a, fmt.Sprint("gw-", i))
		}
		return heartbeat(a, "gw-0"), heartbeat(b, "gw-9")
	})
	if ttl := a.rdb.PTTL(ctx, nodesKey).Val(); ttl <= 0 || ttl > 2*window {
		t.Fatalf("%s: PTTL %v, want (0, %v]", nodesKey, ttl, 2*window)
	}
	waitFor("one gateway left", 1, func() (uint32, uint32) {
		return heartbeat(a, "gw-0"), heartbeat(b, "gw-0")
	})
}
