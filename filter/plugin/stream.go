package plugin

import (
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Stream is the context of one HTTP request.
type Stream struct {
	p  *Plugin
	id uint32
	// headers are added to the response in OnResponseHeaders (every answer carries them).
	headers [][2]string
	// replied is set once the filter sent a local reply (which must not get the headers
	// a second time if the proxy runs the reply through this filter's response path).
	replied bool
	hdrs    [][2]string
	// strict holds a paused request's state while the service decides.
	strict *strictState
}

type strictState struct {
	applied []rule.Applied
	ops     []bucketOp // the request's non-strict buckets, decided again on resume
	strict  []*rule.Applied
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
	req := rule.Request{
		Method: headerValue(hdrs, ":method"),
		Host:   headerValue(hdrs, ":authority"),
		Path:   stripQuery(headerValue(hdrs, ":path")),
		Header: s.header,
	}
	req.Peer = p.peerFn // read only if a key source or list needs the address
	p.curStream = s.id

	switch lv := p.checkLists(&req); lv.Verdict {
	case rule.ListDeny:
		p.m.inc(p.m.denied)
		s.reply(403, "tollgate_denied", bodyDenied(lv.Pattern, lv.ByAddress), nil)
		return Pause
	case rule.ListAllow:
		p.m.inc(p.m.bypassed)
		s.headers = appendBypass(s.headers[:0])
		return Continue
	}

	applied := p.cfg.Apply(&req, p.applied[:0])
	p.applied = applied
	if len(applied) == 0 {
		return Continue
	}
	if p.cfg.syncEnabled() {
		for i := range applied {
			if applied[i].Rule.Strict {
				return s.startStrict(now, applied)
			}
		}
	}
	ops := p.buildOps(applied, false)
	v := p.decide(now, ops, true)
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
func (s *Stream) answer(now int64, v verdict, ops []bucketOp, strictStates []wire.State) Action {
	p := s.p
	switch {
	case v.failClosed:
		p.m.inc(p.m.failClosed)
		p.m.inc(p.m.degraded)
		retry := p.sync.breaker.OpenUntil() - now
		if retry < p.cfg.Sync.IntervalMs*1000 {
			retry = p.cfg.Sync.IntervalMs * 1000
		}
		secs := p.retryAfter(retry)
		hdr := header.AppendRefused(nil, p.views(now, ops, strictStates), true, secs, v.reject.a.Rule.ID)
		s.reply(503, "tollgate_unavailable", body503(v.reject.a.Rule.ID, secs), hdr)
		return Pause
	case v.reject != nil:
		op := v.reject
		p.m.inc(p.m.rejected)
		p.m.ruleRejected(op.a.Rule.ID)
		if op.dec.Penalized {
			p.m.inc(p.m.penalized)
		}
		secs := p.retryAfter(op.dec.RetryAfterUs)
		hdr := header.AppendRefused(nil, p.views(now, ops, strictStates), v.degraded, secs, op.a.Rule.ID)
		s.reply(429, "tollgate_rate_limited", p.body429(now, op, secs), hdr)
		return Pause
	}
	p.m.inc(p.m.allowed)
	if v.degraded {
		p.m.inc(p.m.degraded)
	}
	s.headers = header.Append(s.headers[:0], p.views(now, ops, strictStates), v.degraded)
	if v.shadow != nil {
		p.m.inc(p.m.shadowRejected)
		s.headers = header.AppendShadow(s.headers, v.shadow.a.Rule.ID)
	}
	return Continue
}

func (s *Stream) reply(status uint32, details string, body []byte, hdr [][2]string) {
	hdr = append(hdr, [2]string{header.ContentType, header.ContentTypeJSON})
	if err := s.p.host.SendLocalReply(status, details, body, hdr); err != nil {
		s.p.host.Log(LogError, "tollgate: local reply: "+err.Error())
	}
	s.replied = true
}

// OnResponseHeaders adds the rate-limit headers decided on the request.
func (s *Stream) OnResponseHeaders(int, bool) Action {
	if s.replied {
		return Continue
	}
	for _, kv := range s.headers {
		if err := s.p.host.AddResponseHeader(kv[0], kv[1]); err != nil {
			s.p.host.Log(LogWarn, "tollgate: add response header: "+err.Error())
			break
		}
	}
	return Continue
}

// OnLog is a no-op: Tollgate logs through metrics.
func (s *Stream) OnLog() {}

// OnDone forgets the stream.
func (s *Stream) OnDone() { delete(s.p.streams, s.id) }

// startStrict pauses the request and asks the service for the strict rules' decision,
// after checking (without consuming) that the request's other buckets would admit it.
func (s *Stream) startStrict(now int64, applied []rule.Applied) Action {
	p := s.p
	st := &strictState{applied: append([]rule.Applied(nil), applied...)}
	for i := range st.applied {
		if st.applied[i].Rule.Strict {
			st.strict = append(st.strict, &st.applied[i])
		}
	}
	st.ops = append([]bucketOp(nil), p.buildOps(st.applied, true)...)
	if v := p.decide(now, st.ops, false); !v.allowed {
		return s.answer(now, v, st.ops, nil)
	}
	s.strict = st
	if !p.sync.breaker.Allow(now) {
		return s.strictUnavailable(now)
	}
	p.strictSeq++
	b := wire.Batch{Node: p.cfg.Sync.Node, Worker: p.worker | 1<<31, Seq: p.strictSeq, RulesVersion: p.rulesVersion}
	for _, a := range st.strict {
		for w, prm := range a.Windows {
			b.Deltas = append(b.Deltas, wire.Delta{
				Key: a.Key, Rule: a.Rule.ID, Window: uint8(w), Flags: wire.FlagStrict, Over: u32(a.Cost),
				Algo: uint8(prm.Kind), Limit: u32(prm.Limit), WindowMs: u32(prm.WindowUs / 1000), Burst: u32(prm.Burst),
			})
		}
	}
	body, err := wire.AppendBatch(nil, &b)
	if err == nil {
		var token uint32
		token, err = p.host.HTTPCall(p.cfg.Sync.Cluster, p.sync.callHeaders("/v1/check"), body, uint32(p.cfg.Sync.TimeoutMs))
		if err == nil {
			p.m.inc(p.m.strictChecks)
			p.calls[token] = call{kind: callStrict, stream: s.id}
			return Pause
		}
	}
	p.host.Log(LogWarn, "tollgate: strict check: "+err.Error())
	return s.strictUnavailable(now)
}

// strictUnavailable applies the strict rules' fail mode when the service cannot answer.
func (s *Stream) strictUnavailable(now int64) Action {
	p := s.p
	st := s.strict
	for _, a := range st.strict {
		if a.Rule.Fail == rule.FailClosed {
			op := bucketOp{a: a}
			return s.answer(now, verdict{failClosed: true, reject: &op, degraded: true}, st.ops, nil)
		}
	}
	v := p.decide(now, st.ops, true)
	v.degraded = true
	return s.answer(now, v, st.ops, nil)
}

// onStrictResponse resumes or rejects a paused strict request.
func (s *Stream) onStrictResponse(now int64, headers [][2]string, body []byte) {
	p := s.p
	if s.strict == nil {
		return
	}
	if err := p.host.SetEffectiveContext(s.id); err != nil {
		p.host.Log(LogError, "tollgate: strict resume: "+err.Error())
		return
	}
	var reply wire.Reply
	var act Action
	if headerValue(headers, ":status") != "200" || wire.DecodeReply(body, &reply) != nil {
		p.sync.failed(now)
		act = s.strictUnavailable(now)
	} else {
		act = s.strictDecided(now, reply.States)
	}
	if act == Continue {
		if err := p.host.ResumeRequest(); err != nil {
			p.host.Log(LogError, "tollgate: resume: "+err.Error())
		}
	}
}

func (s *Stream) strictDecided(now int64, states []wire.State) Action {
	p := s.p
	st := s.strict
	for i := range states {
		if states[i].Allowed {
			continue
		}
		a := st.strict[0]
		for _, x := range st.strict {
			if x.Rule.ID == states[i].Rule {
				a = x
			}
		}
		op := &bucketOp{a: a, w: int(states[i].Window), params: a.Windows[int(states[i].Window)%len(a.Windows)]}
		op.dec = lease.Decision{RetryAfterUs: int64(states[i].RetryInMs) * 1000, ResetUs: now + int64(states[i].ResetInMs)*1000,
			PenaltyLevel: states[i].PenaltyLevel, Penalized: states[i].PenaltyInMs > 0, PenaltyLeftUs: int64(states[i].PenaltyInMs) * 1000}
		if op.dec.Penalized && int64(states[i].PenaltyInMs)*1000 > op.dec.RetryAfterUs {
			op.dec.RetryAfterUs = int64(states[i].PenaltyInMs) * 1000
		}
		return s.answer(now, verdict{reject: op}, st.ops, states)
	}
	v := p.decide(now, st.ops, true)
	return s.answer(now, v, st.ops, states)
}

func stripQuery(path string) string {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			return path[:i]
		}
	}
	return path
}
