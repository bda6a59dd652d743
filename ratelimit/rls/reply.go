package rls

import (
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/refusal"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// reply turns the checks' states into Envoy's answer.
type reply struct {
	now      time.Time
	applied  []rule.Applied
	jitterUs int64
	// cfg is the rule set the descriptors were matched against: whether an applied
	// rule is shadowed for this caller is its decision (rule.Config.Shadowed).
	cfg *rule.Config
	// degradedDelta: the delta's state was decided without Redis (a replica's leases
	// while Redis is unreachable); nil when every state came from Redis.
	degradedDelta []bool

	degraded   bool       // some check could not reach Redis
	failClosed *rule.Rule // a fail-closed rule that refused because of that
	refusedBy  *rule.Rule // the first rule that refused
	retryUs    int64      // until every refusing window admits again
	exceeded   *refusal.Exceeded
	shadow     *rule.Rule // a shadow rule that would have refused
}

// verdict of one check.
type verdict uint8

const (
	admitted verdict = iota
	refused
	unavailable   // Redis could not be reached
	shadowRefused // a shadow rule's bucket would have refused
	gone          // the rule left the service's rule set between matching and checking
)

func (r *reply) verdict(c *check, out *store.Outcome) (verdict, *wire.State) {
	if out == nil || c.delta >= len(out.States) {
		return unavailable, nil
	}
	st := &out.States[c.delta]
	degraded := c.delta < len(r.degradedDelta) && r.degradedDelta[c.delta]
	switch {
	case st.Flags&wire.StateRefused != 0:
		return gone, st
	case st.ServerMs == 0, degraded && st.Allowed():
		// Unknown, or admitted on the replica's own state: the rule's fail mode decides.
		return unavailable, st
	case st.Allowed():
		return admitted, st
	case r.cfg.Shadowed(&r.applied[c.ai]):
		return shadowRefused, st
	default:
		if degraded {
			r.degraded = true // refused on the replica's own state
		}
		return refused, st
	}
}

func (r *reply) build(perDesc [][]check, out *store.Outcome, m *metrics) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(perDesc))}
	var views []header.Window
	listed := map[int]bool{} // a bucket several descriptors share is one window in the headers
	for i, checks := range perDesc {
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = ds
		var own []header.Window // this descriptor's windows, for its status
		var ownParams []algo.Params
		ownDegraded := false
		outcome := "unmatched"
		if len(checks) > 0 {
			outcome = "ok"
		}
		for ci := range checks {
			c := &checks[ci]
			a := &r.applied[c.ai]
			v, st := r.verdict(c, out)
			if v == gone {
				continue
			}
			w := header.Window{Policy: rule.PolicyName(a.Rule.ID, c.prm), Limit: c.prm.Limit,
				WindowSeconds: header.WindowSeconds(c.prm.WindowUs)}
			switch v {
			case unavailable:
				r.degraded, ownDegraded = true, true
				w.Remaining = c.prm.Limit // unknown: the degraded headers say so
				w.ResetInSeconds = w.WindowSeconds
				if a.Rule.Fail == rule.FailClosed && !r.cfg.Shadowed(a) {
					ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
					if r.failClosed == nil {
						r.failClosed = a.Rule
					}
					outcome = "fail_closed"
				} else if outcome == "ok" {
					outcome = "degraded"
				}
			default:
				w.Remaining = st.Remaining
				w.ResetInSeconds = ceilSec(int64(st.ResetInMs) * 1000)
				ds.LimitRemaining = u32(st.Remaining)
				switch v {
				case refused:
					ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
					outcome = "over_limit"
					retry := int64(max(st.RetryInMs, st.PenaltyInMs)) * 1000
					if r.refusedBy == nil {
						r.refusedBy = a.Rule
						r.exceeded = &refusal.Exceeded{Limit: c.prm.Limit, WindowSeconds: w.WindowSeconds, Rule: a.Rule.ID,
							ResetUnix: r.now.Unix() + w.ResetInSeconds}
						if per, _, ok := c.prm.Calendar(); ok {
							r.exceeded.Per = per.String()
						}
						if st.PenaltyInMs > 0 {
							r.exceeded.PenaltyLevel = int64(st.PenaltyLevel)
							r.exceeded.PenaltySeconds = ceilSec(int64(st.PenaltyInMs) * 1000)
						}
					}
					r.retryUs = max(r.retryUs, retry)
				case shadowRefused:
					if r.shadow == nil {
						r.shadow = a.Rule
					}
					if outcome == "ok" {
						outcome = "shadow_over_limit"
					}
				}
			}
			w.ResetUnix = r.now.Unix() + w.ResetInSeconds
			if !r.cfg.Shadowed(a) {
				own, ownParams = append(own, w), append(ownParams, c.prm)
				if !listed[c.delta] {
					listed[c.delta] = true
					views = append(views, w)
				}
			}
		}
		if k := header.MostRestrictive(own); k >= 0 {
			ds.CurrentLimit = currentLimit(own[k].Policy, ownParams[k])
			ds.LimitRemaining = u32(own[k].Remaining)
			ds.DurationUntilReset = durationpb.New(time.Duration(own[k].ResetInSeconds) * time.Second)
			if ownDegraded && ds.Code == rlsv3.RateLimitResponse_OK {
				// What is left is not known: Envoy shows nothing rather than a guess.
				ds.LimitRemaining = 0
				ds.DurationUntilReset = nil
			}
		}
		if ds.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		m.descriptors.WithLabelValues(outcome).Inc()
	}
	resp.ResponseHeadersToAdd = r.headers(views)
	switch {
	case r.failClosed != nil && r.refusedBy == nil:
		resp.RawBody = refusal.Body503(1, r.failClosed.ID)
	case r.exceeded != nil:
		r.exceeded.RetryAfterSeconds = r.retryAfter()
		resp.RawBody = refusal.Body429(r.exceeded)
	}
	if resp.RawBody != nil {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, hv(header.ContentType, header.ContentTypeJSON))
	}
	return resp
}

// headers are the filter's rate-limit headers for these windows: those of every
// answer, and on a refusal Retry-After and the refusing rule (a fail-closed refusal
// retries after one second, as the filter's 503 does).
func (r *reply) headers(views []header.Window) []*corev3.HeaderValue {
	var pairs [][2]string
	switch {
	case r.refusedBy != nil:
		pairs = header.AppendRefused(pairs, views, r.degraded, r.retryAfter(), r.refusedBy.ID)
	case r.failClosed != nil:
		pairs = header.AppendRefused(pairs, views, true, 1, r.failClosed.ID)
	default:
		pairs = header.Append(pairs, views, r.degraded)
	}
	if r.shadow != nil {
		pairs = header.AppendShadow(pairs, r.shadow.ID)
	}
	out := make([]*corev3.HeaderValue, len(pairs))
	for i, p := range pairs {
		out[i] = hv(p[0], p[1])
	}
	return out
}

func (r *reply) retryAfter() int64 { return header.RetryAfterSeconds(r.retryUs, r.jitterUs, jitter()) }

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

func ceilSec(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999_999) / 1_000_000
}

// units Envoy's RateLimit knows, largest first (WEEK is left out: older Envoys do not
// know it, and seven days say the same).
var units = []struct {
	us   int64
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{86400e6, rlsv3.RateLimitResponse_RateLimit_DAY},
	{3600e6, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{60e6, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{1e6, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// currentLimit is a window as Envoy's RateLimit: requests_per_unit is the window's
// limit, and the window is the largest unit that divides it times unit_multiplier
// (10 per 90 s: 10 per 90 SECOND; 100 per 2 h: 100 per 2 HOUR). A window that is not
// a whole number of seconds (1500ms) is shown rounded up to whole seconds; name, the
// policy name of the headers ("search-1500ms"), always states the exact window.
func currentLimit(policy string, p algo.Params) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: policy, RequestsPerUnit: u32(p.Limit)}
	for _, u := range units {
		if p.WindowUs%u.us == 0 {
			rl.Unit = u.unit
			if n := p.WindowUs / u.us; n > 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(u32(n))
			}
			return rl
		}
	}
	rl.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND
	if n := ceilSec(p.WindowUs); n > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(u32(n))
	}
	return rl
}
