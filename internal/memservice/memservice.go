// Package memservice is the sync service without Redis: it answers the gateways' batches
// and checks as ratelimit/service and ratelimit/store do — the same wire format, the same
// per-delta refusals, the same idempotency per (gateway, seq), and every bucket updated by
// shared/lease.SyncNode with each gateway's own record of its leases of it, the Go twin of
// the Lua script the store runs (the store's differential test keeps the two equal). The fleet simulation runs thousands of gateways
// against it, and native tests of the filter sync against it, where a real Redis would
// only add time and noise. It does not model Redis Cluster shards, failover, or the
// service's rule set (the gateways' parameters are applied as sent).
package memservice

import (
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Service is an in-memory sync service. It is not safe for concurrent use.
type Service struct {
	Config lease.SyncConfig
	// FleetWindowUs: gateways that synced this recently count in Reply.Nodes.
	FleetWindowUs int64
	// RulesVersion is answered in every reply.
	RulesVersion uint64
	// NoPenalty ignores the early-retry counts gateways report, so no caller is put in
	// a progressive-penalty cooldown (a simulation that measures the leases alone).
	NoPenalty bool
	// NoNodeRecords applies deltas with lease.Sync, keeping no record of each gateway's
	// own leases: what the per-gateway bounds cost an honest fleet is measured against it.
	NoNodeRecords bool

	buckets map[bucketKey]*entry
	pens    map[string]*penEntry
	owns    map[ownKey]*ownEntry // each gateway's own leases of a bucket (store.NodeLeaseKey)
	idem    map[string]idemRec
	seen    map[string]int64 // node -> last sync (fleet size)
	nodes   int64            // the fleet size of the batch being applied

	// Counters of the work done (what the store would have sent to Redis).
	Batches, Deltas, Replays, Refused, ScriptCalls int64
	Overshoot, Clamped, Excess, Reclaimed, Granted int64
}

type bucketKey struct {
	key, rule, tier string
	window          uint8
}

type entry struct {
	b      lease.Bucket
	expire int64
}

// ownKey names a gateway's own record of a bucket as the store does: by its node tag.
type ownKey struct {
	bucketKey
	tag uint32
}

type ownEntry struct {
	l      lease.Leases
	expire int64
}

type penEntry struct {
	p      lease.Penalty
	expire int64
}

type idemRec struct {
	seq     uint64
	now     int64
	results []lease.SyncResult
}

// New returns an empty service with cfg (lease.DefaultSyncConfig when zero).
func New(cfg lease.SyncConfig) *Service {
	if cfg == (lease.SyncConfig{}) {
		cfg = lease.DefaultSyncConfig
	}
	return &Service{
		Config: cfg.Normalized(), FleetWindowUs: 5_000_000,
		buckets: map[bucketKey]*entry{}, pens: map[string]*penEntry{}, owns: map[ownKey]*ownEntry{},
		idem: map[string]idemRec{}, seen: map[string]int64{},
	}
}

// maxPerCall is the store's bound on the deltas of one script call.
const maxPerCall = 100

// Apply answers batch b at server time now (µs). check is /v1/check (strict checks and
// acquires: applied once, not recorded for idempotency); otherwise /v1/sync.
func (sv *Service) Apply(b *wire.Batch, now int64, check bool) *wire.Reply {
	sv.Batches++
	sv.seen[b.Node] = now
	rep := &wire.Reply{RulesVersion: sv.RulesVersion, ServerTimeUs: now, Nodes: sv.fleet(now), States: make([]wire.State, len(b.Deltas))}
	sv.nodes = int64(rep.Nodes)
	dup := map[bucketKey]bool{}
	var idx []int
	for i := range b.Deltas {
		d := &b.Deltas[i]
		if check && d.Flags&(wire.FlagStrict|wire.FlagAcquire) == 0 {
			d.Flags |= wire.FlagStrict
		}
		st := &rep.States[i]
		st.Key, st.Rule, st.Window = d.Key, d.Rule, d.Window
		k := bucketKey{d.Key, d.Rule, d.Tier, d.Window}
		why := store.Refusal(d)
		if why == "" && dup[k] {
			why = "bucket appears twice in the batch"
		}
		dup[k] = true
		if why != "" {
			st.Flags, st.Reason = wire.StateRefused, why
			sv.Refused++
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return rep
	}
	// One Redis node: calls of at most maxPerCall deltas, each with its idempotency
	// record (field = the call's position), as the store cuts them.
	for c := 0; c*maxPerCall < len(idx); c++ {
		part := idx[c*maxPerCall : min((c+1)*maxPerCall, len(idx))]
		sv.ScriptCalls++
		id := b.Node + "\x00" + string(rune('0'+c))
		if !check {
			if rec, ok := sv.idem[id]; ok && b.Seq <= rec.seq {
				for j, i := range part {
					r := lease.SyncResult{Replay: true, Allowed: true, NowUs: rec.now}
					if rec.seq == b.Seq && j < len(rec.results) {
						o := rec.results[j]
						r.Grant, r.Held, r.Epoch, r.ValidUs, r.LowWater, r.Rate, r.Stock = o.Grant, o.Held, o.Epoch, o.ValidUs, o.LowWater, o.Rate, o.Stock
					}
					r.RateAnswer = b.Deltas[i].Flags&wire.FlagRate != 0
					r.Fill(&rep.States[i])
					sv.Replays++
				}
				continue
			}
		}
		rec := idemRec{seq: b.Seq, now: now}
		for _, i := range part {
			r := sv.sync(&b.Deltas[i], b.Node, now)
			r.Fill(&rep.States[i])
			rec.results = append(rec.results, r)
		}
		if !check {
			sv.idem[id] = rec
		}
	}
	return rep
}

// sync is one delta: load the bucket, penalty and node records (expired ones read as
// absent, as Redis would), lease.SyncNode, write them back with the script's TTLs.
func (sv *Service) sync(d *wire.Delta, node string, now int64) lease.SyncResult {
	sv.Deltas++
	if sv.NoPenalty {
		d.Early = 0
	}
	k := bucketKey{d.Key, d.Rule, d.Tier, d.Window}
	e := sv.buckets[k]
	if e == nil || now >= e.expire {
		e = &entry{}
		sv.buckets[k] = e
	}
	pe := sv.pens[d.Key]
	var pen lease.Penalty
	if pe != nil && now < pe.expire {
		pen = pe.p
	}
	before := pen
	cfg := sv.Config
	cfg.Nodes = sv.nodes
	cfg.Claimant = lease.NodeTag(node)
	ok := ownKey{k, cfg.Claimant}
	oe := sv.owns[ok]
	var own lease.Leases
	if oe != nil && now < oe.expire {
		own = oe.l
	}
	ownBefore := own
	var r lease.SyncResult
	if sv.NoNodeRecords {
		r = lease.Sync(&e.b, &pen, d, now, cfg)
	} else {
		r = lease.SyncNode(&e.b, &pen, &own, d, now, cfg)
	}
	if own != ownBefore {
		// The script's: deleted once it counts nothing, else kept three epochs.
		if own.Cur == 0 && own.Prev == 0 && own.DemandCur == 0 && own.DemandPrev == 0 && own.RateCur == 0 && own.RatePrev == 0 {
			delete(sv.owns, ok)
		} else {
			if oe == nil {
				oe = &ownEntry{}
				sv.owns[ok] = oe
			}
			oe.l, oe.expire = own, now+3*sv.Config.EpochMs*1000
		}
	}
	e.expire = now + ceilMs(lease.TTLUs(&e.b, d, now, sv.Config))*1000
	if pen != before {
		if pen.Level == 0 && pen.UntilUs == 0 && pen.Nodes == "" && pen.Owner == "" {
			delete(sv.pens, d.Key)
		} else {
			if pe == nil {
				pe = &penEntry{}
				sv.pens[d.Key] = pe
			}
			pe.p = pen
			pe.expire = now + (ceilMs(max(pen.UntilUs, pen.LastUs, pen.OwnUntilUs)-now+sv.Config.PenaltyMaxUs)+1000)*1000
		}
	}
	sv.Overshoot += r.Overshoot
	sv.Clamped += r.Clamped
	sv.Excess += r.Excess
	sv.Reclaimed += r.Reclaimed
	sv.Granted += r.Grant
	return r
}

func (sv *Service) fleet(now int64) uint32 {
	var n uint32
	for node, t := range sv.seen {
		if now-t > sv.FleetWindowUs {
			delete(sv.seen, node)
			continue
		}
		n++
	}
	return max(n, 1)
}

// Bucket returns a copy of a bucket's state (nil if it has none or it expired at now).
func (sv *Service) Bucket(key, rule, tier string, window uint8, now int64) *lease.Bucket {
	e := sv.buckets[bucketKey{key, rule, tier, window}]
	if e == nil || now >= e.expire {
		return nil
	}
	b := e.b
	return &b
}

// Expire drops what Redis would have expired by now (memory only: reads check expiry).
func (sv *Service) Expire(now int64) {
	for k, e := range sv.buckets {
		if now >= e.expire {
			delete(sv.buckets, k)
		}
	}
	for k, p := range sv.pens {
		if now >= p.expire {
			delete(sv.pens, k)
		}
	}
	for k, o := range sv.owns {
		if now >= o.expire {
			delete(sv.owns, k)
		}
	}
}

// Buckets reports how many buckets are alive at now, and the mean and largest size of
// their Redis values (bytes, as the Lua script writes them).
func (sv *Service) Buckets(now int64) (n int, meanBytes float64, maxBytes int) {
	var sum int
	var buf []byte
	for _, e := range sv.buckets {
		if now >= e.expire {
			continue
		}
		buf = e.b.AppendValue(buf[:0])
		n++
		sum += len(buf)
		maxBytes = max(maxBytes, len(buf))
	}
	if n > 0 {
		meanBytes = float64(sum) / float64(n)
	}
	return n, meanBytes, maxBytes
}

func ceilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

// Handle answers one HTTP request of a gateway as the service would: path is
// "/v1/sync" or "/v1/check", body the encoded batch, or wire.AlivePath. It returns the
// status and the encoded reply (or the error text).
func (sv *Service) Handle(path string, body []byte, now int64) (status int, reply []byte) {
	if path == wire.AlivePath {
		return 200, []byte("ok\n") // the service and its store answer
	}
	var b wire.Batch
	if err := wire.DecodeBatch(body, &b); err != nil {
		return 400, []byte(err.Error())
	}
	if b.Node == "" {
		return 400, []byte("invalid batch: node: empty")
	}
	var check bool
	switch path {
	case "/v1/sync":
	case "/v1/check":
		check = true
	default:
		return 404, []byte("not found")
	}
	rep := sv.Apply(&b, now, check)
	out, err := wire.AppendReply(nil, rep)
	if err != nil {
		return 500, []byte(err.Error())
	}
	return 200, out
}
