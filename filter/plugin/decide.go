package plugin

import (
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// bucketOp is one (rule, window) bucket touched by a request.
type bucketOp struct {
	id      string
	a       *rule.Applied
	w       int
	params  algo.Params
	s       slot
	next    lease.Record
	dec     lease.Decision
	written bool
}

// verdict is the outcome of deciding one request on all its buckets.
type verdict struct {
	allowed    bool
	failClosed bool      // a fail-closed rule is degraded: answer 503
	reject     *bucketOp // the enforcing bucket that rejected (429)
	shadow     *bucketOp // a shadow bucket that would have rejected
	degraded   bool
	exhausted  bool // CAS retries ran out (admitted, see maxCASAttempts)
}

func (p *Plugin) env() lease.Env {
	s := &p.cfg.Sync
	return lease.Env{
		Sync:       p.cfg.syncEnabled(),
		Healthy:    p.sync.breaker.Healthy(),
		Nodes:      p.sync.fleet(),
		LeaseTTLUs: s.LeaseTTLMs * 1000,
		IntervalUs: s.IntervalMs * 1000,
	}
}

// buildOps expands the applied rules into one op per window, skipping strict rules
// (decided by the service) when skipStrict is set.
func (p *Plugin) buildOps(applied []rule.Applied, skipStrict bool) []bucketOp {
	ops := p.ops[:0]
	for i := range applied {
		a := &applied[i]
		if skipStrict && a.Rule.Strict && p.cfg.syncEnabled() {
			continue
		}
		for w := range a.Windows {
			ops = append(ops, bucketOp{
				id:     bucketID(&p.idBuf, a.Key, a.Rule.ID, w),
				a:      a,
				w:      w,
				params: a.Windows[w],
			})
		}
	}
	p.ops = ops
	return ops
}

// decide runs every bucket of a request: admitted only if every enforcing bucket admits;
// a rejection consumes nothing from the other buckets (nothing is written until all have
// decided, and buckets written before a CAS conflict are refunded if a retry rejects).
// When commit is false nothing is written (a strict request's local pre-check).
func (p *Plugin) decide(now int64, ops []bucketOp, commit bool) verdict {
	env := p.env()
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		var v verdict
		for i := range ops {
			op := &ops[i]
			if op.written {
				continue
			}
			if err := p.table.load(op.id, now, &op.s); err != nil {
				p.host.Log(LogWarn, "tollgate: shared data: "+err.Error())
			}
			if !op.s.mine && op.s.found {
				p.m.inc(p.m.evictions)
			}
			op.next, op.dec = lease.Decide(op.s.rec, op.params, now, op.a.Cost, env)
		}
		for i := range ops {
			op := &ops[i]
			if op.dec.Degraded {
				v.degraded = true
				if op.a.Rule.Fail == rule.FailClosed && !op.a.Rule.Shadow {
					v.failClosed = true
					v.reject = op
				}
			}
			if !op.dec.Allowed {
				if op.a.Rule.Shadow {
					if v.shadow == nil {
						v.shadow = op
					}
				} else if v.reject == nil {
					v.reject = op
				}
			}
		}
		if v.reject != nil {
			p.undo(now, ops)
			if commit && !v.failClosed {
				p.storeRejection(v.reject)
				p.flushIfAsked(now, ops) // a spent share is refilled by the next reply
			}
			return v
		}
		if !commit {
			v.allowed = true
			return v
		}
		done := true
		for i := range ops {
			op := &ops[i]
			if op.written || !op.dec.Allowed { // a rejecting shadow bucket is not charged
				continue
			}
			op.s.rec = op.next
			ok, err := p.table.store(op.id, &op.s)
			if err != nil || !ok {
				done = false
				continue
			}
			op.written = true
			p.sync.record(op.id, op, &op.dec)
		}
		if done {
			v.allowed = true
			p.flushIfAsked(now, ops)
			return v
		}
	}
	// Contention beyond maxCASAttempts: admit; what was not written is still reported.
	p.m.inc(p.m.casExhausted)
	for i := range ops {
		if op := &ops[i]; !op.written && op.dec.Allowed {
			d := lease.Decision{Over: op.a.Cost}
			p.sync.record(op.id, op, &d)
		}
	}
	return verdict{allowed: true, exhausted: true}
}

// storeRejection persists a rejecting bucket's bookkeeping (the announced Retry-After that
// makes early retries count toward penalties) — one attempt: losing it only delays a
// penalty — and reports the rejection.
func (p *Plugin) storeRejection(op *bucketOp) {
	op.s.rec = op.next
	if ok, err := p.table.store(op.id, &op.s); err == nil && ok {
		p.sync.record(op.id, op, &op.dec)
	}
}

// undo gives back what buckets written in an earlier CAS round consumed.
func (p *Plugin) undo(now int64, ops []bucketOp) {
	for i := range ops {
		op := &ops[i]
		if !op.written {
			continue
		}
		for attempt := 0; attempt < maxCASAttempts; attempt++ {
			if p.table.load(op.id, now, &op.s) != nil || !op.s.mine {
				break
			}
			op.s.rec = lease.Undo(op.s.rec, op.params, now, op.a.Cost, &op.dec)
			if ok, err := p.table.store(op.id, &op.s); err != nil || ok {
				break
			}
		}
		// Tell the service too: the consumption was already recorded for the batch.
		if pd, ok := p.sync.pending[op.id]; ok {
			pd.Leased -= min32(pd.Leased, u32(op.dec.Leased))
			pd.Over -= min32(pd.Over, u32(op.dec.Over))
		}
		op.written = false
	}
}

func (p *Plugin) flushIfAsked(now int64, ops []bucketOp) {
	for i := range ops {
		if ops[i].dec.Flush {
			p.flushFromStream(now)
			return
		}
	}
}

func min32(a, b uint32) uint32 {
	if a < b {
		return a
	}
	return b
}
