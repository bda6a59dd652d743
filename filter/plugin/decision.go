package plugin

import (
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/keyhash"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// DecisionProperty is the stream property every decision is set under (one
// proxy_set_property per request). Envoy keeps a property a filter sets in the stream's
// filter state under "wasm." + the path, so an access log prints the decision with
// %FILTER_STATE(wasm.tollgate:PLAIN)%. proxy-wasm has no call that sets dynamic
// metadata, and a property is what Envoy, Istio and the SDK's emulator all keep.
//
// The value is one logfmt line, for example
//
//	rule=api decision=limited remaining=0 limit=10 degraded=false key=5f2b1c0e9a7d3b41
//
// decision is allowed, limited, shadow_limited (admitted; the shadow rule named would
// have refused), unavailable (503, a fail-closed strict rule without the service),
// denied or bypassed (the allow/deny lists: no rule, no key), or key_missing (a rule's
// missing_key "deny": the rule named, no key). key is the caller key's
// hash (package keyhash, as the service's /v1/top names keys), never the key.
const DecisionProperty = "tollgate"

// Decisions as the metadata names them.
const (
	decAllowed       = "allowed"
	decLimited       = "limited"
	decShadowLimited = "shadow_limited"
	decUnavailable   = "unavailable"
	decDenied        = "denied"
	decKeyMissing    = "key_missing"
	decBypassed      = "bypassed"
)

// setDecision sets the decision's metadata on the current stream. a is nil for the
// list decisions; limit < 0 leaves remaining and limit out.
func (s *Stream) setDecision(decision string, a *rule.Applied, remaining, limit int64, degraded bool) {
	p := s.p
	if p.cfg.Config == nil || !p.cfg.Telemetry.DecisionMetadata {
		return
	}
	b := append(p.meta[:0], "rule="...)
	if a != nil {
		b = append(b, a.Rule.ID...)
	} else {
		b = append(b, '-')
	}
	b = append(b, " decision="...)
	b = append(b, decision...)
	if limit >= 0 {
		b = append(b, " remaining="...)
		b = strconv.AppendInt(b, max(0, remaining), 10)
		b = append(b, " limit="...)
		b = strconv.AppendInt(b, limit, 10)
	}
	b = append(b, " degraded="...)
	b = strconv.AppendBool(b, degraded)
	if a != nil && a.Key != "" {
		b = append(b, " key="...)
		b = append(b, p.keyNames.name(p.cfg.Telemetry.KeyHashSecret, a.Key)...)
	}
	p.meta = b
	if err := p.host.SetProperty(DecisionProperty, b); err != nil {
		p.host.Log(LogDebug, "tollgate: set decision property: "+err.Error())
	}
}

// counted records an answered decision in the per-rule stats and the metadata: v is
// the verdict, ops the request's buckets, states the service's answers to its checks.
func (s *Stream) counted(v *verdict, ops []bucketOp, states []wire.State) {
	p := s.p
	applied := p.applied
	if s.paused != nil {
		applied = s.paused.applied
	}
	switch {
	case v.failClosed:
		p.countRule(v.reject.a, statDegraded)
		s.setDecision(decUnavailable, v.reject.a, 0, -1, true)
		return
	case v.reject != nil:
		op := v.reject
		p.countRule(op.a, statLimited)
		if v.degraded {
			p.countRule(op.a, statDegraded)
		}
		q, _ := quota(op.params)
		s.setDecision(decLimited, op.a, op.dec.Remaining, q, v.degraded)
		return
	}
	for i := range applied {
		p.countRule(&applied[i], statAllowed)
		if v.degraded {
			p.countRule(&applied[i], statDegraded)
		}
	}
	if v.shadow != nil {
		op := v.shadow
		p.countRule(op.a, statShadowLimited)
		q, _ := quota(op.params)
		s.setDecision(decShadowLimited, op.a, op.dec.Remaining, q, v.degraded)
		return
	}
	// The metadata names the enforcing bucket closest to its limit (the one the
	// RateLimit headers report), else a strict rule the service answered.
	var closest *bucketOp
	for i := range ops {
		op := &ops[i]
		if !op.shadow && (closest == nil || op.dec.Remaining < closest.dec.Remaining) {
			closest = op
		}
	}
	switch {
	case closest != nil:
		q, _ := quota(closest.params)
		s.setDecision(decAllowed, closest.a, closest.dec.Remaining, q, v.degraded)
	case len(applied) > 0 && len(states) > 0:
		a := &applied[0]
		if r := p.cfg.RuleByID(states[0].Rule); r != nil {
			for i := range applied {
				if applied[i].Rule == r {
					a = &applied[i]
				}
			}
		}
		if len(a.Windows) == 0 { // a rule with only max_in_flight
			s.setDecision(decAllowed, a, 0, -1, v.degraded)
			break
		}
		q, _ := quota(a.Windows[min(int(states[0].Window), len(a.Windows)-1)])
		s.setDecision(decAllowed, a, states[0].Remaining, q, v.degraded)
	case len(applied) > 0:
		s.setDecision(decAllowed, &applied[0], 0, -1, v.degraded)
	}
}

// keyNameSlots is the size of a worker's cache of key names.
const keyNameSlots = 64

// keyNames caches the names (keyhash; keyed with telemetry.key_hash_secret when set, as
// the sync service names keys) of recently decided caller keys, direct-mapped by
// the key's FNV hash: a caller sending many requests — the one a limit is about — costs
// one SHA-256, not one per request. A new key costs one (about 0.3 µs natively) and takes
// its slot. Memory: keyNameSlots copies of keys, each at most a key's bound.
type keyNames struct {
	secret string // the secret the cached names were made with
	slots  [keyNameSlots]struct {
		key  []byte
		name [max(keyhash.Len, keyhash.KeyedLen)]byte
		n    int
		set  bool
	}
}

// name returns key's name under secret ("" for the unkeyed name); the slice aliases
// the cache (valid until the next call).
func (c *keyNames) name(secret, key string) []byte {
	if secret != c.secret {
		for i := range c.slots {
			c.slots[i].set = false
		}
		c.secret = secret
	}
	e := &c.slots[hashID(key)%keyNameSlots]
	if !e.set || string(e.key) != key {
		if secret != "" {
			e.n = len(keyhash.AppendKeyed(e.name[:0], secret, key))
		} else {
			e.n = len(keyhash.Append(e.name[:0], key))
		}
		e.key = append(e.key[:0], key...)
		e.set = true
	}
	return e.name[:e.n]
}
