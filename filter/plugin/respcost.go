package plugin

import (
	"unsafe"

	"github.com/tollgate-rl/tollgate/filter/respcost"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// A rule with cost_from charges its request's estimate on admission and, when the
// response ends, what the response reports beyond it (rule.CostFrom). The stream keeps
// the buckets to charge from the answer to the end of the response.

// respCharge is one bucket an admitted request's response is charged to.
type respCharge struct {
	off, n   int // the bucket id: respState.ids[off:off+n]
	from     *rule.CostFrom
	params   algo.Params
	estimate int64
}

// respState is a stream's response-cost state (the zero value: nothing to charge). Its
// buffers stay with the Stream, which later requests reuse.
type respState struct {
	charges []respCharge
	ids     []byte
	// scan follows the body for the path of the first charge that reads the body.
	scan     respcost.Scanner
	scanning bool
	path     string
}

func (r *respState) id(c *respCharge) string {
	return unsafe.String(unsafe.SliceData(r.ids[c.off:]), c.n)
}

func (r *respState) reset() {
	r.charges, r.ids, r.scanning, r.path = r.charges[:0], r.ids[:0], false, ""
}

// keepCharges records the admitted request's buckets whose rules take their cost from
// the response: those it was charged on (a rejecting shadow bucket was not).
func (s *Stream) keepCharges(ops []bucketOp) {
	r := &s.resp
	for i := range ops {
		op := &ops[i]
		if op.a.Rule.CostFrom == nil || !(op.written || op.charged) {
			continue
		}
		r.charges = append(r.charges, respCharge{off: len(r.ids), n: len(op.id), from: op.a.Rule.CostFrom, params: op.params, estimate: op.a.Cost})
		r.ids = append(r.ids, op.id...)
	}
}

// responseHeaders settles the charges that read a header and starts following the body
// for those that read it.
func (s *Stream) responseHeaders(now int64) {
	p, r := s.p, &s.resp
	for i := range r.charges {
		c := &r.charges[i]
		if c.from.Header == "" {
			if !r.scanning && r.path == "" {
				ct, _ := p.host.ResponseHeader("content-type")
				r.scan.Reset(c.from.Body, c.from.MaxBodyBytes, isEventStream(ct))
				r.scanning, r.path = true, c.from.Body
			}
			continue
		}
		v, found := p.host.ResponseHeader(c.from.Header)
		cost, ok := respcost.ParseCost([]byte(v))
		if !found || !ok {
			p.m.inc(p.m.responseCostMissing)
			cost = c.estimate
		}
		p.charge(now, r.id(c), c.params, cost-c.estimate)
		c.from = nil // settled
	}
}

// OnResponseBody follows the body for a rule that reads its cost there; every other
// stream returns at once.
func (s *Stream) OnResponseBody(size int, _ bool) Action {
	r := &s.resp
	if !r.scanning {
		return Continue
	}
	for off := 0; off < size; {
		b, err := s.p.host.ResponseBody(off, size-off)
		if err != nil || len(b) == 0 {
			// The rest of this chunk cannot be read: what follows it no longer lines up
			// with what was read, so the body's cost is given up on (the estimate stands).
			r.scanning = false
			return Continue
		}
		r.scan.Write(b)
		off += len(b)
	}
	return Continue
}

// responseEnd settles the charges that read the body, at the end of the stream (the
// body ended, or the stream was reset or timed out: what was read so far is all there is).
func (s *Stream) responseEnd(now int64) {
	p, r := s.p, &s.resp
	cost, ok := int64(0), false
	if r.scanning {
		cost, ok = r.scan.Result()
	}
	for i := range r.charges {
		c := &r.charges[i]
		if c.from == nil {
			continue // a header charge, settled
		}
		got := cost
		if c.from.Body != r.path || !ok || !r.scanning {
			// A second body path on one request is not followed (one scan per stream).
			p.m.inc(p.m.responseCostMissing)
			got = c.estimate
		}
		p.charge(now, r.id(c), c.params, got-c.estimate)
	}
	r.reset()
}

// charge adds n permits to bucket id (nothing for n <= 0: the estimate is the minimum).
// The bucket is loaded, charged and stored with bounded CAS retries; a charge that cannot
// be stored is dropped and counted like any other contention.
func (p *Plugin) charge(now int64, id string, params algo.Params, n int64) {
	if n <= 0 {
		return
	}
	env := p.env(now, false)
	sl := &p.chargeSlot
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if err := p.table.load(id, now, sl); err != nil {
			p.host.Log(LogWarn, "tollgate: shared data: "+err.Error())
			return
		}
		wasUrgent := sl.rec.Urgent
		p.chargeBuf = p.chargeBuf[:0]
		if cap(p.chargeBuf) == 0 {
			p.chargeBuf = make(algo.State, 0, algo.MaxStateSize)
		}
		next := lease.ChargeTo(p.chargeBuf, sl.rec, params, now, n, env)
		// The slot's buffer and chargeBuf swap roles, like a decision's nextBuf.
		p.chargeBuf, sl.buf = sl.buf, next.Local[:0]
		sl.rec = next
		ok, err := p.table.store(id, sl)
		if err != nil {
			return
		}
		if ok {
			p.m.add(p.m.responseCost, n)
			if sl.rec.Urgent && !wasUrgent {
				p.sync.queue(uint32(sl.n))
			}
			return
		}
	}
	p.m.inc(p.m.casExhausted)
}

// isEventStream reports whether a content-type is text/event-stream.
func isEventStream(ct string) bool { return hasPrefixFold(ct, "text/event-stream") }
