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

// TestFleetSize: the fleet size (tg:{fleet}:nodes) counts the gateways any service instance
// heard from, and forgets those silent for longer than FleetWindow.
func TestFleetSize(t *testing.T) {
	srv := redistest.StartStandalone(t) // tg:{fleet}:nodes is global: a server of its own
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
	if ttl := a.rdb.PTTL(ctx, NodesKey).Val(); ttl <= 0 || ttl > 2*window {
		t.Fatalf("%s: PTTL %v, want (0, %v]", NodesKey, ttl, 2*window)
	}
	waitFor("one gateway left", 1, func() (uint32, uint32) {
		return heartbeat(a, "gw-0"), heartbeat(b, "gw-0")
	})
}

// TestFleetBounds: node ids come from clients, so the fleet size must not follow them.
// Ids sent once never count (probation); ids kept alive join at most the join rate per
// second, and never beyond the cap; honest gateways that keep syncing count.
func TestFleetBounds(t *testing.T) {
	tests := []struct {
		name       string
		rate, cap  int
		fakes      int
		fakeRounds int // how many times each fake id syncs, one round per 300 ms
		honest     int
		want       func(size uint32, elapsed time.Duration) bool
		what       string
	}{
		{name: "fakes sent once", rate: 50, cap: 10_000, fakes: 5000, fakeRounds: 1, honest: 2,
			want: func(n uint32, _ time.Duration) bool { return n == 2 }, what: "exactly the 2 honest gateways"},
		{name: "fakes kept alive join at the rate", rate: 3, cap: 10_000, fakes: 500, fakeRounds: 8, honest: 2,
			want: func(n uint32, el time.Duration) bool { return n >= 2 && n <= 2+uint32(3*(el.Seconds()+1)) },
			what: "2 honest + at most 3 per second"},
		{name: "cap", rate: 1000, cap: 5, fakes: 200, fakeRounds: 6, honest: 2,
			want: func(n uint32, _ time.Duration) bool { return n <= 5 }, what: "at most the cap of 5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartStandalone(t) // the fleet set is global: a server of its own
			s, err := Open(Config{Addrs: srv.Addrs(), Lease: testLease, FleetWindow: 3 * time.Second,
				FleetProbation: 500 * time.Millisecond, FleetJoinRate: tc.rate, FleetMaxNodes: tc.cap}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			ctx := context.Background()
			beat := func(node string) uint32 {
				out, err := s.Apply(ctx, &wire.Batch{Node: node, Seq: uint64(time.Now().UnixMicro())}, Options{Idempotent: true})
				if err != nil {
					t.Fatal(err)
				}
				return out.Nodes
			}
			honest := func() uint32 {
				var n uint32
				for i := 0; i < tc.honest; i++ {
					n = beat(fmt.Sprint("honest-", i))
				}
				return n
			}
			// The honest fleet settles first.
			deadline := time.Now().Add(10 * time.Second)
			for honest() != uint32(tc.honest) {
				if time.Now().After(deadline) {
					t.Fatalf("honest fleet of %d never counted", tc.honest)
				}
				time.Sleep(50 * time.Millisecond)
			}
			start := time.Now()
			var worst uint32
			for r := 0; r < tc.fakeRounds; r++ {
				for i := 0; i < tc.fakes; i++ {
					beat(fmt.Sprint("fake-", i))
				}
				for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
					worst = max(worst, honest())
				}
			}
			// After the last fake round, long enough for any pending join to land.
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				worst = max(worst, honest())
			}
			if el := time.Since(start); !tc.want(worst, el) {
				t.Fatalf("honest gateways saw a fleet of up to %d over %v, want %s", worst, el.Round(time.Millisecond), tc.what)
			}
			t.Logf("largest fleet size an honest gateway saw: %d", worst)
		})
	}
}
