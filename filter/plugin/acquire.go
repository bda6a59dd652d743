package plugin

import (
	"slices"

	"github.com/tollgate-rl/tollgate/shared/lease"
)

// Acquires are shared by the requests of one gateway (RATIONALE.md §2, "Decisions on a
// gateway"): the first request of a bucket that needs the service marks the bucket's
// shared record (lease.Record.AcquireUntilUs) with a bounded CAS and sends the acquire;
// the requests of the same bucket that arrive meanwhile, on any worker, see the mark and
// wait for its answer instead of asking again. The answer lands in the shared record
// (its lease), and each waiting request is decided again against it: on the worker that
// got the answer at once, on the others at their next tick (shapeTickMs while any
// waits). A request whose bucket is still short after the answer leads the next acquire
// itself, at most maxAcquireRounds times.

// maxAcquireRounds bounds the acquires one request leads: beyond it, a bucket still
// short is refused softly (one sync interval).
const maxAcquireRounds = 5

// acquireWaitUs is how long a mark holds, and how long a request waits for another's
// acquire: the callout's timeout and a sync interval. A mark whose worker died expires
// then, and the next request asks itself.
func (p *Plugin) acquireWaitUs() int64 {
	return (p.cfg.Sync.TimeoutMs + p.cfg.Sync.IntervalMs) * 1000
}

// claimAcquire marks op's bucket as acquired by this request, unless another request of
// the gateway asks for it already (then false: the request waits for that answer, and
// its cost joins the record's Waiting). It returns the cost of the other requests that
// wait for the bucket, which the acquire asks the service to cover (wire.Delta.Want).
// CAS contention beyond maxCASAttempts lets the request ask itself (an acquire more,
// never a request less).
func (p *Plugin) claimAcquire(now int64, op *bucketOp) (lead bool, want int64) {
	if op.a.Rule.MaxDelayUs > 0 {
		// A shaped rule's requests each ask for themselves: the answer of a refused
		// acquire within max_delay is a wait for the slot this request takes ahead
		// (Stream.decided), which a request waiting for another's answer would not take,
		// and a burst through one gateway was then refused beyond its first permits
		// (e2e TestShapingWithSync: 13–19 of 21).
		op.leads = true
		return true, 0
	}
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if err := p.table.load(op.id, now, &op.s); err != nil {
			break
		}
		rec := &op.s.rec
		if rec.AcquireUntilUs > now {
			if op.waits {
				return false, 0
			}
			rec.Waiting += op.a.Cost
			ok, err := p.table.store(op.id, &op.s)
			if err != nil || ok {
				op.waits = err == nil
				return false, 0
			}
			continue
		}
		rec.AcquireUntilUs = now + p.acquireWaitUs()
		if op.waits {
			rec.Waiting = max(0, rec.Waiting-op.a.Cost) // it asks now: no longer waiting
		}
		want = rec.Waiting
		if ok, err := p.table.store(op.id, &op.s); err != nil || ok {
			if err == nil {
				op.waits = false
			}
			break
		}
	}
	op.leads = true
	return true, want
}

// unwait takes the cost of every op of a request that waited for another's acquire out
// of its bucket's Waiting (the request was decided, or is gone).
func (p *Plugin) unwait(now int64, ops []bucketOp) {
	for i := range ops {
		op := &ops[i]
		if !op.waits {
			continue
		}
		op.waits = false
		for attempt := 0; attempt < maxCASAttempts; attempt++ {
			if p.table.load(op.id, now, &op.s) != nil || !op.s.mine || op.s.rec.Waiting == 0 {
				break
			}
			op.s.rec.Waiting = max(0, op.s.rec.Waiting-op.a.Cost)
			if ok, err := p.table.store(op.id, &op.s); err != nil || ok {
				break
			}
		}
	}
}

// releaseAcquire clears the mark of every bucket whose acquire ops led (answered, failed
// or abandoned), so that the requests waiting for it decide at their next look.
func (p *Plugin) releaseAcquire(now int64, ops []bucketOp) {
	for i := range ops {
		if ops[i].leads {
			p.releaseOne(now, &ops[i])
		}
	}
}

// releaseOne clears the mark op set on its bucket.
func (p *Plugin) releaseOne(now int64, op *bucketOp) {
	op.leads = false
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if p.table.load(op.id, now, &op.s) != nil || !op.s.mine || op.s.rec.AcquireUntilUs == 0 {
			return
		}
		op.s.rec.AcquireUntilUs = 0
		if ok, err := p.table.store(op.id, &op.s); err != nil || ok {
			return
		}
	}
}

// waitForAcquire parks the paused stream until the acquire another request leads is
// answered.
func (s *Stream) waitForAcquire(now int64) Action {
	p := s.p
	if s.paused.waitSinceUs == 0 {
		s.paused.waitSinceUs = now
	}
	s.paused.askedUs = 0 // no callout of its own is out
	p.m.inc(p.m.acquiresShared)
	p.streams[s.id] = s
	p.waiters = append(p.waiters, s)
	p.setTick(shapeTickMs)
	return Pause
}

// forgetWaiter drops s from the waiting streams.
func (p *Plugin) forgetWaiter(s *Stream) {
	if i := slices.Index(p.waiters, s); i >= 0 {
		p.waiters = slices.Delete(p.waiters, i, i+1)
	}
}

// wakeWaiters decides again every stream waiting for another request's acquire whose
// bucket has changed since (a lease arrived, the mark was cleared or expired).
func (p *Plugin) wakeWaiters(now int64) {
	waiting := append([]*Stream(nil), p.waiters...)
	// Whether a bucket is still being asked for is read once per wake, however many
	// requests wait for it: a waiting request is decided again only once its acquire is
	// answered (the answer clears the mark), not every tick.
	asked := map[string]bool{}
	for _, s := range waiting {
		if s.paused == nil || s.paused.settled {
			p.forgetWaiter(s)
			continue
		}
		if now-s.paused.waitSinceUs <= maxAcquireRounds*p.acquireWaitUs() && p.stillAsked(now, s.paused.ops, asked) {
			continue
		}
		if err := p.host.SetEffectiveContext(s.id); err != nil {
			p.forgetWaiter(s) // the stream is gone
			continue
		}
		if act, decided := s.retryAcquire(now); decided {
			s.paused.settled = true
			if act == Continue {
				if err := p.host.ResumeRequest(); err != nil {
					p.host.Log(LogError, "tollgate: resume: "+err.Error())
				}
			}
		}
	}
	_ = p.host.SetEffectiveContext(p.host.RootID())
}

// stillAsked reports whether every bucket ops wait for is still being asked for by
// another request (its mark holds), caching what it read in asked.
func (p *Plugin) stillAsked(now int64, ops []bucketOp, asked map[string]bool) bool {
	waits := false
	for i := range ops {
		op := &ops[i]
		if !op.waits {
			continue
		}
		waits = true
		held, ok := asked[op.id]
		if !ok {
			var sl slot
			held = p.table.load(op.id, now, &sl) == nil && sl.mine && sl.rec.AcquireUntilUs > now
			asked[op.id] = held
		}
		if !held {
			return false
		}
	}
	return waits
}

// retryAcquire decides a waiting stream again. It reports whether the request was
// answered (admitted, refused, or decided without the service after waiting too long);
// otherwise it still waits, or now leads the next acquire.
func (s *Stream) retryAcquire(now int64) (Action, bool) {
	p := s.p
	st := s.paused
	v := p.decide(now, st.ops, true, false)
	if !v.acquire {
		p.forgetWaiter(s)
		p.unwait(now, st.ops)
		return s.answer(now, v, st.ops, nil), true
	}
	for i := range st.ops {
		if op := &st.ops[i]; op.dec.Acquire && !op.shadow && op.s.rec.AcquireUntilUs <= now {
			// The acquire it waited for was answered (and its lease taken by others) or
			// its mark expired: this request asks, or, having asked enough, is refused.
			p.forgetWaiter(s)
			if st.rounds >= maxAcquireRounds {
				p.unwait(now, st.ops)
				return s.answer(now, s.stillShort(now, v), st.ops, nil), true
			}
			act := s.ask(now)
			return act, !s.pending()
		}
	}
	if now-st.waitSinceUs > maxAcquireRounds*p.acquireWaitUs() {
		// The acquires it waited for kept coming back without its lease for longer than
		// its own would have taken: decided like a request whose acquire went unanswered.
		p.forgetWaiter(s)
		p.m.inc(p.m.checkFailed)
		return s.unavailable(now), true
	}
	return Pause, false
}

// stillShort refuses softly (one interval) a request whose bucket is still short after
// maxAcquireRounds acquires.
func (s *Stream) stillShort(now int64, v verdict) verdict {
	for i := range s.paused.ops {
		if op := &s.paused.ops[i]; op.dec.Acquire && !op.shadow {
			op.dec = lease.Decision{Rejected: 1, RetryAfterUs: s.p.cfg.Sync.IntervalMs * 1000, ResetUs: lease.ResetAt(&op.s.rec, op.params, now)}
			v.reject = op
			break
		}
	}
	return v
}

// acquireDone clears what an acquire's answer settles in op's record: the mark.
func acquireDone(rec *lease.Record) { rec.AcquireUntilUs = 0 }
