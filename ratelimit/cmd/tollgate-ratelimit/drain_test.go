package main

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestShutdownDrainsInFlightSync: a sync that Redis is still working on when SIGTERM
// arrives (Redis paused for writes holds its script) is answered, complete, after the
// listener has stopped taking connections; the service exits 0 only after it. This is
// what lets a Deployment replace replicas without failing the gateways' batches.
func TestShutdownDrainsInFlightSync(t *testing.T) {
	srv := redistest.StartStandalone(t)
	ctx := context.Background()
	root := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	defer root.Close()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan listening, 1)
	done := make(chan int, 1)
	logs := &lockedBuffer{}
	go func() {
		done <- run(sctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "text",
			"--redis-addrs", srv.Addr(), "--redis-read-timeout", "20s", "--batch-timeout", "30s", "--shutdown-timeout", "30s"},
			env(map[string]string{"TOLLGATE_SYNC_SECRET": "s"}), logs, logs, ready)
	}()
	var l listening
	select {
	case l = <-ready:
	case code := <-done:
		t.Fatalf("exit %d: %s", code, logs)
	}

	blocked := func() int {
		info, err := root.Info(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		return 0
	}
	if err := root.Do(ctx, "CLIENT", "PAUSE", 60_000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer root.Do(ctx, "CLIENT", "UNPAUSE")
	before := blocked()

	const limit, over = 50, 4
	type result struct {
		rep *wire.Reply
		err error
	}
	replies := make(chan result, 1)
	go func() {
		rep, err := syncOnce(l.sync, &wire.Batch{Node: "gw-drain", Seq: 1, Deltas: []wire.Delta{
			{Key: "drain", Rule: "r", Over: over, Algo: uint8(algo.TokenBucket), Limit: limit, WindowMs: 60_000}}})
		replies <- result{rep, err}
	}()
	waitFor(t, "the sync's script held by the pause", func() bool { return blocked() > before })

	cancel() // what SIGTERM does in main
	waitFor(t, "the sync listener closed", func() bool {
		c, err := net.DialTimeout("tcp", l.sync, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case code := <-done:
		t.Fatalf("exited %d with a sync in flight", code)
	case <-replies:
		t.Fatal("the sync was answered while Redis held it")
	default:
	}
	if err := root.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-replies:
		if r.err != nil {
			t.Fatalf("in-flight sync: %v", r.err)
		}
		if rep := r.rep; len(rep.States) != 1 || rep.States[0].Remaining > limit-over {
			t.Fatalf("drained reply %+v: want the batch applied", r.rep)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("in-flight sync not answered: %s", logs)
	}
	if code := <-done; code != 0 {
		t.Fatalf("exit %d after draining: %s", code, logs)
	}
}

// waitFor polls cond for at most 10 s (a hang guard, not a timing claim).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}
