package plugin

import (
	"unsafe"

	"github.com/tollgate-rl/tollgate/shared/refusal"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// property reads a proxy property (dynamic metadata, filter state) for a key source.
// The path's tokens were built when the rules were parsed, so the call passes them as
// they are. Values are appended to propBuf, which decideRequest empties for every
// request: a key aliases it while the request is decided, and outlives the request only
// as a copy (bucket ids, a paused request's clone). When propBuf grows, the values read
// before keep the old array.
func (p *Plugin) property(path []string) (string, bool) {
	start := len(p.propBuf)
	buf, err := p.host.AppendProperty(p.propBuf, path...)
	if err != nil || len(buf) == start {
		return "", false
	}
	p.propBuf = buf
	return unsafe.String(&buf[start], len(buf)-start), true
}

// missingKey returns the first enforcing rule that refuses the request because its key
// is missing (missing_key "deny"), or nil. A shadow rule, or any rule while the rule
// set's enforcement is "shadow", never refuses: it is counted only. (A rollout does not
// apply: it places callers by key, and there is none.)
func (p *Plugin) missingKey(applied []rule.Applied) *rule.Applied {
	for i := range applied {
		a := &applied[i]
		if a.Refuse == 0 {
			continue
		}
		if p.cfg.ShadowedRule(a.Rule) {
			p.m.inc(p.m.shadowRejected)
			continue
		}
		p.m.inc(p.m.keyMissing)
		return a
	}
	return nil
}

// withoutRefusals drops the (shadow) rules that had no key from applied, in place.
func withoutRefusals(applied []rule.Applied) []rule.Applied {
	n := 0
	for i := range applied {
		if applied[i].Refuse == 0 {
			applied[n] = applied[i]
			n++
		}
	}
	return applied[:n]
}

func (p *Plugin) bodyKeyMissing(a *rule.Applied) []byte {
	p.body = refusal.AppendBodyKeyMissing(p.body[:0], a.Refuse, a.Rule.ID)
	return p.body
}
