package store

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestRegistryAfterWipe: without a rule set at the service the registry is learned from
// the traffic; after Redis lost it (FLUSHALL) the traffic that follows writes it again,
// within relearnCheck, so usage and reset see new buckets without a restart.
func TestRegistryAfterWipe(t *testing.T) {
	s, _ := usageStore(t)
	ctx := context.Background()
	key := uniq("wiped")
	send := func() {
		t.Helper()
		d := mkDelta(algo.TokenBucket, key, "api")
		d.Over, d.ElapsedMs = 1, 100
		if _, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{d}}, Options{Idempotent: true}); err != nil {
			t.Fatal(err)
		}
	}
	send()
	if u, err := s.Usage(ctx, key); err != nil || len(u.Buckets) != 1 {
		t.Fatalf("before the wipe: %+v %v, want one bucket", u, err)
	}
	if err := s.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(relearnCheck + 5*time.Second)
	for {
		send()
		u, err := s.Usage(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(u.Buckets) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage blind %v after the wipe: %+v", time.Since(deadline.Add(-relearnCheck-5*time.Second)), u)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, err := s.Reset(ctx, key); err != nil || n != 1 {
		t.Fatalf("reset after the wipe: %d %v, want 1 key deleted", n, err)
	}
}

// TestRegistryBounds: NoLearn records nothing (a service with a rule set names the
// buckets itself), and a learned registry never holds more than maxParams entries in
// Redis, whatever tiers a gateway invents.
func TestRegistryBounds(t *testing.T) {
	srv := redistest.StartStandalone(t)
	// 13,000 new buckets in batches of 1,000: give a loaded machine time.
	s, err := Open(Config{Addrs: srv.Addrs(), Lease: testLease, ReadTimeout: 30 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	batch := func(from, n int) *wire.Batch {
		b := &wire.Batch{Node: uniq("gw"), Seq: 1}
		for i := from; i < from+n; i++ {
			d := mkDelta(algo.TokenBucket, "k", "api")
			d.Tier = "t" + strconv.Itoa(i)
			b.Deltas = append(b.Deltas, d)
		}
		return b
	}
	if _, err := s.Apply(ctx, batch(0, 100), Options{Idempotent: true, NoLearn: true}); err != nil {
		t.Fatal(err)
	}
	if n := s.rdb.HLen(ctx, paramsKey).Val(); n != 0 {
		t.Fatalf("NoLearn: registry holds %d entries, want 0", n)
	}
	for from, n := 0, 1000; from < maxParams+3*n; from += n {
		if _, err := s.Apply(ctx, batch(from, n), Options{Idempotent: true}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.rdb.HLen(ctx, paramsKey).Val(); n > maxParams {
		t.Fatalf("registry holds %d entries, bound %d", n, maxParams)
	}
}
