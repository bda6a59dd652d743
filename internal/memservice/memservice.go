// Package memservice is the sync service without Redis: it answers the gateways' batches
// and checks as ratelimit/service and ratelimit/store do — the same wire format, the same
// per-delta refusals (backend.Screen), the same idempotency per (gateway, seq) and
// chunk of backend.MaxPerCall deltas, the same fleet count, and every bucket updated by
// shared/lease.SyncNode with each gateway's own record of its leases of it, the Go twin
// of the Lua script the store runs (the store's differential test keeps the two equal).
// It implements internal/backend.Backend, and internal/backendtest holds it and the
// store to one contract. The fleet simulation runs thousands of gateways against it,
// and native tests of the filter sync against it, where a real Redis would only add
// time and noise. It does not model Redis Cluster shards, failover, key expiry on a
// clock of its own (expired records read as absent at the caller's now), or the
// service's rule set (the gateways' parameters are applied as sent).
package memservice

import (
	"context"
	"fmt"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Service is an in-memory sync service. It is not safe for concurrent use.
type Service struct {
	Config lease.SyncConfig
	// FleetWindowUs: gateways that synced this recently count in Reply.Nodes.
	FleetWindowUs int64
	// FleetProbationUs: a gateway counts once its syncs span this long (negative:
	// at once). FleetJoinRate gateways join per second at most, FleetMaxNodes in all.
	// The store's settings (backend.DefaultFleet*).
	FleetProbationUs int64
	FleetJoinRate    int
	FleetMaxNodes    int
	// IdempotencyTTLUs is how long a gateway's record of its last batch lives after it.
	IdempotencyTTLUs int64
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
	idem    map[string]*idemRec  // per gateway: its records per chunk (one Redis hash)
	fleet   fleet
	nodes   int64 // the fleet size of the batch being applied

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

// idemRec is a gateway's idempotency hash: one field per chunk, the whole hash expiring
// IdempotencyTTLUs after its last write (the script's PEXPIRE).
type idemRec struct {
	expire int64
	chunks map[int]chunkRec
}

type chunkRec struct {
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
		Config: cfg.Normalized(), FleetWindowUs: backend.DefaultFleetWindow.Microseconds(),
		FleetProbationUs: backend.DefaultFleetProbation.Microseconds(),
		FleetJoinRate:    backend.DefaultFleetJoinRate, FleetMaxNodes: backend.DefaultFleetMaxNodes,
		IdempotencyTTLUs: backend.DefaultIdempotencyTTL.Microseconds(),
		buckets:          map[bucketKey]*entry{}, pens: map[string]*penEntry{}, owns: map[ownKey]*ownEntry{},
		idem: map[string]*idemRec{},
	}
}

// Backend is sv as a backend.Backend whose server time is clock() (µs).
func (sv *Service) Backend(clock func() int64) backend.Backend { return clocked{sv, clock} }

type clocked struct {
	sv    *Service
	clock func() int64
}

func (c clocked) Apply(_ context.Context, b *wire.Batch, o backend.Options) (*backend.Outcome, error) {
	return c.sv.ApplyAt(b, o, c.clock())
}

// Ping: memory always answers.
func (clocked) Ping(context.Context) error { return nil }

// ApplyAt applies batch b as the store's Apply does, at server time now (µs): refusals
// (backend.Screen), the fleet count, then the accepted deltas in calls of at most
// backend.MaxPerCall, each with its idempotency record when o.Idempotent (field = the
// call's position, as the store cuts them on one Redis node).
func (sv *Service) ApplyAt(b *wire.Batch, o backend.Options, now int64) (*backend.Outcome, error) {
	if b.Node == "" {
		return nil, fmt.Errorf("%w: node: empty", backend.ErrInvalid)
	}
	sv.Batches++
	out, ok := backend.Screen(b, &o)
	out.Nodes = sv.fleet.note(sv, b.Node, now)
	sv.nodes = int64(out.Nodes)
	sv.Refused += int64(out.Refused)
	var idx []int
	for i := range ok {
		if ok[i] {
			idx = append(idx, i)
		}
	}
	var rec *idemRec
	if o.Idempotent && len(idx) > 0 {
		rec = sv.idem[b.Node]
		if rec != nil && now >= rec.expire {
			rec = nil
		}
		if rec == nil {
			rec = &idemRec{chunks: map[int]chunkRec{}}
			sv.idem[b.Node] = rec
		}
	}
	for c := 0; c*backend.MaxPerCall < len(idx); c++ {
		part := idx[c*backend.MaxPerCall : min((c+1)*backend.MaxPerCall, len(idx))]
		sv.ScriptCalls++
		if rec != nil {
			if old, found := rec.chunks[c]; found && b.Seq <= old.seq {
				// A replay: what the first call granted, at its time (lease.lua).
				for j, i := range part {
					r := lease.SyncResult{Replay: true, Allowed: true, NowUs: old.now}
					if old.seq == b.Seq && j < len(old.results) {
						o := old.results[j]
						r.Grant, r.Held, r.Epoch, r.ValidUs, r.LowWater, r.Rate, r.Stock = o.Grant, o.Held, o.Epoch, o.ValidUs, o.LowWater, o.Rate, o.Stock
					}
					r.RateAnswer = b.Deltas[i].Flags&wire.FlagRate != 0
					out.Results[i] = r
					r.Fill(&out.States[i])
					sv.Replays++
				}
				out.ServerTimeUs = max(out.ServerTimeUs, old.now)
				continue
			}
		}
		cr := chunkRec{seq: b.Seq, now: now}
		for _, i := range part {
			d := b.Deltas[i]
			skey := d.Key
			if o.StoreKey != nil {
				skey = o.StoreKey(skey)
			}
			if o.NoLease {
				d.Flags |= lease.FlagNoLease
			}
			r := sv.sync(&d, skey, b.Node, now)
			out.Results[i] = r
			r.Fill(&out.States[i])
			cr.results = append(cr.results, r)
		}
		out.ServerTimeUs = max(out.ServerTimeUs, now)
		if rec != nil {
			rec.chunks[c] = cr
			rec.expire = now + sv.IdempotencyTTLUs
		}
	}
	return out, nil
}

// sync is one delta on the buckets of caller key skey (its stored form): load the
// bucket, penalty and node records (expired ones read as absent, as Redis would),
// lease.SyncNode, write them back with the script's TTLs.
func (sv *Service) sync(d *wire.Delta, skey, node string, now int64) lease.SyncResult {
	sv.Deltas++
	if sv.NoPenalty {
		d.Early = 0
	}
	k := bucketKey{skey, d.Rule, d.Tier, d.Window}
	e := sv.buckets[k]
	if e == nil || now >= e.expire {
		e = &entry{}
		sv.buckets[k] = e
	}
	pe := sv.pens[skey]
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
			delete(sv.pens, skey)
		} else {
			if pe == nil {
				pe = &penEntry{}
				sv.pens[skey] = pe
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
	for k, r := range sv.idem {
		if now >= r.expire {
			delete(sv.idem, k)
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
	o := backend.Options{Idempotent: true}
	switch path {
	case "/v1/sync":
	case "/v1/check":
		// The service's /v1/check: every delta a strict check unless it acquires, applied
		// once and not recorded for replay.
		o.Idempotent = false
		for i := range b.Deltas {
			if b.Deltas[i].Flags&(wire.FlagStrict|wire.FlagAcquire) == 0 {
				b.Deltas[i].Flags |= wire.FlagStrict
			}
		}
	default:
		return 404, []byte("not found")
	}
	res, err := sv.ApplyAt(&b, o, now)
	if err != nil {
		return 400, []byte(err.Error())
	}
	rep := &wire.Reply{RulesVersion: sv.RulesVersion, ServerTimeUs: res.ServerTimeUs, Nodes: res.Nodes, States: res.States}
	out, err := wire.AppendReply(nil, rep)
	if err != nil {
		return 500, []byte(err.Error())
	}
	return 200, out
}
