package store

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/backend"
)

// fleet estimates how many gateways sync (Reply.Nodes, which sizes the gateways'
// cold-start allowances, capacity/(20·N), and their first leases, capacity/(4·N)). Every service instance records the gateways it hears from in a shared
// sorted set (NodesKey, score: unix ms of the last sync) at most once per refreshEvery,
// in the background, and caches the set's size.
//
// Node ids are whatever a batch says, so the set only takes gateways that behave like
// gateways, at a bounded pace: a node counts once its syncs span FleetProbation (an honest
// gateway syncs every interval; an id sent once never counts), new members join
// at most FleetJoinRate per second over all instances, and the set holds at most
// FleetMaxNodes. Invented ids can therefore not change the size honest gateways see at
// once, and a client that keeps thousands of them alive raises it by at most the join
// rate per second, up to the cap. This instance also tracks at most maxTracked ids, so
// its memory is bounded too.
type fleet struct {
	mu      sync.Mutex
	local   map[string]*seen // gateways this instance heard from
	last    time.Time        // last refresh
	running bool
	count   atomic.Uint32 // the set's size at the last refresh
	live    atomic.Uint32 // admitted gateways this instance heard from within the window
	wg      sync.WaitGroup
	script  *redis.Script
}

// seen is one gateway as this instance knows it.
type seen struct {
	first, last time.Time
	admitted    bool // a member of the shared set
}

const refreshEvery = backend.FleetRefresh

// maxCandidates bounds the ids one refresh offers to the set (the rest wait for the
// next): the join rate admits few anyway, and the script call stays short.
const maxCandidates = backend.FleetMaxCandidates

func (f *fleet) init() error {
	src, err := fs.ReadFile(scriptFS, "scripts/fleet.lua")
	if err != nil {
		return fmt.Errorf("store: fleet script: %w", err)
	}
	f.local = map[string]*seen{}
	f.script = redis.NewScript(string(src))
	return nil
}

// maxTracked is how many ids one instance keeps: enough for a full fleet and as many
// again on probation.
func (s *Store) maxTracked() int { return 2 * s.cfg.FleetMaxNodes }

// note records node and returns the fleet size estimate.
func (f *fleet) note(s *Store, node string) uint32 {
	now := s.clock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.local[node]; e != nil {
		e.last = now
	} else if len(f.local) < s.maxTracked() {
		f.local[node] = &seen{first: now, last: now}
	}
	if !f.running && now.Sub(f.last) >= refreshEvery {
		f.startRefresh(s, now)
	}
	return max(f.count.Load(), f.live.Load(), 1)
}

// startRefresh (f.mu held) forgets gateways silent for a window and sends the set the
// admitted gateways heard from since the last refresh, and the candidates: gateways
// heard from since whose syncs span at least the probation.
func (f *fleet) startRefresh(s *Store, now time.Time) {
	var admitted, candidates []string
	var live uint32
	for id, e := range f.local {
		switch {
		case now.Sub(e.last) > s.cfg.FleetWindow:
			delete(f.local, id)
		case e.admitted:
			live++
			if !e.last.Before(f.last) {
				admitted = append(admitted, id)
			}
		case e.last.Sub(e.first) >= s.cfg.FleetProbation && !e.last.Before(f.last) && len(candidates) < maxCandidates:
			// Synced again at least a probation after its first sync, and lately.
			candidates = append(candidates, id)
		}
	}
	f.live.Store(live)
	f.last = now
	f.running = true
	f.wg.Add(1)
	go f.refresh(s, now, admitted, candidates)
}

func (f *fleet) refresh(s *Store, now time.Time, admitted, candidates []string) {
	defer f.wg.Done()
	defer func() { f.mu.Lock(); f.running = false; f.mu.Unlock() }()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AttemptBudget())
	defer cancel()
	args := make([]any, 0, 5+len(admitted)+len(candidates))
	args = append(args, now.UnixMilli(), s.cfg.FleetWindow.Milliseconds(), s.cfg.FleetMaxNodes, s.cfg.FleetJoinRate, len(admitted))
	for _, id := range admitted {
		args = append(args, id)
	}
	for _, id := range candidates {
		args = append(args, id)
	}
	keys := []string{NodesKey, NodesKey + ":joins:" + strconv.FormatInt(now.Unix(), 10)}
	start := time.Now()
	res, err := f.script.Run(ctx, s.rdb, keys, args...).Int64Slice()
	s.metrics.RoundTrip("fleet", time.Since(start), err)
	if err != nil || len(res) != 1+len(candidates) {
		return // the next refresh records them (they are still in local)
	}
	f.count.Store(uint32(min(res[0], 1<<32-1)))
	f.mu.Lock()
	defer f.mu.Unlock()
	joined, deferred := 0, 0
	for i, id := range candidates {
		if res[1+i] == 1 {
			if e := f.local[id]; e != nil && !e.admitted {
				e.admitted = true
				f.live.Add(1)
			}
			joined++
		} else {
			deferred++
		}
	}
	if m, ok := s.metrics.(FleetMetrics); ok && (joined > 0 || deferred > 0) {
		m.FleetJoins(joined, deferred)
	}
}

// FleetMetrics is implemented by a Metrics that counts fleet admissions: gateways that
// joined the fleet set, and gateways past their probation kept out of it for now (join
// rate or cap reached).
type FleetMetrics interface {
	FleetJoins(joined, deferred int)
}
