package lease

import "github.com/tollgate-rl/tollgate/shared/algo"

// BatchRetry holds a node that is refusing far more than the bucket refills off the
// service until the next sync interval (intervalUs). Left alone, a key held above its
// limit asks (an acquire, a Redis round trip) every time its lease runs dry, and a spent
// bucket grants a permit or a small lease at a time: about one round trip per admitted
// request, what a limiter that asks Redis every time costs. A node that refused more
// than an interval's refill since its last report (rejected) counts the bucket as spent
// until an interval's refill from now (never longer than the whole capacity takes): it
// uses its lease, refuses beyond it, and then one acquire brings a lease of what
// refilled meanwhile. What the fleet admits stays the limit; the refused learn a
// Retry-After of at most an interval. A caller near its limit, refused now and then, is
// left alone.
//
// Only the buckets that refill a permit at a time (token_bucket, gcra) are held: a
// window's count comes back at the window's end, which the service's retry time
// already says, and a hold there would refuse what a new window (a month's quota on the
// 1st) just gave.
func BatchRetry(rec Record, p algo.Params, rejected, now, intervalUs int64) Record {
	if !p.Kind.Refills() {
		return rec
	}
	if RefillUs(p, now, rejected) < intervalUs {
		return rec
	}
	rec.RetryUs = max(rec.RetryUs, now+min(intervalUs, RefillUs(p, now, p.Capacity())))
	rec.GlobalRemaining = min(rec.GlobalRemaining, 0)
	return rec
}

// FleetSettleUs is how long a node hears the service's fleet size before it trusts it
// to size cold-start allowances: the service's count takes in a new node about two
// seconds after its first sync (RATIONALE.md §3, "Fleet size").
const FleetSettleUs = 3_000_000

// AllowanceNodes is the fleet size N a node sizes its cold-start allowances by
// (ColdAllowance): the larger of expected (configured) and heard (the service's count
// in its replies) once heard has been heard for FleetSettleUs (heardForUs); before,
// expected if set above 1. 0 means not known: no allowance, first requests acquire.
func AllowanceNodes(heard, heardForUs, expected int64) int64 {
	switch {
	case heard > 0 && heardForUs >= FleetSettleUs:
		return max(heard, expected)
	case expected > 1:
		return max(heard, expected)
	}
	return 0
}
