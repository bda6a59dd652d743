package plugin

import (
	"slices"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/refusal"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Stream is the context of one HTTP request. Streams are reused: after OnDone, which
// must be a stream's last callback, the same Stream serves a later request.
type Stream struct {
	p  *Plugin
	id uint32
	// headers are added to the response in OnResponseHeaders (every answer carries
	// them); their values live in hb.
	headers [][2]string
	hb      header.Builder
	// replied is set once the filter sent a local reply (which must not get the headers
	// a second time if the proxy runs the reply through this filter's response path).
	replied bool
	// grpc is set for a gRPC request (content-type application/grpc...): its refusals
	// are gRPC statuses, not JSON bodies.
	grpc bool
	// hdrs are the request headers, valid while OnRequestHeaders runs.
	hdrs     [][2]string
	headerFn func(string) (string, bool) // s.header, bound once per Stream
	// paused holds a paused request's state while the service decides.
	paused *pausedState
	// resp holds what the response is charged (rules with cost_from).
	resp respState
	// releaseUs, when > 0, is when the request, held for its permit (max_delay), goes on.
	releaseUs int64
	// held are the slots of rules with max_in_flight the request holds until it ends
	// (their ids in heldIDs); both keep their memory across reuses of the Stream.
	held    []heldSlot
	heldIDs []byte
	// inflightShadow is a shadow rule whose max_in_flight would have refused the request.
	inflightShadow string
}

// pausedState is a request waiting for the service: its strict rules' checks and the
// acquires of buckets whose lease was short (RATIONALE.md §2).
type pausedState struct {
	applied []rule.Applied
	ops     []bucketOp       // the request's local buckets, decided again on resume
	strict  []*rule.Applied  // strict rules, decided by the service
	checks  []checkRef       // what each delta of the callout asks
	done    map[int]struct{} // ops an acquire admitted (their cost is charged already)
	body    []byte           // the callout's batch, kept for resends
	resends uint8
	settled bool // answered without the service (it was found down meanwhile)
	// asked: the strict checks went out (they are asked once; an acquire may be asked
	// again when the bucket is still short after the answer).
	asked bool
	// rounds counts the acquires this request led; waitSinceUs is when it began waiting
	// for another request's acquire (0: it does not wait).
	rounds      uint8
	waitSinceUs int64
	// askedUs is when the callout the request waits for went out (0: none is out).
	askedUs int64
}

// A paused request's decision counts its acquires among the buckets that admitted it.

// checkRef ties a delta of a paused request's callout to what it decides.
type checkRef struct {
	op     int           // index into ops of an acquire, or -1
	strict *rule.Applied // the strict rule (op == -1)
	w      int
	// cut: the acquire carries its bucket's consumption since the last report
	// (lease.CutAcquire), sent is its delta and seq the callout's seq.
	cut  bool
	seq  uint32
	sent wire.Delta
}

// OnRequestHeaders decides the request.
func (s *Stream) OnRequestHeaders(int, bool) Action {
	p := s.p
	if p.cfg.Config == nil {
		return Continue
	}
	now := p.host.NowUs()
	hdrs, err := p.host.RequestHeaders()
	if err != nil {
		p.host.Log(LogWarn, "tollgate: request headers: "+err.Error())
		return Continue // the limiter must not become the outage
	}
	s.hdrs = hdrs
	act := s.decideRequest(now, hdrs)
	s.hdrs = nil // the host may reuse their memory
	return act
}

// decideRequest decides the request whose headers s.hdrs holds.
func (s *Stream) decideRequest(now int64, hdrs [][2]string) Action {
	p := s.p
	s.grpc = isGRPC(headerValue(hdrs, "content-type"))
	req := rule.Request{
		Method: headerValue(hdrs, ":method"),
		Host:   headerValue(hdrs, ":authority"),
		// With the query: rules match the normalised path, which drops it, and query
		// conditions and keys read it.
		Path:     headerValue(hdrs, ":path"),
		Header:   s.headerFn,
		Peer:     p.peerFn,     // read only if a key source or list needs the address
		Property: p.propertyFn, // read only by metadata and filter_state key sources
		KeyBuf:   &p.propBuf,   // composite and lower-cased keys are built here
	}

	p.propBuf = p.propBuf[:0]
	switch lv := p.checkLists(&req); lv.Verdict {
	case rule.ListDeny:
		p.m.inc(p.m.denied)
		s.setDecision(decDenied, nil, 0, -1, false)
		s.hb.Reset()
		if s.grpc {
			s.replyGRPC(403, "tollgate_denied", refusal.GRPCPermissionDenied, p.grpcDenied(lv.Pattern))
			return Pause
		}
		s.reply(403, "tollgate_denied", p.bodyDenied(lv.Pattern, lv.ByAddress))
		return Pause
	case rule.ListAllow:
		p.m.inc(p.m.bypassed)
		s.setDecision(decBypassed, nil, 0, -1, false)
		s.hb.Reset()
		s.hb.Bypass()
		s.headers = s.hb.Pairs()
		return Continue
	}

	if p.cfg.Off() {
		return Continue // enforcement off: no rule applies
	}
	applied := p.cfg.Apply(&req, p.applied[:0])
	p.applied = applied
	if len(applied) == 0 {
		return Continue
	}
	if a := p.missingKey(applied); a != nil {
		s.setDecision(decKeyMissing, a, 0, -1, false)
		s.hb.Reset()
		if s.grpc {
			s.replyGRPC(uint32(a.Refuse), "tollgate_key_missing", refusal.GRPCStatusFor(a.Refuse), p.grpcKeyMissing(a))
			return Pause
		}
		s.reply(uint32(a.Refuse), "tollgate_key_missing", p.bodyKeyMissing(a))
		return Pause
	}
	if applied = withoutRefusals(applied); len(applied) == 0 {
		return Continue
	}
	if p.cfg.inFlight {
		// Slots first: a request refused for concurrency spends no rate-limit permit,
		// and one the rate limit refuses gives its slots back at once (answer).
		if act, done := s.takeSlots(now, applied); done {
			return act
		}
	}
	if p.cfg.syncEnabled() {
		for i := range applied {
			if applied[i].Rule.Strict {
				return s.pause(now, applied)
			}
		}
	}
	ops := p.buildOps(applied, false)
	v := p.decide(now, ops, true, false)
	if v.acquire {
		return s.pause(now, applied)
	}
	return s.answer(now, v, ops, nil)
}

// header looks a request header up (names are lower-case in Envoy's header maps).
func (s *Stream) header(name string) (string, bool) {
	for _, kv := range s.hdrs {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// answer turns a verdict into a local reply or the headers for the upstream's response.
func (s *Stream) answer(now int64, v verdict, ops []bucketOp, states []wire.State) Action {
	p := s.p
	s.counted(&v, ops, states)
	switch {
	case v.failClosed:
		s.releaseSlots()
		p.m.inc(p.m.failClosed)
		p.m.inc(p.m.degraded)
		retry := max(p.sync.state.OpenUntilUs-now, p.cfg.Sync.IntervalMs*1000)
		secs := p.retryAfter(retry)
		s.hb.Reset()
		s.hb.Refused(p.views(now, ops, states, nil), true, secs, v.reject.a.Rule.ID) // the rule's fail mode refused, not its window
		if s.grpc {
			s.replyGRPC(503, "tollgate_unavailable", refusal.GRPCUnavailable, p.grpcUnavailable(v.reject.a.Rule.ID, secs))
			return Pause
		}
		s.reply(503, "tollgate_unavailable", p.body503(v.reject.a.Rule.ID, secs))
		return Pause
	case v.reject != nil:
		s.releaseSlots()
		op := v.reject
		p.m.inc(p.m.rejected)
		if op.dec.Penalized {
			p.m.inc(p.m.penalized)
		}
		secs := p.retryAfter(op.dec.RetryAfterUs)
		s.hb.Reset()
		s.hb.Refused(p.views(now, ops, states, op), v.degraded, secs, op.a.Rule.ID)
		if s.grpc {
			s.replyGRPC(429, "tollgate_rate_limited", refusal.GRPCResourceExhausted, p.grpc429(op.a.Rule.ID, secs))
			return Pause
		}
		s.reply(429, "tollgate_rate_limited", p.body429(op, secs))
		return Pause
	}
	p.m.inc(p.m.allowed)
	if v.degraded {
		p.m.inc(p.m.degraded)
	}
	s.hb.Reset()
	s.hb.Limits(p.views(now, ops, states, nil), v.degraded)
	if v.shadow != nil {
		p.m.inc(p.m.shadowRejected)
		s.hb.Rule(header.XShadow, v.shadow.a.Rule.ID)
	} else if s.inflightShadow != "" {
		s.hb.Rule(header.XShadow, s.inflightShadow)
	}
	s.headers = s.hb.Pairs()
	if p.cfg.costFrom {
		s.keepCharges(ops)
	}
	if v.delayUs > 0 {
		return s.delay(now + v.delayUs)
	}
	return Continue
}

// reply sends a local reply with the headers in s.hb and a JSON body.
func (s *Stream) reply(status uint32, details string, body []byte) {
	s.hb.Add(header.ContentType, header.ContentTypeJSON)
	if err := s.p.host.SendLocalReply(status, details, body, s.hb.Pairs(), -1); err != nil {
		s.p.host.Log(LogError, "tollgate: local reply: "+err.Error())
	}
	s.replied = true
}

// replyGRPC refuses a gRPC request: the proxy answers trailers-only (HTTP 200,
// content-type application/grpc, grpc-status, grpc-message from message) with the
// headers in s.hb. status is the HTTP status the same refusal has for HTTP clients
// (proxies log it as the response code details' status).
func (s *Stream) replyGRPC(status uint32, details string, grpcStatus int32, message []byte) {
	if err := s.p.host.SendLocalReply(status, details, message, s.hb.Pairs(), grpcStatus); err != nil {
		s.p.host.Log(LogError, "tollgate: local reply: "+err.Error())
	}
	s.replied = true
}

// isGRPC reports whether a request's content-type is gRPC's as Envoy decides it
// (Grpc::Common::hasGrpcContentType): application/grpc, or followed by '+' or ';'
// (application/grpc+proto). Envoy answers such a request's local reply trailers-only.
func isGRPC(ct string) bool {
	const grpc = "application/grpc"
	if !hasPrefixFold(ct, grpc) {
		return false
	}
	return len(ct) == len(grpc) || ct[len(grpc)] == '+' || ct[len(grpc)] == ';'
}

// hasPrefixFold reports whether s begins with prefix, ignoring ASCII case (media types).
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// OnResponseHeaders adds the rate-limit headers decided on the request.
func (s *Stream) OnResponseHeaders(int, bool) Action {
	if s.replied {
		return Continue
	}
	if err := s.p.host.AddResponseHeaders(s.headers); err != nil {
		s.p.host.Log(LogWarn, "tollgate: add response header: "+err.Error())
	}
	if len(s.resp.charges) > 0 {
		s.responseHeaders(s.p.host.NowUs())
	}
	return Continue
}

// OnLog is a no-op: Tollgate logs through metrics.
func (s *Stream) OnLog() {}

// ID is the stream's context id.
func (s *Stream) ID() uint32 { return s.id }

// OnDone gives back the request's slots, forgets the stream and keeps it for a later
// request. Envoy calls it when the stream is destroyed, whatever ended it: the response
// completed, a local reply (the router's timeout included), or a reset by either side.
func (s *Stream) OnDone() {
	p := s.p
	if s.releaseUs > 0 {
		p.forgetDelayed(s) // reset while held: its permit stays taken, as NGINX's does
	}
	if len(s.resp.charges) > 0 {
		s.responseEnd(p.host.NowUs())
	}
	if len(s.held) > 0 {
		s.releaseSlots()
	}
	if s.paused != nil {
		delete(p.streams, s.id)
		if s.paused.askedUs > 0 {
			// The host cancels the callouts of a stream it ends: no answer will come.
			p.forgetCalls(s.id)
		}
		if !s.paused.settled {
			p.forgetWaiter(s)
			p.releaseAcquire(p.host.NowUs(), s.paused.ops) // reset while it waited
			p.unwait(p.host.NowUs(), s.paused.ops)
		}
	}
	s.id, s.headers, s.replied, s.hdrs, s.paused, s.grpc = 0, nil, false, nil, nil, false
	s.inflightShadow = ""
	if len(p.free) < maxFreeStreams {
		p.free = append(p.free, s)
	}
}

// pause holds the request and asks the service: its strict rules' checks, and an
// acquire for each bucket whose lease cannot cover the cost. The request's other buckets
// are checked first, without consuming: a request they refuse is answered at once.
func (s *Stream) pause(now int64, applied []rule.Applied) Action {
	p := s.p
	st := &pausedState{applied: append([]rule.Applied(nil), applied...)}
	for i := range st.applied {
		// Keys may alias the request headers, which the host reuses.
		st.applied[i].Key = strings.Clone(st.applied[i].Key)
		if st.applied[i].Rule.Strict {
			st.strict = append(st.strict, &st.applied[i])
		}
	}
	st.ops = append([]bucketOp(nil), p.buildOps(st.applied, true)...)
	detach(st.ops)
	v := p.decide(now, st.ops, false, false)
	if v.reject != nil {
		return s.answer(now, v, st.ops, nil)
	}
	s.paused = st
	if !p.sync.healthy(now) {
		return s.unavailable(now)
	}
	return s.ask(now)
}

// ask sends the paused request's callout: its strict checks (once), and an acquire for
// each bucket whose lease cannot cover the cost, unless another request of the gateway
// asks for that bucket already (acquire.go). A request all of whose buckets are being
// asked for by others sends nothing and waits for their answers.
func (s *Stream) ask(now int64) Action {
	p := s.p
	st := s.paused
	st.checks = st.checks[:0]
	p.strictSeq++
	b := wire.Batch{Node: p.node, Seq: p.strictSeq, RulesVersion: p.rulesVersion}
	if !st.asked {
		for _, a := range st.strict {
			for w, prm := range a.Windows {
				b.Deltas = append(b.Deltas, checkDelta(a, w, prm, wire.FlagStrict, 0))
				st.checks = append(st.checks, checkRef{op: -1, strict: a, w: w})
			}
		}
		st.asked = true
	}
	joined := false
	for i := range st.ops {
		op := &st.ops[i]
		if !op.dec.Acquire || op.charged {
			continue
		}
		lead, want := p.claimAcquire(now, op)
		if !lead {
			joined = true
			continue
		}
		var elapsed int64
		if op.s.rec.Synced() {
			elapsed = (now - op.s.rec.SyncedUs) / 1000
		}
		d := checkDelta(op.a, op.w, op.params, wire.FlagAcquire, elapsed)
		cut := p.cutAcquire(now, op, uint32(b.Seq), &d)
		if want > 0 {
			d.Flags |= wire.FlagWant
			d.Want = u32(min(want, op.params.Capacity()))
		}
		b.Deltas = append(b.Deltas, d)
		st.checks = append(st.checks, checkRef{op: i, cut: cut, seq: uint32(b.Seq), sent: d})
	}
	if len(b.Deltas) == 0 {
		if joined {
			return s.waitForAcquire(now)
		}
		// Nothing to ask (the buckets were decided meanwhile): decide now.
		st.settled = true
		return s.answer(now, p.decide(now, st.ops, true, false), st.ops, nil)
	}
	acquires := len(st.checks) > 0 && st.checks[len(st.checks)-1].op >= 0
	if acquires {
		st.rounds++
	}
	body, err := wire.AppendBatch(nil, &b)
	if err == nil {
		var token uint32
		token, err = p.host.HTTPCall(p.cfg.Sync.Cluster, p.callHeaders("/v1/check"), body, uint32(p.cfg.Sync.TimeoutMs))
		if err == nil {
			if len(st.strict) > 0 && len(st.checks) > 0 && st.checks[0].op < 0 {
				p.m.inc(p.m.strictChecks)
				for _, a := range st.strict {
					p.countRule(a, statStrictChecks)
				}
			}
			if acquires {
				p.m.inc(p.m.acquires)
			}
			p.calls[token] = call{kind: callStrict, stream: s.id}
			p.streams[s.id] = s
			st.body = body
			st.askedUs = now
			return Pause
		}
	}
	p.host.Log(LogWarn, "tollgate: check: "+err.Error())
	return s.unavailable(now)
}

// maxCheckResends bounds the resends of a paused request's checks after connection
// failures.
const maxCheckResends = 2

// connectFailure reports whether a callout's 503 is Envoy's local reply for a
// connection that could not be made (the request never left the proxy), as opposed to
// the service's own 503 or a reset after the request was sent.
func connectFailure(body []byte) bool {
	const reason = "reset reason: connection failure"
	return len(body) >= len(reason) && string(body[len(body)-len(reason):]) == reason
}

// checkDelta asks the service for one window of a applied rule (cost a.Cost).
func checkDelta(a *rule.Applied, w int, prm algo.Params, flags uint8, elapsedMs int64) wire.Delta {
	return wire.Delta{
		Key: a.Key, Rule: a.Rule.ID, Tier: a.Tier, Window: uint8(w), Flags: flags, Over: u32(a.Cost),
		ElapsedMs: u32(elapsedMs), Algo: uint8(prm.Kind), Limit: u32(prm.Limit),
		WindowMs: u32(prm.WindowUs / 1000), Burst: u32(prm.Burst),
	}
}

// strictFailed counts a failed check against each strict rule it asked about.
func (s *Stream) strictFailed() {
	for _, a := range s.paused.strict {
		s.p.countRule(a, statStrictFailed)
	}
}

// unavailable decides a paused request without the service: a fail-closed strict rule
// answers 503; everything else is decided locally, degraded.
func (s *Stream) unavailable(now int64) Action {
	p := s.p
	st := s.paused
	p.uncutAcquires(now, st)
	p.releaseAcquire(now, st.ops)
	p.unwait(now, st.ops)
	p.forgetWaiter(s)
	for _, a := range st.strict {
		if a.Rule.Fail == rule.FailClosed && !p.cfg.Shadowed(a) {
			op := bucketOp{a: a}
			return s.answer(now, verdict{failClosed: true, reject: &op, degraded: true}, st.ops, nil)
		}
	}
	v := p.decide(now, st.ops, true, true)
	v.degraded = true
	return s.answer(now, v, st.ops, nil)
}

// pending reports whether the paused request still waits: for its own callout, or for
// another request's acquire.
func (s *Stream) pending() bool {
	st := s.paused
	return st != nil && !st.settled && (st.askedUs > 0 || slices.Contains(s.p.waiters, s))
}

// settle answers a paused request without waiting for its callout any longer: the
// service was found down while it waited, and a request must not wait out the callout
// timeout to learn what every other request of this gateway is already answered
// (degraded, or 503 for a fail-closed strict rule). A late answer is then ignored.
func (s *Stream) settle(now int64) {
	p := s.p
	if s.paused == nil || s.paused.settled {
		return
	}
	if err := p.host.SetEffectiveContext(s.id); err != nil {
		return
	}
	s.paused.settled = true
	p.m.inc(p.m.checkFailed)
	s.strictFailed()
	if s.unavailable(now) == Continue {
		if err := p.host.ResumeRequest(); err != nil {
			p.host.Log(LogError, "tollgate: resume: "+err.Error())
		}
	}
}

// onCheckResponse resumes or refuses a paused request.
func (s *Stream) onCheckResponse(now int64, headers [][2]string, body []byte) {
	p := s.p
	if s.paused == nil || s.paused.settled {
		return
	}
	if err := p.host.SetEffectiveContext(s.id); err != nil {
		p.host.Log(LogError, "tollgate: resume: "+err.Error())
		return
	}
	if headerValue(headers, ":status") == "503" && connectFailure(body) && s.paused.resends < maxCheckResends {
		// The connection to the service failed: nothing reached it, so the same checks
		// are sent again, at once. Behind a cluster of several replicas the resend goes
		// to the next one (unless another callout of this worker took that turn, hence
		// two), so a dead replica does not turn this request degraded. Any other failure
		// may have been applied (checks are not recorded for replay): not resent.
		s.paused.resends++
		if token, err := p.host.HTTPCall(p.cfg.Sync.Cluster, p.callHeaders("/v1/check"), s.paused.body, uint32(p.cfg.Sync.TimeoutMs)); err == nil {
			p.calls[token] = call{kind: callStrict, stream: s.id}
			s.paused.askedUs = now
			return
		}
	}
	s.paused.askedUs = 0 // answered
	var reply wire.Reply
	var act Action
	if headerValue(headers, ":status") != "200" || wire.DecodeReply(body, &reply) != nil || len(reply.States) != len(s.paused.checks) {
		p.m.inc(p.m.checkFailed)
		s.strictFailed()
		act = s.unavailable(now)
	} else {
		p.sync.answered(now)
		act = s.decided(now, reply.States)
	}
	if s.pending() {
		// Still short: it asked again, or waits for another request's acquire of a
		// bucket; that answer decides it.
		return
	}
	// Decided: a tick that finds the service down must not answer it again (it may be
	// held for its permit, or on its way upstream).
	s.paused.settled = true
	if act == Continue {
		if err := p.host.ResumeRequest(); err != nil {
			p.host.Log(LogError, "tollgate: resume: "+err.Error())
		}
	}
}

// decided applies the service's answers: a refused strict check or acquire refuses the
// request (429); acquires that were granted bring their leases into the records and
// count as admitted; the other buckets are then decided locally.
func (s *Stream) decided(now int64, states []wire.State) Action {
	p := s.p
	st := s.paused
	var refusal *bucketOp
	for i := range states {
		c := st.checks[i]
		ws := &states[i]
		if c.op >= 0 {
			op := &st.ops[c.op]
			p.acquired(now, op, ws, &c)
			if ws.Allowed() {
				if st.done == nil {
					st.done = map[int]struct{}{}
				}
				st.done[c.op] = struct{}{}
				op.charged = true // by the service: decide and undo skip it
				continue
			}
			if shapes(op, ws) {
				continue // waits for its slot: decided below, with the lease, as without sync
			}
			op.dec = refusedBy(now, ws, op.params, &op.s.rec)
			if refusal == nil || op.dec.RetryAfterUs > refusal.dec.RetryAfterUs {
				refusal = op
			}
			continue
		}
		if !ws.Allowed() && !p.cfg.Shadowed(c.strict) {
			a := c.strict
			prm := a.Windows[c.w%len(a.Windows)]
			if d := refusedBy(now, ws, prm, nil); refusal == nil || d.RetryAfterUs > refusal.dec.RetryAfterUs {
				refusal = &bucketOp{a: a, w: c.w, params: prm, dec: d}
			}
		}
	}
	if refusal != nil {
		// Buckets an acquire admitted keep what it charged: the service took it already.
		return s.answer(now, verdict{reject: refusal}, st.ops, states)
	}
	v := p.decide(now, st.ops, true, false)
	if v.acquire {
		// A bucket is still short after the answer (other requests took the lease it
		// brought, or another request of the gateway asks for it meanwhile): wait for
		// that answer, or ask again, up to maxAcquireRounds acquires per request; then
		// refuse softly (one interval).
		if st.rounds < maxAcquireRounds {
			return s.ask(now)
		}
		v = s.stillShort(now, v)
	}
	return s.answer(now, v, st.ops, states)
}

// refusedBy is the decision a refusing state of a bucket of parameters prm stands for;
// rec is the bucket's record with the state applied (nil: a strict rule's, which has
// none). Its reset and retry times come from where every answer's do (lease.ResetAt,
// lease.WindowEnd).
func refusedBy(now int64, st *wire.State, prm algo.Params, rec *lease.Record) lease.Decision {
	d := lease.Decision{
		Rejected: 1, RetryAfterUs: int64(st.RetryInMs) * 1000, ResetUs: stateResetAt(now, st, prm),
		PenaltyLevel: st.PenaltyLevel, Penalized: st.PenaltyInMs > 0, PenaltyLeftUs: int64(st.PenaltyInMs) * 1000,
		Remaining: max(0, st.Remaining),
	}
	if rec != nil {
		d.ResetUs = lease.ResetAt(rec, prm, now)
	}
	if end, ok := lease.WindowEnd(prm, now); ok {
		d.RetryAfterUs = min(d.RetryAfterUs, end-now)
	}
	if d.Penalized && d.PenaltyLeftUs > d.RetryAfterUs {
		d.RetryAfterUs = d.PenaltyLeftUs
	}
	return d
}

// cutAcquire makes the acquire delta d of op carry its bucket's consumption since the
// last report (lease.CutAcquire, bounded CAS) when the bucket refills its whole
// capacity within a sync interval, and reports whether it did. Such a bucket's spent
// leases would reserve it all until the next report; on longer windows what an acquire
// carries changes little, and the lease renewed on it, sized by the consumption it
// carries, when the bucket is scarcest, reserves away what other gateways' acquires
// need (bench/sim, a client at 90 % of its limit over 8 gateways: false rejections
// 0.13 % against 0.09 %, or with grants sized without it three times the requests held
// for acquires).
func (p *Plugin) cutAcquire(now int64, op *bucketOp, seq uint32, d *wire.Delta) bool {
	if lease.RefillUs(op.params, now, op.params.Capacity()) > p.cfg.Sync.IntervalMs*1000 {
		return false
	}
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if p.table.load(op.id, now, &op.s) != nil {
			return false
		}
		rec, ok := lease.CutAcquire(op.s.rec, now, seq, d)
		if !ok {
			return false
		}
		op.s.rec = rec
		if stored, err := p.table.store(op.id, &op.s); err != nil {
			break
		} else if stored {
			return true
		}
	}
	d.Leased, d.Returned, d.Held, d.Epoch = 0, 0, 0, 0
	return false
}

// uncutAcquires gives the consumption the paused request's acquires carried back to
// their records (lease.UncutAcquire): they got no answer, and the next batch reports it.
func (p *Plugin) uncutAcquires(now int64, st *pausedState) {
	for i := range st.checks {
		c := &st.checks[i]
		if !c.cut {
			continue
		}
		c.cut = false
		op := &st.ops[c.op]
		for attempt := 0; attempt < maxCASAttempts; attempt++ {
			if p.table.load(op.id, now, &op.s) != nil {
				break
			}
			op.s.rec = lease.UncutAcquire(op.s.rec, &c.sent, c.seq)
			if ok, err := p.table.store(op.id, &op.s); err != nil || ok {
				break
			}
		}
	}
}

// acquired folds an acquire's answer into the bucket's record (bounded CAS).
func (p *Plugin) acquired(now int64, op *bucketOp, st *wire.State, c *checkRef) {
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if p.table.load(op.id, now, &op.s) != nil {
			return
		}
		rec := lease.ApplyAcquire(op.s.rec, st, now)
		if c.cut {
			rec = lease.ApplyAcquireCut(op.s.rec, st, &c.sent, c.seq, now)
		}
		if op.leads {
			acquireDone(&rec)
		}
		rec.LeaseUntilUs = min(rec.LeaseUntilUs, now+p.cfg.Sync.LeaseTTLMs*1000)
		if st.Allowed() {
			rec = lease.Acquired(rec, op.params, now, op.a.Cost)
			op.dec = lease.Decision{Allowed: true, Remaining: max(0, rec.LeaseLeft+max(0, rec.GlobalRemaining)), ResetUs: lease.ResetAt(&rec, op.params, now)}
		} else if announced := now + int64(st.RetryInMs)*1000; announced > rec.AnnouncedUs {
			rec.AnnouncedUs = announced
		}
		// A gateway held above its limit asks again after a sync interval's refill, not at
		// every permit (syncer.batchRetry). On a spent bucket with several gateways, each
		// also waits a random part of the time the fleet would take to get one permit
		// each, so that they do not all ask at once; a fixed or calendar window gives its
		// whole limit back at once at its end (the retry time), so a sync interval's
		// spread is enough there (one permit's refill would be days for a small monthly
		// quota). Not for a shaped rule: its refusals within max_delay are waits for a
		// slot in this gateway's own queue (Plugin.shape), which the spread would push
		// back by up to the fleet's time for a permit each — on a fleet of 41, a burst
		// of 30 was admitted 2 instead of 21, the rest told to come back in 4 to 55 s.
		rec = p.sync.batchRetry(rec, op.params, rec.Pending.Rejected, now)
		if n := int64(p.sync.state.Nodes); n > 1 && st.Remaining < 1 && rec.RetryUs > now && op.a.Rule.MaxDelayUs == 0 {
			spread := n * lease.RefillUs(op.params, now, 1)
			if op.params.Kind.ResetsAtBoundary() {
				spread = min(spread, p.cfg.Sync.IntervalMs*1000)
			}
			rec.RetryUs += int64(p.nextRand() % uint64(min(max(spread, 1), 1<<40)))
		}
		op.s.rec = rec
		if ok, err := p.table.store(op.id, &op.s); err != nil || ok {
			op.leads = false
			if st.Lease > 0 {
				p.m.add(p.m.leaseGranted, int64(st.Lease))
			}
			return
		}
	}
	p.releaseOne(now, op) // the lease could not be written: at least the mark goes
}
