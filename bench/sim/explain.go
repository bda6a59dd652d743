package sim

import (
	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// Explanations (Config.Explain): for every request a gateway held for the service and
// every false rejection of a calm key, what the gateway's record and the service's
// bucket said at that moment, counted by cause in Result.Why. They read the records
// the filter keeps in shared data (plugin.PeekRecord) and the service's bucket; they
// change nothing.

// record is gateway g's record of key (ok false: it has none).
func (s *sim) record(g *gateway, key uint32) (lease.Record, bool) {
	get := func(k string) ([]byte, bool) {
		v, _, ok := g.h.Shared().Get(k)
		return v, ok
	}
	return plugin.PeekRecord(get, uint64(s.cfg.TableSlots), s.names[key], "api", "", 0)
}

// heldCause classifies a request about to be decided by gateway g on what its record
// says before the decision.
func (s *sim) heldCause(g *gateway, key uint32) string {
	r, ok := s.record(g, key)
	now := epochUs + s.now + g.skew
	switch {
	case !ok:
		return "held: no record on this gateway (first request there)"
	case r.AcquireUntilUs > now:
		return "held: waits for an acquire this gateway has out"
	case !r.Synced():
		return "held: record never answered (cold, no allowance)"
	case now >= r.LeaseUntilUs:
		return "held: lease period ended (key came back, no allowance)"
	case r.LeaseLeft < 1:
		return "held: valid lease ran dry"
	}
	return "held: other"
}

// why explains a false rejection of key on gateway g.
func (s *sim) why(g *gateway, key uint32, waited, penalized, degraded bool) string {
	switch {
	case penalized:
		return "false: penalty cooldown"
	case degraded:
		return "false: degraded"
	}
	p := s.cfg.Params
	now := epochUs + s.now
	path := "local"
	if waited {
		path = "after acquire"
	}
	b := s.svc.Bucket(s.names[key], "api", "", 0, now)
	var avail, out int64
	if b == nil {
		avail = p.Capacity()
	} else {
		c := *b
		c.State = append(algo.State(nil), b.State...)
		c.Advance(p, now, s.cfg.Service)
		avail, out = algo.Available(p, c.State, now), c.Leases.Outstanding()
	}
	var unused int64 // valid leases other gateways hold and have not used
	for _, o := range s.gws {
		if o == g {
			continue
		}
		if r, ok := s.record(o, key); ok && epochUs+s.now+o.skew < r.LeaseUntilUs {
			unused += max(r.LeaseLeft, 0)
		}
	}
	switch {
	case avail < 1:
		return "false " + path + ": service bucket spent (charged beyond the reference)"
	case avail-out >= 1:
		return "false " + path + ": service has unreserved room now (stale view)"
	case unused >= 1:
		return "false " + path + ": bucket reserved by other gateways' unused leases"
	}
	return "false " + path + ": bucket reserved by leases spent but not reported"
}
