package plugin

import (
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// retryAfter turns an un-jittered wait into a jittered Retry-After (never earlier than
// the bucket admits; see header.RetryAfterSeconds).
func (p *Plugin) retryAfter(us int64) int64 {
	return header.RetryAfterSeconds(us, p.cfg.RetryJitterMs*1000, p.nextRand())
}

// views describes every enforcing window of the request for the headers. Strict rules'
// windows come from the service's reply states.
func (p *Plugin) views(now int64, ops []bucketOp, strict []wire.State) []header.Window {
	v := p.viewBuf[:0]
	for i := range ops {
		op := &ops[i]
		if op.a.Rule.Shadow {
			continue
		}
		v = append(v, header.Window{
			Policy:         p.policyName(op.a.Rule.ID, op.params.WindowUs),
			Limit:          op.params.Limit,
			Remaining:      op.dec.Remaining,
			WindowSeconds:  header.WindowSeconds(op.params.WindowUs),
			ResetUnix:      ceilSec(op.dec.ResetUs),
			ResetInSeconds: ceilSec(op.dec.ResetUs - now),
		})
	}
	for i := range strict {
		st := &strict[i]
		r := p.cfg.RuleByID(st.Rule)
		if r == nil || !r.Strict || int(st.Window) >= len(r.Windows) {
			continue // acquires' buckets are among ops
		}
		prm := r.Windows[st.Window]
		reset := now + int64(st.ResetInMs)*1000
		v = append(v, header.Window{
			Policy:         p.policyName(r.ID, prm.WindowUs),
			Limit:          prm.Limit,
			Remaining:      st.Remaining,
			WindowSeconds:  header.WindowSeconds(prm.WindowUs),
			ResetUnix:      ceilSec(reset),
			ResetInSeconds: ceilSec(reset - now),
		})
	}
	p.viewBuf = v
	return v
}

func ceilSec(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999_999) / 1_000_000
}

func appendBypass(dst [][2]string) [][2]string { return header.AppendBypass(dst) }

func bodyDenied(pattern string, byAddress bool) []byte { return header.Body403(pattern, byAddress) }

func body503(rule string, secs int64) []byte { return header.Body503(secs, rule) }

func (p *Plugin) body429(now int64, op *bucketOp, secs int64) []byte {
	e := header.Exceeded{
		Limit:             op.params.Limit,
		WindowSeconds:     header.WindowSeconds(op.params.WindowUs),
		RetryAfterSeconds: secs,
		ResetUnix:         ceilSec(op.dec.ResetUs),
		Rule:              op.a.Rule.ID,
	}
	if op.dec.Penalized {
		e.PenaltyLevel = int64(op.dec.PenaltyLevel)
		e.PenaltySeconds = ceilSec(op.dec.PenaltyLeftUs)
	}
	return header.Body429(&e)
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

type policyKey struct {
	rule     string
	windowUs int64
}

// policyName returns the IETF policy name of a rule's window, formatted once per rule
// set (the cache is dropped when rules are installed; it holds one entry per distinct
// rule window, tiers and overrides included).
func (p *Plugin) policyName(rule string, windowUs int64) string {
	k := policyKey{rule, windowUs}
	if n, ok := p.policies[k]; ok {
		return n
	}
	n := header.PolicyName(rule, windowUs)
	p.policies[k] = n
	return n
}
