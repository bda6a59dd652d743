package rlqs

import (
	"github.com/tollgate-rl/tollgate/shared/algo"
)

// share is the token bucket an Envoy enforces for one window: its share of the window's
// rate and of its capacity.
type share struct {
	MaxTokens     uint32
	TokensPerFill uint32
	FillSec       int64 // whole seconds: Envoy 1.40 reads only the seconds of fill_interval
}

// rate is the share's refill rate in permits per second.
func (s share) rate() float64 { return float64(s.TokensPerFill) / float64(s.FillSec) }

// shareOf sizes one Envoy's token bucket for a window of parameters p shared by nodes
// Envoys: a 1/nodes share of the window's rate and of its capacity. nodes counts the
// Envoys (streams of this replica) that had requests on the key within two report
// intervals, not the whole fleet: a key used through one Envoy of many gets the whole
// rule, as a gateway's lease follows its demand (RATIONALE.md §2) instead of its share
// of the fleet. Shares of the Envoys using a key sum to at most the rule; what other
// paths (Wasm gateways, RLS, other replicas) take of the same bucket shows in what
// remains, which caps bursts and denies (burstOf). RATIONALE.md "Envoy's
// rate_limit_quota filter" states the bounds.
//
// Envoy 1.40 computes the fill rate as tokens_per_fill / (whole seconds of
// fill_interval), so the interval is whole seconds, at least 1: a window under a second
// is refilled once a second with a second's worth of permits; a share under one permit
// per window stretches the interval instead (1 permit every ceil(window·nodes/limit)
// seconds). max_tokens is at least 1: a token bucket of 0 refuses everything, which is
// the deny this path sends as a blanket rule when the bucket is spent.
func shareOf(p algo.Params, nodes int64) share {
	nodes = max(nodes, 1)
	winUs := max(p.WindowUs, 1)
	fill := max(1, (winUs+999_999)/1_000_000) // seconds
	// permits per fill interval for the whole fleet, then this node's share
	fleet := p.Limit * fill * 1_000_000 / winUs
	per := fleet / nodes
	if per < 1 {
		// Fewer than one permit per interval: stretch the interval to one permit.
		fill = max(1, (winUs*nodes+p.Limit*1_000_000-1)/(p.Limit*1_000_000))
		per = 1
	}
	capShare := max(1, p.Capacity()/nodes)
	return share{MaxTokens: u32(capShare), TokensPerFill: u32(per), FillSec: fill}
}

// tightest is the most restrictive of shares (lowest rate, then smallest burst): a
// bucket several windows select is held to all of them only approximately, by the one
// that admits least over time.
func tightest(shares []share) (share, bool) {
	if len(shares) == 0 {
		return share{}, false
	}
	best := shares[0]
	for _, s := range shares[1:] {
		if s.rate() < best.rate() || (s.rate() == best.rate() && s.MaxTokens < best.MaxTokens) {
			best = s
		}
	}
	return best, true
}

func u32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }

// burstOf is one node's share of what a global bucket holds unreserved (remaining, from
// the store's answer to a report): the most an Envoy's token bucket may hold. Envoy 1.40
// starts a first token bucket (or one after a blanket rule) full and a changed one at
// the fill ratio of the one it replaces, so a bucket holds at most its max_tokens just
// after an assignment: capping max_tokens at remaining/nodes keeps what a fleet can
// admit at once within what the bucket holds, however often the shares change. 0: the
// bucket is spent for this node (the Envoy is denied until it refills).
func burstOf(remaining, nodes int64) int64 {
	return max(0, remaining) / max(nodes, 1)
}
