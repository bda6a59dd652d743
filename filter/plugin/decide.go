package plugin

import (
	"strings"
	"unsafe"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// bucketOp is one (rule, window) bucket touched by a request.
type bucketOp struct {
	id     string
	a      *rule.Applied
	w      int
	params algo.Params
	s      slot
	next   lease.Record
	// nextBuf holds next's local state (lease.DecideIn), kept with the op across
	// requests so that deciding allocates nothing.
	nextBuf algo.State
	dec     lease.Decision
	// shadow: the rule only reports for this request (rule.Config.Shadowed: a shadow
	// rule, enforcement shadow, or a key outside the rule's rollout).
	shadow  bool
	written bool
	// charged: an acquire admitted the request on this bucket (the service took the
	// cost); it is not decided or written again.
	charged bool
	// delayUs, when > 0, is how long the request waits for this bucket's permit, taken
	// ahead of time (the rule's max_delay).
	delayUs int64
	// leads: this request's callout carries the gateway's acquire for this bucket (it set
	// the record's AcquireUntilUs); the other requests of the bucket wait for its answer.
	leads bool
	// waits: this request waits for another's acquire of this bucket, its cost counted
	// in the record's Waiting.
	waits bool
}

// verdict is the outcome of deciding one request on all its buckets.
type verdict struct {
	allowed    bool
	failClosed bool      // a fail-closed rule is degraded: answer 503
	reject     *bucketOp // the enforcing bucket that rejected (429)
	shadow     *bucketOp // a shadow bucket that would have rejected
	degraded   bool
	// acquire: some enforcing bucket needs the service's answer before the request
	// can be decided (its lease is short); nothing was written.
	acquire   bool
	exhausted bool // CAS retries ran out (decided by the rules' fail mode)
	// delayUs, when > 0, is how long the admitted request waits before it goes on (the
	// longest of its buckets' delays).
	delayUs int64
}

// coldAllowance is what op's bucket may admit without a lease before the service has
// charged it (lease.ColdAllowance), per the rule's cold_start. The allowance is sized by
// the fleet size N, and the bound it keeps (RATIONALE.md §3) needs N at least the number
// of gateways: N is the larger of sync.expected_nodes and the fleet size of the sync
// replies, once this gateway has heard that size for lease.FleetSettleUs (the service counts a
// gateway about two seconds after its first sync, so a fleet that starts together first
// hears sizes too small; lease.AllowanceNodes). Before, N is expected_nodes if the
// operator set it above 1, and otherwise unknown: the allowance is 0 and first requests
// wait for an acquire.
func (p *Plugin) coldAllowance(now int64, op *bucketOp) int64 {
	if !p.cfg.syncEnabled() {
		return 0
	}
	var atLeast int64
	switch op.a.Rule.ColdStart {
	case rule.ColdWait:
		return 0
	case rule.ColdAdmit:
		atLeast = op.a.Cost
	}
	n := int64(p.sync.state.Nodes)
	if n > 0 && p.sync.fleetSinceUs == 0 {
		p.sync.fleetSinceUs = now // the leader learns the size from its own reply
	}
	n = lease.AllowanceNodes(n, now-p.sync.fleetSinceUs, p.cfg.Sync.ExpectedNodes)
	if n == 0 {
		return atLeast
	}
	return lease.ColdAllowance(op.params, n, atLeast)
}

func (p *Plugin) env(now int64, acquireFailed bool) lease.Env {
	e := lease.Env{Sync: p.cfg.syncEnabled(), AcquireFailed: acquireFailed}
	if e.Sync {
		e.Healthy = p.sync.healthy(now)
		e.IntervalUs = p.sync.intervalUs()
		e.RenewUs = renewUs
	}
	return e
}

// buildOps expands the applied rules into one op per window, skipping strict rules
// (decided by the service) when skipStrict is set. The ops and their ids live in
// buffers the next request reuses (see detach).
func (p *Plugin) buildOps(applied []rule.Applied, skipStrict bool) []bucketOp {
	ops := p.ops[:0]
	p.idBuf = p.idBuf[:0]
	for i := range applied {
		a := &applied[i]
		if skipStrict && a.Rule.Strict && p.cfg.syncEnabled() {
			continue
		}
		for w := range a.Windows {
			var op *bucketOp
			ops, op = nextOp(ops)
			start := len(p.idBuf)
			p.idBuf = appendBucketID(p.idBuf, a.Key, a.Rule.ID, a.Tier, w)
			// An id aliases idBuf; if idBuf grows, earlier ids keep the old array, which
			// nothing writes again.
			op.id = unsafe.String(&p.idBuf[start], len(p.idBuf)-start)
			op.a, op.w, op.params = a, w, a.Windows[w]
			op.shadow = p.cfg.Shadowed(a)
		}
	}
	p.ops = ops
	return ops
}

// nextOp extends ops by one zero op that keeps the state buffers an earlier request
// left in that element.
func nextOp(ops []bucketOp) ([]bucketOp, *bucketOp) {
	if len(ops) < cap(ops) {
		ops = ops[:len(ops)+1]
	} else {
		ops = append(ops, bucketOp{})
	}
	op := &ops[len(ops)-1]
	buf, next := op.s.buf, op.nextBuf
	*op = bucketOp{}
	op.s.buf, op.nextBuf = buf, next
	if op.nextBuf == nil {
		op.nextBuf = make(algo.State, 0, algo.MaxStateSize)
	}
	return ops, op
}

// detach gives ops that must outlive the request (a paused request's) their own ids
// and state buffers, instead of the plugin's, which the next request reuses.
func detach(ops []bucketOp) {
	for i := range ops {
		op := &ops[i]
		op.id = strings.Clone(op.id)
		op.s.buf, op.s.rec.Local, op.nextBuf = nil, nil, nil
		op.next.Local = nil
	}
}

// decide runs every bucket of a request: admitted only if every enforcing bucket admits;
// a rejection consumes nothing from the other buckets (nothing is written until all have
// decided, and buckets written before a CAS conflict are given back if a retry rejects).
// When commit is false nothing is written (a paused request's pre-check). A bucket whose
// lease is short asks for an acquire (verdict.acquire) instead of deciding; with
// acquireFailed set (the service did not answer this request's acquire) every bucket
// decides without the service (lease.Env.AcquireFailed).
func (p *Plugin) decide(now int64, ops []bucketOp, commit, acquireFailed bool) verdict {
	env := p.env(now, acquireFailed)
	degraded := env.Sync && (!env.Healthy || env.AcquireFailed)
	for i := range ops {
		// While degraded a rule's degraded_limit replaces its limit; the params are
		// picked before deciding so that undo gives back against the same ones.
		if op := &ops[i]; op.a.Rule.DegradedLimit > 0 && op.w < len(op.a.Windows) {
			op.params = op.a.Windows[op.w]
			if degraded {
				op.params = op.a.Rule.Degraded(op.params)
			}
		}
	}
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		var v verdict
		for i := range ops {
			op := &ops[i]
			if op.written || op.charged {
				continue
			}
			if err := p.table.load(op.id, now, &op.s); err != nil {
				p.host.Log(LogWarn, "tollgate: shared data: "+err.Error())
			}
			if !op.s.mine && op.s.found {
				p.m.inc(p.m.evictions)
			}
			op.next = op.s.rec
			env.ColdAllowance = p.coldAllowance(now, op)
			op.dec = lease.DecideIn(op.nextBuf, &op.next, op.params, now, op.a.Cost, env)
			if op.dec.Acquire && op.shadow {
				// A shadow rule never makes a request wait for the service, and never
				// refuses: a bucket that would acquire decides on the gateway's own state
				// instead, as if the acquire had failed (reported like a degraded
				// decision, which the service charges only up to what the bucket holds).
				// Its verdict is only the shadow flag, so the answer is not marked
				// degraded.
				shadow := env
				shadow.AcquireFailed = true
				op.next = op.s.rec
				op.dec = lease.DecideIn(op.nextBuf, &op.next, op.params, now, op.a.Cost, shadow)
				op.dec.Degraded = false
			}
			op.delayUs = 0
			if op.a.Rule.MaxDelayUs > 0 && !op.shadow {
				p.shape(now, op, env)
			}
		}
		for i := range ops {
			op := &ops[i]
			if op.charged {
				continue
			}
			v.delayUs = max(v.delayUs, op.delayUs) // used only if the request is admitted
			if op.dec.Degraded {
				v.degraded = true
				if op.a.Rule.Fail == rule.FailClosed && !op.shadow {
					v.failClosed = true
					v.reject = op
				}
			}
			switch {
			case op.dec.Acquire:
				if !op.shadow {
					v.acquire = true
				}
			case !op.dec.Allowed:
				if op.shadow {
					if v.shadow == nil {
						v.shadow = op
					}
				} else if v.reject == nil || (!v.failClosed && op.dec.RetryAfterUs > v.reject.dec.RetryAfterUs) {
					// Of the buckets that refuse, the one that admits last answers: its
					// Retry-After is when every bucket admits again, and the headers and
					// the body speak of it.
					v.reject = op
				}
			}
		}
		if v.reject != nil {
			p.undo(now, ops)
			if commit && !v.failClosed {
				p.storeRejection(v.reject)
			}
			return v
		}
		if v.acquire {
			p.undo(now, ops)
			return v
		}
		if !commit {
			v.allowed = true
			return v
		}
		done := true
		for i := range ops {
			op := &ops[i]
			if op.written || op.charged || !op.dec.Allowed { // a rejecting shadow bucket is not charged
				continue
			}
			op.s.rec = op.next
			ok, err := p.table.store(op.id, &op.s)
			if err != nil || !ok {
				done = false
				continue
			}
			op.written = true
			if op.dec.Urgent {
				p.sync.queue(uint32(op.s.n))
			}
			if op.dec.Cold {
				p.m.inc(p.m.coldAdmitted)
			}
		}
		if done {
			v.allowed = true
			return v
		}
	}
	// Contention beyond maxCASAttempts: what was written is given back and the request
	// is decided by its rules' fail mode, like any other moment the limiter cannot
	// record a decision (counted; never admitted uncounted).
	p.m.inc(p.m.casExhausted)
	p.undo(now, ops)
	v := verdict{exhausted: true, degraded: true}
	for i := range ops {
		op := &ops[i]
		if !op.charged && op.a.Rule.Fail == rule.FailClosed && !op.shadow {
			v.failClosed, v.reject = true, op
			return v
		}
	}
	v.allowed = true
	return v
}

// shape turns op's refusal into a delay when its permit comes within the rule's
// max_delay (NGINX limit_req with burst and delay): the permit is taken now, ahead of its
// time, as debt the refill repays (lease.ChargeTo: the lease first, then reported beyond
// it), so the next request's permit comes one permit's time later. A penalty's refusal
// is not shaped (the caller is being slowed on purpose).
//
// With a sync service the slot comes from the lease and the gateway's own queue, not from
// the service alone (RATIONALE.md §3 "Shaping"): the record's local state holds every
// permit this gateway took, those taken ahead included, so its retry time is when this
// gateway's queue has room for one more. A request waits behind that queue even when a
// lease or an acquire would admit it at once (it would jump the queue: the held
// requests' permits are taken from the same refill), and behind the service's retry
// time when the service says the bucket is spent (other gateways' consumption). The
// service caps a bucket's debt at one capacity, so it cannot keep a long queue for the
// gateway: the gateway keeps it.
func (p *Plugin) shape(now int64, op *bucketOp, env lease.Env) {
	d := &op.dec
	if d.Penalized {
		return
	}
	wait := d.RetryAfterUs
	free := d.Allowed || d.Acquire // the lease, or the service, would decide it now
	synced := env.Sync && env.Healthy && !env.AcquireFailed
	if synced {
		wait = algo.RetryAfter(op.params, op.s.rec.Local, now, op.a.Cost)
		if !free {
			// The service's retry time, moved by the permits taken ahead since (below):
			// not lease.Decide's wait, which counts a permit's refill from now.
			wait = max(wait, op.s.rec.RetryUs-now)
		} else if wait == 0 {
			return
		}
	} else if free {
		return
	}
	if wait > op.a.Rule.MaxDelayUs {
		if free {
			p.refuseBehindQueue(now, op, wait)
		}
		return
	}
	before := op.s.rec.Pending
	op.next = lease.ChargeTo(op.nextBuf, op.s.rec, op.params, now, op.a.Cost, env)
	if synced {
		// The permit taken is the one at now+wait: the next one comes a permit's refill
		// after it (lease.ChargeTo counts the debt's refill from now instead).
		op.next.RetryUs = max(op.s.rec.RetryUs, now+wait+lease.RefillUs(op.params, now, op.a.Cost))
	}
	// The reset counts the permit just taken (as every admission's does).
	reset := lease.ResetAt(&op.next, op.params, now)
	if d.Degraded {
		reset = algo.ResetAt(op.params, op.next.Local, now)
	}
	*d = lease.Decision{
		Allowed: true, Degraded: d.Degraded, ResetUs: reset,
		Leased: op.next.Pending.Leased - before.Leased, Over: op.next.Pending.Over - before.Over,
		RateUsed: op.next.Pending.RateUsed - before.RateUsed,
		Urgent:   op.next.Urgent && !op.s.rec.Urgent,
	}
	op.delayUs = max(wait, 1)
}

// refuseBehindQueue refuses a request that the lease (or an acquire) would admit but
// whose slot behind the gateway's own held requests is further than max_delay: as
// without sync, it is told to come back when its permit comes. The refusal is
// recorded as lease.Decide records one (announced retry time, reported for penalties).
func (p *Plugin) refuseBehindQueue(now int64, op *bucketOp, wait int64) {
	rec := op.s.rec
	d := lease.Decision{Rejected: 1, RetryAfterUs: wait, ResetUs: lease.ResetAt(&rec, op.params, now)}
	if now < rec.AnnouncedUs {
		d.Early = 1
	}
	rec.AnnouncedUs = max(rec.AnnouncedUs, now+wait)
	rec.UsedUs = now
	rec.Pending.Rejected++
	rec.Pending.Early += d.Early
	if !rec.Urgent {
		rec.Urgent, d.Urgent = true, true
	}
	op.next, op.dec = rec, d
}

// storeRejection persists a rejecting bucket's bookkeeping (the announced Retry-After
// that makes early retries count toward penalties, the refusal to report) — one attempt:
// losing it only delays a penalty.
func (p *Plugin) storeRejection(op *bucketOp) {
	op.s.rec = op.next
	if ok, err := p.table.store(op.id, &op.s); err == nil && ok && op.dec.Urgent {
		p.sync.queue(uint32(op.s.n))
	}
}

// undo gives back what buckets written in an earlier CAS round consumed.
func (p *Plugin) undo(now int64, ops []bucketOp) {
	for i := range ops {
		op := &ops[i]
		if !op.written || op.charged {
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
		op.written = false
	}
}
