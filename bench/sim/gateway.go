package sim

import (
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// gateway is one Envoy: its workers and the bucket records they share.
type gateway struct {
	idx  int
	node string
	skew int64 // local clock = epoch + simulated time + skew
	// recs maps a key to its record's slot in slab. Records are kept encoded
	// (lease.AppendRecord), as in Envoy shared data, in fixed slots of slotSize bytes.
	recs    map[uint32]int32
	slab    []byte
	workers []*worker
}

// slotSize fits every record of a fixed-size algorithm plus a length byte (Envoy shared
// data knows each value's length; a fixed slab must store it)
// of lease's record encoding.
const (
	slotSize = 1 + lease.MaxRecordSize
)

func (g *gateway) load(key uint32, r *lease.Record) bool {
	i, ok := g.recs[key]
	if !ok {
		*r = lease.Record{Local: r.Local[:0]}
		return false
	}
	s := g.slab[int(i)*slotSize:]
	n := int(s[0])
	if n+1 > slotSize || lease.DecodeRecord(s[1:1+n], r) != nil {
		*r = lease.Record{Local: r.Local[:0]}
		return false
	}
	return true
}

func (g *gateway) store(key uint32, r *lease.Record, buf []byte) []byte {
	buf = lease.AppendRecord(buf[:0], r)
	i, ok := g.recs[key]
	if !ok {
		i = int32(len(g.slab) / slotSize)
		g.recs[key] = i
		g.slab = append(g.slab, make([]byte, slotSize)...)
	}
	slot := g.slab[int(i)*slotSize : int(i+1)*slotSize]
	if len(buf)+1 > slotSize {
		slot[0] = 0 // only a sliding-window log outgrows a slot; it restarts fresh
		return buf
	}
	slot[0] = byte(len(buf))
	copy(slot[1:], buf)
	return buf
}

// worker is one worker VM's half of the sync protocol, mirroring filter/plugin's syncer:
// pending deltas per bucket, at most one batch in flight, resent unchanged until
// acknowledged, and a circuit breaker in front of the service.
type worker struct {
	g  *gateway
	id uint32
	gi int // index in sim.workers
	// seq starts at the worker's start time on its own clock, as the filter's does.
	seq uint64
	// pending is this worker's consumption per bucket since the last cut, in first-touch
	// order (the filter iterates a map; a slice keeps runs reproducible).
	pending    []pendingDelta
	pendingIdx map[uint32]int32
	// unacked is the cut batch awaiting acknowledgement.
	unacked  *outBatch
	inflight bool
	call     uint64 // id of the call in flight
	nodes    int64
	breaker  lease.Breaker
}

type pendingDelta struct {
	key   uint32
	delta wire.Delta
}

// outBatch is a cut batch: the wire message, the key index of each delta (for the
// simulation's bookkeeping) and its encoded size.
type outBatch struct {
	b    wire.Batch
	keys []uint32
	size int
}

// env is lease.Env as filter/plugin's Plugin.env builds it.
func (w *worker) env(s *sim) lease.Env {
	return lease.Env{
		Sync:       true,
		Healthy:    w.breaker.Healthy(),
		Nodes:      w.fleet(s),
		LeaseTTLUs: us(s.cfg.LeaseTTL),
		IntervalUs: us(s.cfg.Interval),
	}
}

func (w *worker) fleet(s *sim) int64 {
	if w.nodes > 0 {
		return w.nodes
	}
	return s.cfg.ExpectedNodes
}

// record adds one decision's consumption to key's pending delta (syncer.record).
func (w *worker) record(s *sim, key uint32, d *lease.Decision, synced bool) {
	i, ok := w.pendingIdx[key]
	if !ok {
		if len(w.pending) >= s.cfg.MaxPending {
			s.res.PendingDropped++
			return
		}
		p := s.cfg.Params
		pd := pendingDelta{key: key, delta: wire.Delta{
			Rule: ruleID, Algo: uint8(p.Kind), Limit: u32(p.Limit),
			WindowMs: u32(p.WindowUs / 1000), Burst: u32(p.Burst),
		}}
		if !synced {
			pd.delta.Flags |= wire.FlagNew
		}
		i = int32(len(w.pending))
		w.pending = append(w.pending, pd)
		w.pendingIdx[key] = i
	}
	pd := &w.pending[i].delta
	pd.Leased += u32(d.Leased)
	pd.Over += u32(d.Over)
	pd.Returned += u32(d.Returned)
	pd.Rejected += u32(d.Rejected)
	if !s.cfg.NoPenalty {
		pd.Early += u32(d.Early)
	}
}

// flush sends the unacked batch, or cuts a new one from pending (syncer.flush).
func (w *worker) flush(s *sim) {
	if w.inflight || !w.breaker.Allow(w.g.local(s)) {
		return
	}
	if w.unacked == nil {
		if len(w.pending) == 0 {
			return
		}
		if w.cut(s); w.unacked == nil {
			return // the batch could not be encoded and was dropped
		}
	}
	s.send(w)
}

// cut moves up to MaxBatch pending deltas into a new batch with the next seq.
func (w *worker) cut(s *sim) {
	w.seq++
	n := min(len(w.pending), s.cfg.MaxBatch)
	ob := &outBatch{
		b:    wire.Batch{Node: w.g.node, Worker: w.id, Seq: w.seq, Deltas: make([]wire.Delta, n)},
		keys: make([]uint32, n),
	}
	for i := range n {
		pd := &w.pending[i]
		ob.b.Deltas[i] = pd.delta
		ob.b.Deltas[i].Key = keyName(pd.key)
		ob.keys[i] = pd.key
		delete(w.pendingIdx, pd.key)
	}
	rest := copy(w.pending, w.pending[n:])
	clear(w.pending[rest:])
	w.pending = w.pending[:rest]
	for i := range w.pending {
		w.pendingIdx[w.pending[i].key] = int32(i)
	}
	var err error
	s.buf, err = wire.AppendBatch(s.buf[:0], &ob.b)
	if err != nil {
		// Only an invalid key could get here; the simulation's keys are all valid.
		s.res.SyncDropped++
		return
	}
	ob.size = len(s.buf)
	w.unacked = ob
}

// onReply folds an acknowledged batch's reply into the gateway's records
// (syncer.onResponse with status 200, then syncer.apply per state).
func (w *worker) onReply(s *sim, c *call) {
	w.inflight = false
	w.unacked = nil
	w.breaker.Success()
	if c.reply.Nodes > 0 {
		w.nodes = int64(c.reply.Nodes)
	}
	now := w.g.local(s)
	rec := &s.rec
	for i := range c.reply.States {
		st := &c.reply.States[i]
		key := c.batch.keys[i]
		if st.Lease > 0 {
			s.res.LeaseGranted += int64(st.Lease)
		}
		w.g.load(key, rec)
		var returned int64
		*rec, returned = lease.ApplyReply(*rec, st, now, w.fleet(s), int64(c.batch.b.Deltas[i].Over))
		if returned > 0 {
			w.record(s, key, &lease.Decision{Returned: returned}, true)
		}
		s.keyOverdraft(key, rec.Overdraft)
		s.buf = w.g.store(key, rec, s.buf)
	}
}

// onFailure handles a failed callout: the batch stays unacked and is resent as is.
func (w *worker) onFailure(s *sim) {
	w.inflight = false
	s.res.SyncFailures++
	was := w.breaker.State()
	w.breaker.Failure(w.g.local(s))
	if was != lease.BreakerOpen && w.breaker.State() == lease.BreakerOpen {
		s.res.BreakerOpens++
	}
}

func (g *gateway) local(s *sim) int64 { return epochUs + s.now + g.skew }

const ruleID = "r"

func keyName(k uint32) string { return "k" + strconv.FormatUint(uint64(k), 10) }

func u32(v int64) uint32 {
	if v < 0 {
		return 0
	}
	if v > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(v)
}
