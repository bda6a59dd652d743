package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// nodeOf is the address of the lane the calls for key's buckets join.
func nodeOf(t *testing.T, s *Store, key string) string {
	t.Helper()
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	sm, err := s.slots.get(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := sm.owner(Slot(KeyPrefix(key)))
	return addr
}

// hold marks addr's lane busy, as if a pipeline were in flight, and returns release:
// it waits until n waiters are queued, then lets the first send the next pipeline as
// the end of a real one would.
func hold(t *testing.T, s *Store, addr string) (release func(n int)) {
	t.Helper()
	c := &s.pipes
	c.mu.Lock()
	if c.lanes == nil {
		c.lanes = map[string]*lane{}
	}
	if c.lanes[addr] == nil {
		c.lanes[addr] = &lane{}
	}
	l := c.lanes[addr]
	if l.busy {
		c.mu.Unlock()
		t.Fatalf("lane %q busy before the test", addr)
	}
	l.busy = true
	c.mu.Unlock()
	return func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			c.mu.Lock()
			queued := len(l.queue)
			c.mu.Unlock()
			if queued >= n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d waiters queued", queued, n)
			}
			time.Sleep(time.Millisecond)
		}
		c.mu.Lock()
		first := l.queue[0]
		c.mu.Unlock()
		first.wake <- true
	}
}

// strictCheck is one request's check of one bucket.
func strictCheck(key string, limit uint32) *wire.Batch {
	return &wire.Batch{Node: "rls-test", Seq: 1, Deltas: []wire.Delta{{Key: key, Rule: "api", Algo: uint8(algo.TokenBucket),
		Flags: wire.FlagStrict, Over: 1, Limit: limit, WindowMs: 3_600_000}}}
}

// TestCoalescedChecksDecideOneByOne: checks queued behind a pipeline in flight go out
// together, in one pipeline (two past maxCoalesced), and are decided as if sent one by
// one: on one bucket of limit L (clock stopped, nothing refills), exactly L of them are
// admitted, with the remaining counts L-1 … 0 once each; every answer reaches its own
// check. On a standalone server and on a cluster.
func TestCoalescedChecksDecideOneByOne(t *testing.T) {
	cases := []struct {
		name          string
		checks, limit int
		pipelines     int64
	}{
		{"one pipeline", 40, 25, 1},
		{"past maxCoalesced", maxCoalesced + 44, maxCoalesced - 6, 2},
	}
	for _, mode := range modes {
		for _, c := range cases {
			t.Run(string(mode)+"/"+c.name, func(t *testing.T) {
				s, _ := clockedStore(t, mode, nil)
				m := s.metrics.(*countingMetrics)
				key := uniq("coalesce")
				release := hold(t, s, nodeOf(t, s, key))
				before := m.syncs.Load()
				outs := make([]*Outcome, c.checks)
				errs := make([]error, c.checks)
				var wg sync.WaitGroup
				for i := range outs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						outs[i], errs[i] = s.Apply(context.Background(), strictCheck(key, uint32(c.limit)), Options{})
					}()
				}
				release(c.checks)
				wg.Wait()
				var remaining []int64
				for i, out := range outs {
					if errs[i] != nil {
						t.Fatalf("check %d: %v", i, errs[i])
					}
					st := out.States[0]
					if st.Key != key {
						t.Fatalf("check %d answered for key %q", i, st.Key)
					}
					if st.Allowed() {
						remaining = append(remaining, st.Remaining)
					}
				}
				slices.Sort(remaining)
				want := make([]int64, c.limit)
				for i := range want {
					want[i] = int64(i)
				}
				if !slices.Equal(remaining, want) {
					t.Errorf("admitted %d of %d checks with remaining %v, want %d with 0..%d once each", len(remaining), c.checks, remaining, c.limit, c.limit-1)
				}
				if got := m.syncs.Load() - before; got != c.pipelines {
					t.Errorf("%d checks took %d round trips, want %d", c.checks, got, c.pipelines)
				}
			})
		}
	}
}

// TestCoalescedChecksGetTheirOwnAnswers: concurrent checks of several buckets each,
// spread over the cluster's nodes (a check's share per node joins that node's
// pipeline), each get their own buckets' answers: every bucket is new and has its own
// limit, so a first check answers limit-1 for exactly that limit.
func TestCoalescedChecksGetTheirOwnAnswers(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			s, _ := clockedStore(t, mode, nil)
			const checks, perCheck = 60, 4
			base := uniq("own")
			var wg sync.WaitGroup
			errc := make(chan error, checks)
			for i := 0; i < checks; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					b := &wire.Batch{Node: "rls-test", Seq: 1}
					for j := 0; j < perCheck; j++ {
						limit := uint32(10 + i*perCheck + j)
						b.Deltas = append(b.Deltas, strictCheck(fmt.Sprint(base, "-", i, "-", j), limit).Deltas[0])
					}
					out, err := s.Apply(context.Background(), b, Options{})
					if err != nil {
						errc <- err
						return
					}
					for j, st := range out.States {
						d := b.Deltas[j]
						if st.Key != d.Key || !st.Allowed() || st.Remaining != int64(d.Limit)-1 {
							errc <- fmt.Errorf("check %d bucket %d (%s, limit %d): answered %s allowed=%v remaining %d", i, j, d.Key, d.Limit, st.Key, st.Allowed(), st.Remaining)
						}
					}
				}()
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
		})
	}
}

// TestCoalescedChecksShareScriptCalls: checks that join one pipeline also share script
// calls, up to maxPerCall deltas each (a call costs Redis about as much again as the
// deltas it carries).
func TestCoalescedChecksShareScriptCalls(t *testing.T) {
	const checks = maxPerCall + 20
	s, _ := clockedStore(t, Standalone, nil)
	key := uniq("share")
	release := hold(t, s, nodeOf(t, s, key))
	calls := func() int64 {
		info, err := s.rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
				n, _ := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	before := calls()
	var wg sync.WaitGroup
	admitted := make(chan bool, checks)
	for range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.Apply(context.Background(), strictCheck(key, 1000), Options{})
			if err != nil {
				t.Error(err)
				return
			}
			admitted <- out.States[0].Allowed()
		}()
	}
	release(checks)
	wg.Wait()
	close(admitted)
	n := 0
	for ok := range admitted {
		if ok {
			n++
		}
	}
	if n != checks {
		t.Errorf("%d of %d admitted", n, checks)
	}
	// the held check's own call, then the queued ones in two calls
	if got := calls() - before; got != 3 {
		t.Errorf("%d checks took %d script calls, want 3", checks, got)
	}
}
