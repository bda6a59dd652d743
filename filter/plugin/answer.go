package plugin

import (
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/refusal"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// retryAfter turns an un-jittered wait into a jittered Retry-After (never earlier than
// the bucket admits; see header.RetryAfterSeconds).
func (p *Plugin) retryAfter(us int64) int64 {
	return header.RetryAfterSeconds(us, p.cfg.RetryJitterMs*1000, p.nextRand())
}

// views describes every enforcing window of the request for the headers. Strict rules'
// windows come from the service's reply states. refusing, when set, is the bucket that
// refused the request: the headers describe its window (header.Window.Refused), the one
// whose retry time Retry-After and the 429 body give.
func (p *Plugin) views(now int64, ops []bucketOp, strict []wire.State, refusing *bucketOp) []header.Window {
	v := p.viewBuf[:0]
	for i := range ops {
		op := &ops[i]
		if op.shadow {
			continue
		}
		q, w := quota(op.params)
		fixed := p.texts.of(op.a, op.w)
		if op.w < len(op.a.Windows) && op.params != op.a.Windows[op.w] {
			fixed = nil // a degraded limit: the headers say what is enforced (formatted)
		}
		v = append(v, header.Window{
			Fixed:          fixed,
			Limit:          q,
			Remaining:      op.dec.Remaining,
			WindowSeconds:  w,
			ResetUnix:      ceilSec(op.dec.ResetUs),
			ResetInSeconds: ceilSec(op.dec.ResetUs - now),
			Refused:        op == refusing,
		})
		withPolicy(&v[len(v)-1], op.a.Rule.ID, op.params)
	}
	for i := range strict {
		st := &strict[i]
		r := p.cfg.RuleByID(st.Rule)
		if r == nil || !r.Strict || int(st.Window) >= len(r.Windows) {
			continue // acquires' buckets are among ops
		}
		prm := r.Windows[st.Window]
		reset := stateResetAt(now, st, prm)
		q, w := quota(prm)
		v = append(v, header.Window{
			Fixed:          p.texts.ofRule(p.cfg.Config, r, int(st.Window)),
			Limit:          q,
			Remaining:      st.Remaining,
			WindowSeconds:  w,
			ResetUnix:      ceilSec(reset),
			ResetInSeconds: ceilSec(reset - now),
			Refused:        refusing != nil && refusing.a.Rule == r && refusing.w == int(st.Window) && !st.Allowed(),
		})
		withPolicy(&v[len(v)-1], r.ID, prm)
	}
	p.viewBuf = v
	return v
}

// stateResetAt is the reset a service's state says for a bucket of parameters prm that
// the gateway keeps no record of (a strict rule's): a fixed or calendar window's end on
// the gateway's clock (lease.WindowEnd), else the state's duration from now.
func stateResetAt(now int64, st *wire.State, prm algo.Params) int64 {
	if end, ok := lease.WindowEnd(prm, now); ok {
		return end
	}
	return now + int64(st.ResetInMs)*1000
}

// quota is what a window advertises (header.Quota): its limit per window, or with a
// burst above the limit, the capacity over the time it takes to refill.
func quota(prm algo.Params) (q, windowSeconds int64) {
	return header.Quota(prm.Limit, prm.Capacity(), prm.WindowUs)
}

// withPolicy names a window that has no precomputed text (which rules from rule.Parse
// always have), so that the headers can format it.
func withPolicy(w *header.Window, ruleID string, prm algo.Params) {
	if w.Fixed == nil {
		w.Policy = rule.PolicyName(ruleID, prm)
	}
}

func ceilSec(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999_999) / 1_000_000
}

func (p *Plugin) bodyDenied(pattern string, byAddress bool) []byte {
	p.body = refusal.AppendBody403(p.body[:0], pattern, byAddress)
	return p.body
}

func (p *Plugin) body503(rule string, secs int64) []byte {
	p.body = refusal.AppendBody503(p.body[:0], secs, rule)
	return p.body
}

// grpc429, grpcUnavailable and grpcDenied are the grpc-message of gRPC refusals (plain
// text: the proxy percent-encodes it into the header).
func (p *Plugin) grpc429(rule string, secs int64) []byte {
	p.body = refusal.AppendGRPCMessage(p.body[:0], "rate limited by rule ", rule, secs)
	return p.body
}

func (p *Plugin) grpcUnavailable(rule string, secs int64) []byte {
	p.body = refusal.AppendGRPCMessage(p.body[:0], "rate limiter unavailable for rule ", rule, secs)
	return p.body
}

func (p *Plugin) grpcKeyMissing(a *rule.Applied) []byte {
	p.body = refusal.AppendGRPCMessage(p.body[:0], "no caller key for rule ", a.Rule.ID, -1)
	return p.body
}

func (p *Plugin) grpcDenied(pattern string) []byte {
	p.body = refusal.AppendGRPCMessage(p.body[:0], "denied by ", pattern, -1)
	return p.body
}

func (p *Plugin) body429(op *bucketOp, secs int64) []byte {
	e := refusal.Exceeded{
		Limit:             op.params.Limit,
		WindowSeconds:     header.WindowSeconds(op.params.WindowUs),
		RetryAfterSeconds: secs,
		ResetUnix:         ceilSec(op.dec.ResetUs),
		Rule:              op.a.Rule.ID,
	}
	if per, _, ok := op.params.Calendar(); ok {
		e.Per = per.String()
	}
	if op.dec.Penalized {
		e.PenaltyLevel = int64(op.dec.PenaltyLevel)
		e.PenaltySeconds = ceilSec(op.dec.PenaltyLeftUs)
	}
	p.body = refusal.AppendBody429(p.body[:0], &e)
	return p.body
}

// listResult is the allow/deny outcome of one request.
type listResult struct {
	Verdict   rule.ListAction
	Pattern   string
	ByAddress bool
}

// checkLists matches the caller key (the default key source) and client IP against the
// allow and deny lists.
func (p *Plugin) checkLists(req *rule.Request) listResult {
	if len(p.cfg.Allow) == 0 && len(p.cfg.Deny) == 0 {
		return listResult{}
	}
	var ip string
	if p.listsHaveCIDR {
		ip = p.cfg.ClientIP(req) // only then is the peer address worth reading
	}
	lv := p.cfg.CheckLists(p.cfg.CallerKey(req), ip)
	return listResult{Verdict: lv.Action, Pattern: lv.Pattern, ByAddress: lv.ByAddress}
}

// texts is the fixed header text (header.Fixed) of every window of every rule of the
// installed rule set, formatted when the rules are installed so that a request only
// formats its numbers: rules[i] belongs to Config.Rules[i].
type texts struct {
	rules []ruleTexts
}

type ruleTexts struct {
	own       []*header.Fixed
	overrides [][]*header.Fixed // by rule.Applied.Override - 1
	tiers     []tierTexts
}

type tierTexts struct {
	name    string
	windows []*header.Fixed
}

func newTexts(cfg *rule.Config) texts {
	t := texts{rules: make([]ruleTexts, len(cfg.Rules))}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		rt := &t.rules[i]
		rt.own = fixedTexts(r.ID, r.Windows)
		for _, o := range r.Overrides {
			rt.overrides = append(rt.overrides, fixedTexts(r.ID, o.Windows))
		}
		for name, w := range r.Tiers {
			rt.tiers = append(rt.tiers, tierTexts{name: name, windows: fixedTexts(r.ID, w)})
		}
	}
	return t
}

func fixedTexts(ruleID string, windows []algo.Params) []*header.Fixed {
	out := make([]*header.Fixed, len(windows))
	for w, prm := range windows {
		q, secs := quota(prm)
		out[w] = header.NewFixed(rule.PolicyName(ruleID, prm), q, secs)
	}
	return out
}

// of returns the text of window w of an applied rule: its override's, its tier's or
// the rule's own windows, as rule.Apply chose them.
func (t *texts) of(a *rule.Applied, w int) *header.Fixed {
	if a.Index >= len(t.rules) {
		return nil // not from the installed rule set: the headers format it all
	}
	rt := &t.rules[a.Index]
	set := rt.own
	switch {
	case a.Override > 0 && a.Override <= len(rt.overrides):
		set = rt.overrides[a.Override-1]
	case a.Tier != "":
		set = nil
		for i := range rt.tiers {
			if rt.tiers[i].name == a.Tier {
				set = rt.tiers[i].windows
				break
			}
		}
	}
	if w < len(set) {
		return set[w]
	}
	return nil
}

// ofRule returns the text of window w of rule r's own windows (a strict rule's state in
// a reply from the service).
func (t *texts) ofRule(cfg *rule.Config, r *rule.Rule, w int) *header.Fixed {
	for i := range cfg.Rules {
		if &cfg.Rules[i] == r && i < len(t.rules) && w < len(t.rules[i].own) {
			return t.rules[i].own[w]
		}
	}
	return nil
}
