package store

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// fleet estimates how many gateways sync (Reply.Nodes, which sizes cold-start and
// overdraft slices). Every service instance records the gateways it hears from in a
// shared sorted set rl:nodes (score: unix ms of the last sync) at most once per
// refreshEvery, in the background, and caches the set's size.
type fleet struct {
	mu      sync.Mutex
	local   map[string]time.Time // gateways this instance heard from, last time
	last    time.Time
	running bool
	count   atomic.Uint32
	wg      sync.WaitGroup
}

const refreshEvery = time.Second

func (f *fleet) init() {
	f.local = map[string]time.Time{}
}

// note records node and returns the fleet size estimate.
func (f *fleet) note(s *Store, node string) uint32 {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.local[node] = now
	live := uint32(0)
	window := s.cfg.FleetWindow
	for n, t := range f.local {
		if now.Sub(t) > window {
			delete(f.local, n)
			continue
		}
		live++
	}
	if !f.running && now.Sub(f.last) >= refreshEvery {
		// Record every gateway heard from since the last refresh.
		f.running = true
		var nodes []redis.Z
		for n, t := range f.local {
			if !t.Before(f.last) {
				nodes = append(nodes, redis.Z{Score: float64(t.UnixMilli()), Member: n})
			}
		}
		f.last = now
		f.wg.Add(1)
		go f.refresh(s, nodes)
	}
	return max(f.count.Load(), live, 1)
}

func (f *fleet) refresh(s *Store, nodes []redis.Z) {
	defer f.wg.Done()
	defer func() { f.mu.Lock(); f.running = false; f.mu.Unlock() }()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AttemptBudget())
	defer cancel()
	now := time.Now()
	pipe := s.rdb.Pipeline()
	if len(nodes) > 0 {
		pipe.ZAdd(ctx, NodesKey, nodes...)
	}
	pipe.ZRemRangeByScore(ctx, NodesKey, "-inf", "("+strconv.FormatInt(now.Add(-s.cfg.FleetWindow).UnixMilli(), 10))
	card := pipe.ZCard(ctx, NodesKey)
	pipe.PExpire(ctx, NodesKey, 2*s.cfg.FleetWindow)
	start := time.Now()
	_, err := pipe.Exec(ctx)
	s.metrics.RoundTrip("fleet", time.Since(start), err)
	if err != nil {
		return // the next refresh records them (they are still in local)
	}
	f.count.Store(uint32(min(card.Val(), 1<<32-1)))
}
