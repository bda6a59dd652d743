package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// primaryOf is the address of the cluster primary serving key, as the store's slot map
// has it.
func primaryOf(t testing.TB, s *Store, key string) string {
	t.Helper()
	tab, err := s.slots.get(context.Background(), s.rdb.(*redis.ClusterClient))
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := tab.owner(Slot(key))
	return addr
}

// fixedBatch is a batch charging one permit to each of n fresh fixed-window buckets
// (limit 1,000,000 a minute: nothing is ever refused, so what is stored counts the
// batches applied).
func fixedBatch(node string, seq uint64, n int) *wire.Batch {
	b := &wire.Batch{Node: node, Seq: seq}
	base := uniq("fo")
	for i := 0; i < n; i++ {
		d := mkDelta(algo.FixedWindow, fmt.Sprint(base, "-", i), "api")
		d.Limit, d.Over = 1_000_000, 1
		b.Deltas = append(b.Deltas, d)
	}
	return b
}

// TestHalfAppliedBatch: one cluster node stops answering writes while a batch is
// applied. Exactly that node's deltas fail (ErrUnavailable, counted in Failed), the
// others are applied; the gateway's retry of the same batch applies the missing ones
// and only replays the rest, so every bucket is charged exactly once.
func TestHalfAppliedBatch(t *testing.T) {
	s, clock := clockedStore(t, Cluster, func(c *Config) {
		c.ReadTimeout, c.WriteTimeout, c.MaxRetries = 200*time.Millisecond, 200*time.Millisecond, -1
	})
	ctx := context.Background()
	b := fixedBatch(uniq("gw"), 1, 60)
	paused := primaryOf(t, s, KeyPrefix(b.Deltas[0].Key))
	pc := redis.NewClient(&redis.Options{Addr: paused, DisableIdentity: true})
	defer pc.Close()
	// WRITE pauses the scripts (they write) but not the cluster bus: the cluster sees a
	// healthy node, the store sees one that does not answer.
	if err := pc.Do(ctx, "CLIENT", "PAUSE", 3000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	defer func() {
		if !unpaused {
			pc.ClientUnpause(ctx)
		}
	}()
	actx, cancel := context.WithTimeout(ctx, time.Second)
	out, err := s.Apply(actx, b, Options{Idempotent: true})
	cancel()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("apply with a paused node: %v, want ErrUnavailable", err)
	}
	onPaused := 0
	for i, d := range b.Deltas {
		on := primaryOf(t, s, KeyPrefix(d.Key)) == paused
		if on {
			onPaused++
		}
		if applied := out.Results[i].NowUs != 0; applied == on {
			t.Fatalf("delta %d (on the paused node: %v) applied: %v", i, on, applied)
		}
	}
	if out.Failed != onPaused || onPaused == 0 || onPaused == len(b.Deltas) {
		t.Fatalf("failed %d, deltas on the paused node %d of %d", out.Failed, onPaused, len(b.Deltas))
	}
	if err := pc.ClientUnpause(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	unpaused = true
	*clock += 100_000
	retry, err := s.Apply(ctx, b, Options{Idempotent: true})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	fresh := 0
	for i, d := range b.Deltas {
		if got := consumed(t, s, &d, *clock); got != 1 {
			t.Fatalf("delta %d charged %d times", i, got)
		}
		if !retry.Results[i].Replay {
			fresh++
			if out.Results[i].NowUs != 0 {
				t.Fatalf("delta %d applied by the first attempt and again by the retry", i)
			}
		}
	}
	// A paused script whose client gave up may still run when the pause ends; then its
	// deltas are replays too. Either way each was charged once (checked above).
	t.Logf("%d of %d deltas on the paused node, %d applied by the retry", onPaused, len(b.Deltas), fresh)
}

// TestClusterFailover SIGKILLs the primary of some of a gateway's buckets while it syncs
// them every 20 ms, resending a failed batch unchanged (same seq) as a gateway does.
// Every failure is ErrUnavailable and returns within the service's deadline for one
// batch (plus scheduling slack: an upper bound, not a speed claim); batches succeed
// again once a replica is promoted, with no help (the promoted replica's empty script
// cache included); and every batch is charged exactly once.
func TestClusterFailover(t *testing.T) {
	s, m := newStore(t, Cluster, func(c *Config) {
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout, c.MaxRetries = 200*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 1
	})
	var mu sync.Mutex
	clock := t0
	s.SetTestClock(func() int64 { mu.Lock(); defer mu.Unlock(); clock += 1000; return clock })
	deadline := time.Duration(s.cfg.MaxRetries+1) * s.cfg.AttemptBudget()
	const slack = time.Second
	ctx := context.Background()
	node := uniq("gw")
	tmpl := fixedBatch(node, 0, 120)
	if err := s.rdb.(*redis.ClusterClient).ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
		return c.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}

	type attempt struct {
		at      time.Time
		seq     uint64
		elapsed time.Duration
		err     error
	}
	var (
		attempts []attempt
		applied  uint64 // batches acknowledged
		stop     = make(chan struct{})
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		seq := uint64(1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			b := *tmpl
			b.Seq = seq
			start := time.Now()
			actx, cancel := context.WithTimeout(ctx, deadline)
			_, err := s.Apply(actx, &b, Options{Idempotent: true})
			cancel()
			mu.Lock()
			attempts = append(attempts, attempt{start, seq, time.Since(start), err})
			if err == nil {
				applied = seq
				seq++ // else: the same batch again
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	killed, err := cluster.KillPrimaryForKey(KeyPrefix(tmpl.Deltas[0].Key))
	if killed != "" {
		t.Cleanup(func() {
			if err := cluster.Restart(killed); err != nil {
				t.Errorf("restart %s: %v", killed, err)
			}
		})
	}
	if err != nil {
		close(stop)
		<-done
		t.Fatal(err)
	}
	promoted := time.Now()
	recovered := false
	for wait := time.Now().Add(15 * time.Second); time.Now().Before(wait) && !recovered; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		for _, a := range attempts {
			recovered = recovered || a.at.After(promoted) && a.err == nil
		}
		mu.Unlock()
	}
	close(stop)
	<-done
	failures := 0
	for _, a := range attempts {
		if a.err == nil {
			continue
		}
		failures++
		if failures <= 3 {
			t.Logf("seq %d at %+v from promotion: %v", a.seq, a.at.Sub(promoted).Round(time.Millisecond), a.err)
		}
		if !errors.Is(a.err, ErrUnavailable) {
			t.Errorf("seq %d: failure is not ErrUnavailable: %v", a.seq, a.err)
		}
		if a.elapsed > deadline+slack {
			t.Errorf("seq %d: a failing batch took %v, more than its deadline %v + %v", a.seq, a.elapsed, deadline, slack)
		}
	}
	if failures == 0 {
		t.Errorf("no batch failed while the primary was down (%d attempts)", len(attempts))
	}
	if !recovered {
		t.Fatalf("no batch succeeded within 15 s of the promotion (%d attempts, %d failed)", len(attempts), failures)
	}
	if m.reloads.Load() == 0 {
		t.Error("no script reload after the scripts were flushed")
	}
	// Exactly once: every bucket counts every acknowledged batch, none twice.
	mu.Lock()
	now := clock
	mu.Unlock()
	for i, d := range tmpl.Deltas {
		if got := consumed(t, s, &d, now); got != int64(applied) {
			t.Fatalf("delta %d: charged %d times for %d batches applied", i, got, applied)
		}
	}
	t.Logf("%d batches applied in %d attempts, %d failed around the failover (deadline %v)", applied, len(attempts), failures, deadline)
}
