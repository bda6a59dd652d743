package memservice

import (
	"slices"

	"github.com/tollgate-rl/tollgate/internal/backend"
)

// fleet counts the gateways as the store does (ratelimit/store/fleet.go and
// scripts/fleet.lua, one service instance): a gateway counts once its syncs span the
// probation, while it syncs within the window, joining at most FleetJoinRate a second
// and FleetMaxNodes in all; the count is refreshed once a backend.FleetRefresh, and a
// batch is answered with the count before the refresh it triggers (the store refreshes
// in the background). Counting every node at its first batch, as this service once did,
// sized a fresh fleet's first leases and cold-start allowances for gateways the store
// does not count yet, and counted an id sent once.
type fleet struct {
	local     map[string]*seen // gateways heard from
	last      int64            // the last refresh (µs)
	refreshed bool
	count     uint32           // the set's size at the last refresh
	live      uint32           // admitted gateways heard from within the window
	set       map[string]int64 // the fleet set (tg:{fleet}:nodes): member -> score (ms)
	joins     map[int64]int    // joins per unix second
}

type seen struct {
	first, last int64
	admitted    bool
}

// note records node at now and returns the fleet size.
func (f *fleet) note(sv *Service, node string, now int64) uint32 {
	if f.local == nil {
		f.local, f.set, f.joins = map[string]*seen{}, map[string]int64{}, map[int64]int{}
	}
	if e := f.local[node]; e != nil {
		e.last = now
	} else if len(f.local) < 2*sv.FleetMaxNodes {
		f.local[node] = &seen{first: now, last: now}
	}
	if f.refreshed && now-f.last < backend.FleetRefresh.Microseconds() {
		return max(f.count, f.live, 1)
	}
	window := sv.FleetWindowUs
	probation := max(sv.FleetProbationUs, 0)
	var admitted, candidates []string
	var live uint32
	for id, e := range f.local {
		switch {
		case now-e.last > window:
			delete(f.local, id)
		case e.admitted:
			live++
			if !f.refreshed || e.last >= f.last {
				admitted = append(admitted, id)
			}
		case e.last-e.first >= probation && (!f.refreshed || e.last >= f.last):
			candidates = append(candidates, id)
		}
	}
	// Map order is random; the simulation must not be.
	slices.Sort(candidates)
	candidates = candidates[:min(len(candidates), backend.FleetMaxCandidates)]
	f.live, f.last, f.refreshed = live, now, true
	n := max(f.count, f.live, 1) // the store answers before its refresh lands

	// fleet.lua
	nowMs, winMs := now/1000, window/1000
	for id, score := range f.set {
		if score < nowMs-winMs {
			delete(f.set, id)
		}
	}
	for _, id := range admitted {
		f.set[id] = nowMs
	}
	sec := nowMs / 1000
	for s := range f.joins {
		if s < sec-1 {
			delete(f.joins, s)
		}
	}
	size, joined := len(f.set), f.joins[sec]
	for _, id := range candidates {
		ok := false
		if _, in := f.set[id]; in {
			f.set[id] = nowMs
			ok = true
		} else if size < sv.FleetMaxNodes && joined < sv.FleetJoinRate {
			f.set[id] = nowMs
			size, joined, ok = size+1, joined+1, true
		}
		if e := f.local[id]; ok && e != nil && !e.admitted {
			e.admitted = true
			f.live++
		}
	}
	f.joins[sec] = joined
	f.count = uint32(size)
	return n
}
