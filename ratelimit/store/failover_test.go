package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestClusterFailover SIGKILLs the primary of one slot while batches flow. Every
// failing batch must return within its deadline (derived from the configured timeouts,
// plus scheduling slack: an upper bound, not a speed claim), and once a replica is
// promoted batches succeed again on their own — including the NOSCRIPT the promoted
// replica answers because its script cache was flushed.
func TestClusterFailover(t *testing.T) {
	s, m := newStore(t, Cluster, func(c *Config) {
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout, c.MaxRetries = 200*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 1
	})
	deadline := time.Duration(s.cfg.MaxRetries+1) * s.cfg.AttemptBudget() // what the service gives one batch
	const slack = time.Second
	ctx := context.Background()
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprint("fo-", i, "-", rand.Uint32())
	}
	batch := func(seq uint64) *wire.Batch {
		b := &wire.Batch{Node: "gw", Seq: seq}
		for _, k := range keys {
			d := fixedWindow(k, "r", 1_000_000)
			d.Over = 1
			b.Deltas = append(b.Deltas, d)
		}
		return b
	}
	if _, err := s.Apply(ctx, batch(1)); err != nil {
		t.Fatal(err)
	}
	cc := s.rdb.(*redis.ClusterClient)
	if err := cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() }); err != nil {
		t.Fatal(err)
	}

	type attempt struct {
		at      time.Time
		elapsed time.Duration
		err     error
	}
	var (
		mu       sync.Mutex
		attempts []attempt
		stop     = make(chan struct{})
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		for seq := uint64(2); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			actx, cancel := context.WithTimeout(ctx, deadline)
			_, err := s.Apply(actx, batch(seq))
			cancel()
			mu.Lock()
			attempts = append(attempts, attempt{start, time.Since(start), err})
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	killed, err := cluster.KillPrimaryForKey(keys[0])
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
	// Recovery needs no help: wait (bounded) for a batch started after the promotion
	// to succeed.
	recovered := false
	for wait := time.Now().Add(15 * time.Second); time.Now().Before(wait) && !recovered; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		for _, a := range attempts {
			if a.at.After(promoted) && a.err == nil {
				recovered = true
			}
		}
		mu.Unlock()
	}
	close(stop)
	<-done
	var failures int
	for _, a := range attempts {
		if a.err == nil {
			continue
		}
		failures++
		if failures < 4 || a.at.After(promoted) && failures%20 == 0 {
			t.Logf("attempt at +%v: %v", a.at.Sub(promoted), a.err)
		}
		if !errors.Is(a.err, ErrUnavailable) {
			t.Errorf("failure is not ErrUnavailable: %v", a.err)
		}
		if a.elapsed > deadline+slack {
			t.Errorf("a failing batch took %v, more than its deadline %v + %v", a.elapsed, deadline, slack)
		}
	}
	if failures == 0 {
		t.Errorf("no batch failed while the primary was down (%d attempts)", len(attempts))
	}
	if !recovered {
		t.Fatalf("no successful batch within 15 s after promotion (%d attempts, %d failed)", len(attempts), failures)
	}
	if m.reloads.Load() == 0 {
		t.Error("no script reload after failover to a replica with an empty script cache")
	}
	t.Logf("%d batches, %d failed during the failover, deadline %v", len(attempts), failures, deadline)
}
