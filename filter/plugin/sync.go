package plugin

import (
	"encoding/binary"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// syncer is one worker's half of the sync protocol (RATIONALE §2): it accumulates what
// this worker consumed per bucket, sends it every tick in one callout, and folds the
// replies into the shared buckets. At most one batch is in flight; a batch that failed is
// resent unchanged (same seq) until acknowledged, so the service can apply it exactly once.
type syncer struct {
	p       *Plugin
	worker  uint32
	seq     uint64
	pending map[string]*wire.Delta // bucket id -> consumption since the last cut
	// unacked is the cut batch awaiting acknowledgement, and its encoding.
	unacked     *wire.Batch
	unackedBody []byte
	inflight    bool
	token       uint32
	nodes       int64
	breaker     lease.Breaker
	// unhealthy is what this worker last added to the breaker_state gauge.
	unhealthy bool
	idBuf     []byte
}

func newSyncer(p *Plugin, worker uint32, now int64) *syncer {
	return &syncer{
		p:       p,
		worker:  worker,
		seq:     uint64(now), // start at the worker's start time: a restart never reuses an id
		pending: map[string]*wire.Delta{},
	}
}

// record adds one decision's consumption to the pending delta of bucket id.
func (s *syncer) record(id string, op *bucketOp, d *lease.Decision) {
	if !s.p.cfg.syncEnabled() {
		return
	}
	pd, ok := s.pending[id]
	if !ok {
		if int64(len(s.pending)) >= s.p.cfg.Sync.MaxPending {
			// Bounded memory: a new bucket beyond the bound is not tracked. Its consumption
			// is then unknown to the fleet (over-admission bounded by what this worker
			// admits for it until the next flush drains the map); counted for operators.
			s.p.m.inc(s.p.m.pendingDropped)
			return
		}
		pd = &wire.Delta{
			Key: op.a.Key, Rule: op.a.Rule.ID, Window: uint8(op.w),
			Algo: uint8(op.params.Kind), Limit: u32(op.params.Limit),
			WindowMs: u32(op.params.WindowUs / 1000), Burst: u32(op.params.Burst),
		}
		if !op.s.rec.Synced() {
			pd.Flags |= wire.FlagNew
		}
		s.pending[id] = pd
		s.p.m.add(s.p.m.pendingDeltas, 1)
	}
	if d.Degraded && d.Over > 0 {
		pd.Flags |= wire.FlagDegraded
	}
	pd.Leased += u32(d.Leased)
	pd.Over += u32(d.Over)
	pd.Returned += u32(d.Returned)
	pd.Rejected += u32(d.Rejected)
	pd.Early += u32(d.Early)
}

// flush sends the unacked batch, or cuts a new one from pending. It is called on every
// tick and early when a bucket is new or ran out of lease.
func (s *syncer) flush(now int64) {
	cfg := &s.p.cfg
	if !cfg.syncEnabled() || s.inflight || !s.breaker.Allow(now) {
		return
	}
	if s.unacked == nil {
		if len(s.pending) == 0 {
			return
		}
		if s.cut(); s.unacked == nil {
			return
		}
	}
	token, err := s.p.host.HTTPCall(cfg.Sync.Cluster, s.callHeaders("/v1/sync"), s.unackedBody, uint32(cfg.Sync.TimeoutMs))
	if err != nil {
		s.p.host.Log(LogWarn, "tollgate: sync callout to "+strconv.Quote(cfg.Sync.Cluster)+": "+err.Error())
		s.failed(now)
		return
	}
	s.inflight, s.token = true, token
	s.p.calls[token] = call{kind: callSync}
	s.p.m.inc(s.p.m.syncSent)
	s.p.m.add(s.p.m.batchDeltas, int64(len(s.unacked.Deltas)))
}

// maxBatchBytes caps one batch's encoding.
const maxBatchBytes = wire.MaxBatchSize / 4

// cut moves up to MaxBatch pending deltas into a new batch with the next seq.
func (s *syncer) cut() {
	cfg := &s.p.cfg
	s.seq++
	b := &wire.Batch{Node: cfg.Sync.Node, Worker: s.worker, Seq: s.seq, RulesVersion: s.p.rulesVersion}
	size := wire.EncodedBatchSize(b)
	for id, d := range s.pending {
		// The rest goes with the next tick. The byte cap keeps a batch of long keys (and
		// its reply, which repeats them) well under the service's wire.MaxBatchSize.
		if int64(len(b.Deltas)) >= cfg.Sync.MaxBatch || size+wire.DeltaSize(d) > maxBatchBytes {
			break
		}
		size += wire.DeltaSize(d)
		b.Deltas = append(b.Deltas, *d)
		delete(s.pending, id)
	}
	// Each worker adds and removes its own: the gauge is the gateway's total.
	s.p.m.add(s.p.m.pendingDeltas, -int64(len(b.Deltas)))
	body, err := wire.AppendBatch(nil, b)
	if err != nil {
		// Only an invalid key (too long) gets here; such deltas cannot be synced at all.
		s.p.host.Log(LogError, "tollgate: encode batch: "+err.Error())
		s.p.m.inc(s.p.m.syncDropped)
		return
	}
	s.unacked, s.unackedBody = b, body
}

func (s *syncer) callHeaders(path string) [][2]string {
	cfg := &s.p.cfg
	return [][2]string{
		{":method", "POST"},
		{":path", path},
		{":authority", cfg.Sync.Authority},
		{"content-type", "application/octet-stream"},
		{"authorization", "Bearer " + cfg.Sync.Secret},
	}
}

// breakerChanged keeps this worker's share of the breaker_state gauge current.
func (s *syncer) breakerChanged() {
	if open := !s.breaker.Healthy(); open != s.unhealthy {
		s.unhealthy = open
		delta := int64(1)
		if !open {
			delta = -1
		}
		s.p.m.add(s.p.m.breakerState, delta)
	}
}

func (s *syncer) failed(now int64) {
	s.p.m.inc(s.p.m.syncFailed)
	s.breaker.Failure(now)
	s.breakerChanged()
}

// onResponse handles the reply to the in-flight batch.
func (s *syncer) onResponse(now int64, headers [][2]string, body []byte) {
	s.inflight = false
	status := headerValue(headers, ":status")
	switch {
	case status == "200":
	case len(status) == 3 && status[0] == '4' && status != "429" && status != "408":
		// The service will never accept this batch (malformed, too large, bad secret):
		// resending it forever would block every later delta. Drop it, loudly.
		s.p.host.Log(LogError, "tollgate: sync batch "+strconv.FormatUint(s.unacked.Seq, 10)+" refused with "+status+": "+string(truncate(body, 200)))
		s.p.m.inc(s.p.m.syncDropped)
		s.unacked, s.unackedBody = nil, nil
		s.failed(now)
		return
	default:
		s.failed(now) // timeout, reset, 5xx: keep the batch, resend the same seq
		return
	}
	var reply wire.Reply
	if err := wire.DecodeReply(body, &reply); err != nil {
		s.p.host.Log(LogError, "tollgate: sync reply: "+err.Error())
		s.failed(now)
		return
	}
	batch := s.unacked
	s.unacked, s.unackedBody = nil, nil
	s.breaker.Success()
	s.breakerChanged()
	if reply.Nodes > 0 && int64(reply.Nodes) != s.nodes {
		s.nodes = int64(reply.Nodes)
		// Every worker of this gateway divides by the fleet size, including those that
		// have not had a reply yet: share it (last writer wins; all write the same value).
		if _, err := s.p.host.SharedSet(nodesKey, binary.AppendUvarint(nil, uint64(reply.Nodes)), 0); err != nil {
			s.p.host.Log(LogWarn, "tollgate: store fleet size: "+err.Error())
		}
	}
	for i := range reply.States {
		st := &reply.States[i]
		// The service answers one state per delta, in order.
		if i < len(batch.Deltas) && batch.Deltas[i].Key == st.Key && batch.Deltas[i].Rule == st.Rule && batch.Deltas[i].Window == st.Window {
			s.apply(now, st, &batch.Deltas[i])
		}
	}
	if reply.RulesVersion > s.p.rulesVersion {
		s.p.rulesBehind(reply.RulesVersion)
	}
}

// apply folds one bucket's authoritative state into shared data (bounded CAS retries).
func (s *syncer) apply(now int64, st *wire.State, sent *wire.Delta) {
	p := s.p
	id := s.bucketID(st.Key, st.Rule, int(st.Window))
	if st.Lease > 0 {
		p.m.add(p.m.leaseGranted, int64(st.Lease))
	}
	var sl slot
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if err := p.table.load(id, now, &sl); err != nil {
			break
		}
		if !sl.mine {
			break // evicted meanwhile: hand the lease back below
		}
		var returned int64
		sl.rec, returned = lease.ApplyReply(sl.rec, st, now, s.fleet(), int64(sent.Over))
		ok, err := p.table.store(id, &sl)
		if err != nil {
			break
		}
		if ok {
			if returned > 0 {
				s.addReturned(id, sent, returned)
			}
			return
		}
	}
	if st.Lease > 0 {
		// The grant could not be stored: give it back so it is not stranded until the
		// service's lease expiry reclaims it.
		s.addReturned(id, sent, int64(st.Lease))
	}
}

// addReturned reports lease handed back for bucket id with the next batch.
func (s *syncer) addReturned(id string, sent *wire.Delta, n int64) {
	pd, ok := s.pending[id]
	if !ok {
		if int64(len(s.pending)) >= s.p.cfg.Sync.MaxPending {
			s.p.m.inc(s.p.m.pendingDropped) // stranded until the service's lease expiry
			return
		}
		pd = &wire.Delta{Key: sent.Key, Rule: sent.Rule, Window: sent.Window,
			Algo: sent.Algo, Limit: sent.Limit, WindowMs: sent.WindowMs, Burst: sent.Burst}
		s.pending[id] = pd
		s.p.m.add(s.p.m.pendingDeltas, 1)
	}
	pd.Returned += u32(n)
}

// nodesKey holds the fleet size from the latest sync reply, for every worker.
const nodesKey = "tg:nodes"

// loadFleet picks up the fleet size another worker learned.
func (s *syncer) loadFleet() {
	v, _, found, err := s.p.host.SharedGet(nodesKey)
	if err != nil || !found {
		return
	}
	if n, k := binary.Uvarint(v); k > 0 && n > 0 {
		s.nodes = int64(n)
	}
}

func (s *syncer) fleet() int64 {
	if s.nodes > 0 {
		return s.nodes
	}
	return s.p.cfg.Sync.ExpectedNodes
}

// bucketID names a bucket: rule, window and caller key, separated by bytes that cannot
// appear in a rule id.
func (s *syncer) bucketID(key, rule string, window int) string {
	return bucketID(&s.idBuf, key, rule, window)
}

func bucketID(buf *[]byte, key, rule string, window int) string {
	b := append((*buf)[:0], rule...)
	b = append(b, 0x1f)
	b = strconv.AppendInt(b, int64(window), 10)
	b = append(b, 0x1f)
	b = append(b, key...)
	*buf = b
	return string(b)
}

func headerValue(h [][2]string, name string) string {
	for _, kv := range h {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func u32(v int64) uint32 {
	if v < 0 {
		return 0
	}
	if v > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(v)
}
