package sim

import (
	"maps"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// service is the sync service and its Redis: one lease.Sync per delta at the simulated
// clock. Buckets are kept in a compact form between calls (a Redis hash is a flat list of
// fields too) and expanded into a lease.Bucket for each call, so a million buckets cost
// tens of megabytes rather than two Go maps each.
type service struct {
	buckets  map[uint32]*svcBucket
	penalty  map[uint32]*svcPenalty
	lastSync []int64 // per gateway: server time of its last batch (fleet size)
	nodeIdx  map[string]int32
	names    []string
	// scratch
	b        lease.Bucket
	shards   []bool
	perSlot  map[int]int
	tmpNodes []svcNode
}

type svcBucket struct {
	// full is set once the bucket has more than promoteAt (node, worker) records:
	// expanding it for every call would then cost more than the call.
	full    *lease.Bucket
	st      [algo.MaxStateSize]byte
	stLen   uint8
	params  bool // the "p" field is set
	expire  int64
	nodes   []svcNode
	applied []svcApplied
}

const promoteAt = 8

type svcNode struct {
	node int32
	lease.NodeLease
}

type svcApplied struct {
	node   int32
	worker uint32
	lease.Applied
}

type svcPenalty struct {
	lease.Penalty
	expire int64
}

func newService(gws []*gateway, shards int) *service {
	sv := &service{
		buckets:  map[uint32]*svcBucket{},
		penalty:  map[uint32]*svcPenalty{},
		lastSync: make([]int64, len(gws)),
		nodeIdx:  map[string]int32{},
		b:        lease.Bucket{Nodes: map[string]*lease.NodeLease{}, Applied: map[lease.WorkerID]lease.Applied{}},
		shards:   make([]bool, shards),
		perSlot:  map[int]int{},
	}
	for i, g := range gws {
		sv.names = append(sv.names, g.node)
		sv.nodeIdx[g.node] = int32(i)
		sv.lastSync[i] = -1 << 62
	}
	return sv
}

// apply runs one batch at server time now and returns the reply, counting its cost as
// ratelimit/store's Apply incurs it: the deltas are grouped into script calls of at most
// maxPerCall (per hash slot on a cluster, whose script calls must stay within a slot)
// sent as one pipeline, which costs one round trip per shard touched.
func (sv *service) apply(s *sim, ob *outBatch) *wire.Reply {
	now := epochUs + s.now
	cfg := &s.cfg
	gi := sv.nodeIdx[ob.b.Node]
	sv.lastSync[gi] = now
	rep := &wire.Reply{ServerTimeUs: now, Nodes: sv.fleet(now, us(cfg.FleetWindow)), States: make([]wire.State, len(ob.b.Deltas))}
	clear(sv.shards)
	clear(sv.perSlot)
	clustered := len(sv.shards) > 1
	for i := range ob.b.Deltas {
		d := &ob.b.Deltas[i]
		key := ob.keys[i]
		if clustered {
			slot := store.Slot(store.KeyPrefix(d.Key))
			sv.shards[slot*len(sv.shards)/16384] = true
			if sv.perSlot[slot]%maxPerCall == 0 {
				s.res.ScriptCalls++
			}
			sv.perSlot[slot]++
		} else {
			sv.shards[0] = true
			if i%maxPerCall == 0 {
				s.res.ScriptCalls++
			}
		}
		r := sv.sync(s, key, ob.b.Node, ob.b.Worker, ob.b.Seq, d, now)
		st := &rep.States[i]
		st.Key, st.Rule, st.Window = d.Key, d.Rule, d.Window
		r.Fill(st)
		s.res.Deltas++
		if r.Replay {
			s.res.Replays++
		}
		s.res.Overshoot += r.Overshoot
		s.res.Reclaimed += r.Reclaimed
	}
	for _, hit := range sv.shards {
		if hit {
			s.res.RoundTrips++
		}
	}
	return rep
}

// maxPerCall is ratelimit/store's bound on the deltas of one script call.
const maxPerCall = 100

// sync is one delta of a script call: load the bucket and penalty records (expired ones read as
// absent, as Redis would), run lease.Sync, and write them back with lease.lua's TTLs
// unless the call was a replay (which writes nothing).
func (sv *service) sync(s *sim, key uint32, node string, worker uint32, seq uint64, d *wire.Delta, now int64) lease.SyncResult {
	cfg := &s.cfg
	sb := sv.buckets[key]
	if sb != nil && now >= sb.expire {
		sb = nil
	}
	b := &sv.b
	if sb != nil && sb.full != nil {
		b = sb.full
	} else {
		clear(b.Nodes)
		clear(b.Applied)
		b.Params, b.State = algo.Params{}, nil
		if sb != nil {
			if sb.params {
				b.Params = s.cfg.Params
			}
			b.State = sb.st[:sb.stLen] // algo never writes a State in place
			for i := range sb.nodes {
				b.Nodes[sv.names[sb.nodes[i].node]] = &sb.nodes[i].NodeLease
			}
			for _, a := range sb.applied {
				b.Applied[lease.WorkerID{Node: sv.names[a.node], Worker: a.worker}] = a.Applied
			}
		}
	}
	var pen lease.Penalty
	pr := sv.penalty[key]
	if pr != nil && now < pr.expire {
		pen = pr.Penalty
	}
	pen0 := pen

	r := lease.Sync(b, &pen, node, worker, seq, d, now, cfg.Service)
	if r.Replay {
		return r
	}

	switch {
	case sb != nil && sb.full != nil:
	case len(b.Applied) > promoteAt:
		// A hot bucket: keep it as a lease.Bucket from now on.
		full := &lease.Bucket{Params: b.Params, State: b.State,
			Nodes: make(map[string]*lease.NodeLease, len(b.Nodes)), Applied: maps.Clone(b.Applied)}
		for name, n := range b.Nodes {
			c := *n
			full.Nodes[name] = &c
		}
		sb = &svcBucket{full: full}
		sv.buckets[key] = sb
	default:
		if sb == nil {
			sb = &svcBucket{}
			sv.buckets[key] = sb
		}
		sb.params = b.Params.WindowUs != 0
		sb.stLen = uint8(copy(sb.st[:], b.State))
		// b.Nodes points into sb.nodes: collect before overwriting. The order of nodes
		// and applied records does not matter: lease.Sync's outcome does not depend on
		// map order.
		tmp := sv.tmpNodes[:0]
		for name, n := range b.Nodes {
			tmp = append(tmp, svcNode{node: sv.nodeIdx[name], NodeLease: *n})
		}
		sb.nodes = append(sb.nodes[:0], tmp...)
		sv.tmpNodes = tmp
		sb.applied = sb.applied[:0]
		for id, a := range b.Applied {
			sb.applied = append(sb.applied, svcApplied{node: sv.nodeIdx[id.Node], worker: id.Worker, Applied: a})
		}
	}
	// lease.lua: keep the bucket until it is full again, and at least two windows and
	// two service lease TTLs.
	p := cfg.Params
	ttl := max(2*p.WindowUs, algo.ResetAt(p, b.State, now)-now+p.WindowUs, 2*cfg.Service.LeaseTTLUs)
	sb.expire = now + ceilMs(ttl)*1000

	if pen != pen0 {
		switch {
		case pen.Level == 0 && pen.UntilUs == 0:
			delete(sv.penalty, key)
		default:
			if pr == nil {
				pr = &svcPenalty{}
				sv.penalty[key] = pr
			}
			pr.Penalty = pen
			pr.expire = now + (ceilMs(pen.UntilUs-now+cfg.Service.PenaltyMaxUs)+1000)*1000
		}
	}
	return r
}

// fleet is Reply.Nodes: gateways that synced within window (at least 1).
func (sv *service) fleet(now, window int64) uint32 {
	var n uint32
	for _, t := range sv.lastSync {
		if now-t <= window {
			n++
		}
	}
	return max(n, 1)
}

// expire drops records Redis would have expired (memory only: reads check expiry).
func (sv *service) expire(now int64) {
	for k, b := range sv.buckets {
		if now >= b.expire {
			delete(sv.buckets, k)
		}
	}
	for k, p := range sv.penalty {
		if now >= p.expire {
			delete(sv.penalty, k)
		}
	}
}

// fillState is ratelimit/store's conversion of a script result to a wire.State
// (durations round up, so gateways reset late rather than early).

func ceilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}
