package rls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A replica of the service decides ShouldRateLimit as a gateway decides HTTP requests
// (RATIONALE.md §2, §3 "Envoy's native filter on the same quota"): against leases it
// holds in memory, one lease.Record per bucket, with the same code (lease.DecideIn,
// Cut, ApplyReply, the acquire functions). Every sync interval one batch reports what
// the buckets consumed through the store's batch path (service.Sync: idempotent,
// leases granted and renewed); a bucket without a usable lease asks the service for
// one (an acquire), one acquire per bucket at a time, the other calls of that bucket
// waiting for its answer. Each replica is a node of the fleet under its own node id,
// counted in the fleet size like any gateway, so the fleet bounds hold with replicas
// and gateways on one quota.

// Timing of a replica's sync, the gateways' defaults (shared/rule sync defaults).
const (
	// renewUs: a lease used since its last report is renewed this long before it ends.
	renewUs = 2_000_000
	// staleUs: consumption no valid lease covers waits at most this long unreported.
	staleUs = 10_000_000
	// idleUs: a bucket holding nothing, unused this long, leaves the table.
	idleUs = 60_000_000
	// breakerFailures: failed syncs in a row that make the replica decide degraded
	// whatever else it heard.
	breakerFailures = 3
	// maxAcquireRounds bounds the acquires one call leads or waits for; beyond it a
	// bucket still short refuses softly (one interval), as a gateway's does.
	maxAcquireRounds = 5
	// maxBatch bounds one sync batch (what is left waits for the next interval).
	maxBatch = 1000
	// maxBuckets bounds the table (about 100 MB): a bucket that finds it full is a strict
	// check in Redis instead, so callers with ever new keys cost Redis work, not memory.
	maxBuckets = 250_000
)

// LeaseOptions configure a replica's leases.
type LeaseOptions struct {
	// Off makes every descriptor a strict check in Redis (the behaviour before leases,
	// kept as a baseline and for operators who want it).
	Off bool
	// Interval is the sync interval (default 100 ms).
	Interval time.Duration
	// Node is the replica's node id (default "tollgate-rls-<host>-<random>": ids must
	// differ between replicas, or their batches would be taken for replays).
	Node string
	// ExpectedNodes sizes cold-start allowances before the fleet size is heard
	// (sync.expected_nodes of the gateways).
	ExpectedNodes int64
}

func (o LeaseOptions) normalized() LeaseOptions {
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Node == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		o.Node = "tollgate-rls-" + host + "-" + hex.EncodeToString(b[:])
		if len(o.Node) > wire.MaxStringLen {
			o.Node = o.Node[len(o.Node)-wire.MaxStringLen:]
		}
	}
	return o
}

// bucketID names one bucket: caller key, rule, tier, window.
type bucketID struct {
	key, rule, tier string
	w               uint8
}

// entry is one bucket's record and what its acquires share.
type entry struct {
	rec lease.Record
	prm algo.Params // the parameters of its last decision (what a report is sent under)
	// acq is closed when the acquire in flight for this bucket is answered (nil: none).
	acq chan struct{}
	// waiting is the cost of the calls waiting for that answer: the next acquire asks
	// the service to cover it (wire.Delta.Want).
	waiting int64
	// lent is lease taken out for acquires in flight (item.part) and not reported yet:
	// what an acquire that does not admit can give back.
	lent int64
}

// leases is a replica's table of buckets and its sync loop.
type leases struct {
	svc *service.Service
	log *slog.Logger
	m   *metrics
	o   LeaseOptions
	iv  int64 // interval, µs

	mu      sync.Mutex
	buckets map[bucketID]*entry
	max     int // maxBuckets
	// Health: the last answer from Redis (a sync or an acquire) and the failed syncs
	// since.
	lastOKUs int64
	failures int
	// nodes is the fleet size of the last reply, heard since nodesSinceUs.
	nodes        int64
	nodesSinceUs int64
	// acquireSeq numbers acquire batches (checks are not recorded for replay; the seq
	// marks which cut an answer belongs to).
	acquireSeq uint64

	// The sync loop's own state (its goroutine only).
	seq       uint64
	batch     wire.Batch // unacknowledged batch, resent unchanged (same seq) until answered
	ids       []bucketID
	stop      chan struct{}
	closeOnce sync.Once
	done      chan struct{}
}

func newLeases(svc *service.Service, log *slog.Logger, m *metrics, o LeaseOptions) *leases {
	o = o.normalized()
	now := nowUs()
	l := &leases{svc: svc, log: log, m: m, o: o, iv: o.Interval.Microseconds(), buckets: map[bucketID]*entry{}, max: maxBuckets,
		lastOKUs: now, seq: uint64(now), acquireSeq: uint64(now), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

func nowUs() int64 { return time.Now().UnixMicro() }

// healthy: Redis answered lately. A replica whose syncs fail decides degraded after
// breakerFailures of them, or after one once Redis has answered nothing for two
// intervals (a gateway's rule, RATIONALE.md §2).
func (l *leases) healthy(now int64) bool {
	return l.failures == 0 || (l.failures < breakerFailures && now-l.lastOKUs < 2*l.iv)
}

// coldAllowance is a bucket's cold-start allowance, as a gateway sizes it.
func (l *leases) coldAllowance(now int64, it *item) int64 {
	var atLeast int64
	switch it.rule.ColdStart {
	case rule.ColdWait:
		return 0
	case rule.ColdAdmit:
		atLeast = it.cost
	}
	n := lease.AllowanceNodes(l.nodes, now-l.nodesSinceUs, l.o.ExpectedNodes)
	if n == 0 {
		return atLeast
	}
	return lease.ColdAllowance(it.prm, n, atLeast)
}

func (l *leases) heardNodes(now int64, n uint32) {
	if n <= 0 {
		return
	}
	if l.nodes == 0 {
		l.nodesSinceUs = now
	}
	l.nodes = int64(n)
}

// item is one bucket of one call to decide from leases.
type item struct {
	id     bucketID
	rule   *rule.Rule
	prm    algo.Params
	cost   int64
	shadow bool

	dec lease.Decision
	// st, when set (fromService), is the service's answer to this call's acquire: a
	// refusal the reply shows as the service said it.
	st          wire.State
	fromService bool
	charged     bool // an acquire admitted it: the service took the cost
	failed      bool // its acquire got no answer: decided without the service
	leads       bool
	cut         bool
	seq         uint32 // the acquire batch's (low 32 bits), which marks its cut
	part        int64  // of the cost, taken out of the lease for the acquire
	sent        wire.Delta
}

// decide decides items from leases: admitted only if every enforcing bucket admits; a
// refusal takes nothing from the others. A bucket whose lease is short waits for an
// acquire (its own, or another call's of the same bucket) and is decided again, at
// most maxAcquireRounds times. With commit false nothing is written (the call is
// refused by a strict rule already).
func (l *leases) decide(ctx context.Context, items []item, commit bool) {
	nexts := make([]lease.Record, len(items))
	for round := 0; ; round++ {
		now := nowUs()
		var waits []chan struct{}
		var lead []int
		l.mu.Lock()
		healthy := l.healthy(now)
		refused, short := false, false
		for i := range items {
			it := &items[i]
			if it.charged || it.fromService {
				continue
			}
			e := l.entry(it)
			env := lease.Env{Sync: true, Healthy: healthy, IntervalUs: l.iv, RenewUs: renewUs, AcquireFailed: it.failed}
			env.ColdAllowance = l.coldAllowance(now, it)
			prm := it.prm
			if it.rule.DegradedLimit > 0 && (!healthy || it.failed) {
				prm = it.rule.Degraded(prm)
			}
			nexts[i] = e.rec
			it.dec = lease.DecideIn(nil, &nexts[i], prm, now, it.cost, env)
			if it.dec.Acquire && it.shadow {
				// A shadow rule never waits for the service and never refuses: it decides
				// on the replica's own state, as a gateway's does.
				env.AcquireFailed = true
				nexts[i] = e.rec
				it.dec = lease.DecideIn(nil, &nexts[i], prm, now, it.cost, env)
				it.dec.Degraded = false
			}
			if r := &nexts[i]; !it.dec.Allowed && !it.dec.Acquire && !it.dec.Degraded {
				// A refusal says what the replica could still admit, as an admission
				// does (lease.Decide leaves it 0).
				held := int64(0)
				if now < r.LeaseUntilUs {
					held = r.LeaseLeft
				}
				it.dec.Remaining = max(0, held+max(0, r.GlobalRemaining))
			}
			switch {
			case it.dec.Acquire:
				short = true
			case !it.dec.Allowed && !it.shadow:
				refused = true
			}
		}
		switch {
		case refused || !commit:
			// Each refusing bucket keeps its refusal's bookkeeping (the announced retry
			// time that makes early retries count, the refusal to report); nothing else
			// is written.
			for i := range items {
				it := &items[i]
				if commit && !it.charged && !it.fromService && !it.dec.Allowed && !it.dec.Acquire && !it.shadow {
					l.store(it, nexts[i])
				}
			}
			l.mu.Unlock()
			return
		case !short:
			for i := range items {
				it := &items[i]
				if !it.charged && !it.fromService && it.dec.Allowed {
					l.store(it, nexts[i])
				}
			}
			l.mu.Unlock()
			return
		case round >= maxAcquireRounds:
			for i := range items {
				if it := &items[i]; it.dec.Acquire {
					it.dec = lease.Decision{Rejected: 1, RetryAfterUs: l.iv, ResetUs: lease.ResetAt(&nexts[i], it.prm, now)}
				}
			}
			l.mu.Unlock()
			return
		}
		// Acquires: one per bucket at a time; a call whose bucket is being asked for
		// waits for that answer.
		for i := range items {
			it := &items[i]
			if !it.dec.Acquire {
				continue
			}
			e := l.buckets[it.id]
			if e.acq != nil {
				e.waiting += it.cost
				waits = append(waits, e.acq)
				continue
			}
			e.acq = make(chan struct{})
			it.leads = true
			lead = append(lead, i)
		}
		var b wire.Batch
		if len(lead) > 0 {
			l.acquireSeq++
			b = wire.Batch{Node: l.o.Node, Seq: l.acquireSeq}
			for _, i := range lead {
				it := &items[i]
				e := l.buckets[it.id]
				var elapsed int64
				if e.rec.Synced() {
					elapsed = (now - e.rec.SyncedUs) / 1000
				}
				d := deltaOf(it.id, it.prm)
				d.Flags, d.Over, d.ElapsedMs = wire.FlagAcquire, u32(it.cost), u32(elapsed)
				if lease.RefillUs(it.prm, now, it.prm.Capacity()) <= l.iv {
					// A bucket that refills within an interval: the acquire carries what
					// was consumed out of the lease since the last report, so the service
					// frees that reservation before it decides (lease.CutAcquire).
					if rec, ok := lease.CutAcquire(e.rec, now, uint32(b.Seq), &d); ok {
						e.rec, it.cut, it.seq = rec, true, uint32(b.Seq)
					}
				}
				if r := &e.rec; !it.cut && r.Synced() && now < r.LeaseUntilUs && r.LeaseLeft > 0 && r.LeaseLeft < it.cost {
					// The lease holds part of the cost: that part comes out of it and the
					// acquire asks only for the rest. Asking for the whole cost would be
					// decided against what the bucket holds beyond every lease, this
					// replica's own included, and refuse a call the bucket can admit. The
					// part goes back if the acquire does not admit.
					it.part = r.LeaseLeft
					r.LeaseLeft = 0
					r.Pending.Leased += it.part
					e.lent += it.part
					d.Over = u32(it.cost - it.part)
				}
				if e.waiting > 0 {
					d.Flags |= wire.FlagWant
					d.Want = u32(min(e.waiting, it.prm.Capacity()))
					e.waiting = 0
				}
				it.sent = d
				b.Deltas = append(b.Deltas, d)
			}
		}
		l.mu.Unlock()
		if len(lead) > 0 {
			l.m.acquires.Inc()
			out, err := l.svc.Check(ctx, "rls", &b)
			if l.answered(items, lead, out, err) {
				return // the service refused a bucket: the call is refused
			}
		}
		if len(waits) > 0 {
			l.m.acquiresShared.Inc()
			timer := time.NewTimer(l.svc.BatchTimeout() + l.o.Interval)
			for _, ch := range waits {
				select {
				case <-ch:
				case <-timer.C:
				case <-ctx.Done():
				}
			}
			timer.Stop()
		}
	}
}

// answered folds the answers to the acquires items[lead] led into their records and
// reports whether one refused (the call is then refused; buckets an acquire admitted
// keep what it charged, as a gateway's do).
func (l *leases) answered(items []item, lead []int, out *store.Outcome, err error) bool {
	now := nowUs()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.lastOKUs = now
		l.heardNodes(now, out.Nodes)
	}
	refused := false
	for j, i := range lead {
		it := &items[i]
		e := l.buckets[it.id]
		it.leads = false
		close(e.acq)
		e.acq = nil
		var st *wire.State
		if out != nil && j < len(out.States) {
			st = &out.States[j]
		}
		if st == nil || st.ServerMs == 0 || st.Flags&wire.StateRefused != 0 {
			// No answer: what the acquire carried goes back to the next batch, and the
			// bucket is decided without the service.
			if it.cut {
				e.rec = lease.UncutAcquire(e.rec, &it.sent, it.seq)
			}
			e.giveBack(it)
			it.failed = true
			continue
		}
		rec := lease.ApplyAcquire(e.rec, st, now)
		if it.cut {
			rec = lease.ApplyAcquireCut(e.rec, st, &it.sent, it.seq, now)
		}
		if st.Lease > 0 {
			l.m.leaseGranted.Add(float64(st.Lease))
		}
		if st.Allowed() {
			e.lent = max(0, e.lent-it.part)
			it.part = 0
			rec = lease.Acquired(rec, it.prm, now, it.cost)
			it.charged = true
			it.dec = lease.Decision{Allowed: true, Remaining: max(0, rec.LeaseLeft+max(0, rec.GlobalRemaining)), ResetUs: lease.ResetAt(&rec, it.prm, now)}
		} else {
			if announced := now + int64(st.RetryInMs)*1000; announced > rec.AnnouncedUs {
				rec.AnnouncedUs = announced
			}
			rec = lease.BatchRetry(rec, it.prm, rec.Pending.Rejected, now, l.iv)
			e.rec = rec
			e.giveBack(it)
			rec = e.rec
			it.st, it.fromService = *st, true
			// What this call could still have: the bucket's unreserved permits and this
			// replica's own lease (a lease decision's remaining).
			if rec.LeaseLeft > 0 && now < rec.LeaseUntilUs {
				it.st.Remaining += rec.LeaseLeft
			}
			refused = refused || !it.shadow
		}
		e.rec = rec
	}
	return refused
}

// giveBack returns to the lease what it.part took out of it for an acquire that did not
// admit, unless a batch has reported it as consumed meanwhile (then the service has
// charged it, and it stays spent).
func (e *entry) giveBack(it *item) {
	back := min(it.part, e.lent, e.rec.Pending.Leased)
	it.part = 0
	if back <= 0 {
		return
	}
	e.lent -= back
	e.rec.LeaseLeft += back
	e.rec.Pending.Leased -= back
}

// held reports, for each id, whether the table holds it or has room for it.
func (l *leases) held(ids []bucketID) []bool {
	out := make([]bool, len(ids))
	l.mu.Lock()
	defer l.mu.Unlock()
	room := l.max - len(l.buckets)
	for i, id := range ids {
		if _, ok := l.buckets[id]; ok {
			out[i] = true
		} else if room > 0 {
			out[i] = true
			room--
		}
	}
	return out
}

// entry returns it's bucket, created empty when new, with the parameters of this
// decision.
func (l *leases) entry(it *item) *entry {
	e := l.buckets[it.id]
	if e == nil {
		e = &entry{}
		l.buckets[it.id] = e
	}
	e.prm = it.prm
	return e
}

func (l *leases) store(it *item, rec lease.Record) {
	l.buckets[it.id].rec = rec
}

// deltaOf is a delta of bucket id under parameters p.
func deltaOf(id bucketID, p algo.Params) wire.Delta {
	return wire.Delta{Key: id.key, Rule: id.rule, Tier: id.tier, Window: id.w,
		Algo: uint8(p.Kind), Limit: u32(p.Limit), WindowMs: u32(p.WindowUs / 1000), Burst: u32(p.Burst)}
}

// run is the sync loop: one batch per interval, until close.
func (l *leases) run() {
	defer close(l.done)
	t := time.NewTicker(l.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			l.flush()
			return
		case <-t.C:
			l.sync(false)
		}
	}
}

// flush reports everything and gives every lease back (the replica stops): the
// service frees those reservations now instead of at their epoch's end.
func (l *leases) flush() {
	l.mu.Lock()
	for _, e := range l.buckets {
		if e.rec.LeaseLeft > 0 {
			e.rec.Pending.Returned += e.rec.LeaseLeft
			e.rec.LeaseLeft = 0
			e.rec.Urgent = true
		}
	}
	l.mu.Unlock()
	for i := 0; i < 2; i++ { // an unacknowledged batch first, then the returns
		l.sync(true)
	}
}

// sync sends the next batch (or resends the unacknowledged one) and applies its reply.
func (l *leases) sync(final bool) {
	now := nowUs()
	if len(l.batch.Deltas) == 0 {
		l.cut(now, final)
	}
	b := &l.batch
	ctx := context.Background()
	out, err := l.svc.Sync(ctx, "rls_sync", b, !final)
	now = nowUs()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || len(out.States) != len(b.Deltas) {
		l.failures++
		l.m.syncs.WithLabelValues("failed").Inc()
		if l.failures == breakerFailures {
			l.log.Warn("rls leases: syncs failing, deciding degraded", "node", l.o.Node, "err", err)
		}
		return // resent unchanged (same seq) at the next interval
	}
	l.m.syncs.WithLabelValues("ok").Inc()
	l.failures, l.lastOKUs = 0, now
	l.heardNodes(now, out.Nodes)
	seq := uint32(b.Seq)
	for i := range out.States {
		st, d := &out.States[i], &b.Deltas[i]
		e := l.buckets[l.ids[i]]
		if e == nil || st.Key != d.Key || st.Rule != d.Rule || st.Window != d.Window {
			continue
		}
		if st.Flags&wire.StateRefused != 0 {
			// The service will never take this delta (its rule is gone): forget it.
			if e.rec.CutSeq == max(seq, 1) {
				e.rec.CutSeq = 0
			}
			continue
		}
		if st.Lease > 0 {
			l.m.leaseGranted.Add(float64(st.Lease))
		}
		rec, returned := lease.ApplyReply(e.rec, st, d, seq, now)
		rec = lease.BatchRetry(rec, lease.ParamsOf(d), int64(d.Rejected)+rec.Pending.Rejected, now, l.iv)
		if returned > 0 {
			rec.Urgent = true
		}
		e.rec = rec
	}
	b.Deltas = b.Deltas[:0]
	l.ids = l.ids[:0]
}

// cut builds the next batch from the due buckets (a heartbeat, with no delta, when none
// is due: the fleet keeps counting the replica) and drops buckets that hold nothing.
func (l *leases) cut(now int64, final bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq = max(l.seq+1, uint64(now))
	l.batch = wire.Batch{Node: l.o.Node, Seq: l.seq, Deltas: l.batch.Deltas[:0]}
	l.ids = l.ids[:0]
	seq := uint32(l.seq)
	for id, e := range l.buckets {
		if len(l.batch.Deltas) >= maxBatch {
			break
		}
		if e.acq == nil && e.rec.Idle(now, idleUs) {
			delete(l.buckets, id)
			continue
		}
		if !e.rec.Due(now, staleUs, 0, renewUs, seq) && !(final && e.rec.Urgent) {
			continue
		}
		d := deltaOf(id, e.prm)
		e.rec = lease.Cut(e.rec, e.prm, now, seq, &d)
		e.lent = 0 // reported as consumed: charged, whatever the acquires in flight get
		d.Key, d.Rule, d.Tier, d.Window = id.key, id.rule, id.tier, id.w
		d.Algo, d.Limit, d.WindowMs, d.Burst = uint8(e.prm.Kind), u32(e.prm.Limit), u32(e.prm.WindowUs/1000), u32(e.prm.Burst)
		l.batch.Deltas = append(l.batch.Deltas, d)
		l.ids = append(l.ids, id)
	}
	if len(l.batch.Deltas) == 0 {
		l.seq-- // a heartbeat records nothing: its seq is used again
	}
}

// close stops the sync loop after a last report that gives every lease back.
func (l *leases) close() {
	l.closeOnce.Do(func() { close(l.stop) })
	<-l.done
}
