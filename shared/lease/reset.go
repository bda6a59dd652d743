package lease

import "github.com/tollgate-rl/tollgate/shared/algo"

// ResetAt is when bucket p is full again (a fixed or calendar window: when the window
// ends), on the gateway's clock at now, as r knows it: the one source of every reset
// value a gateway answers with (x-ratelimit-reset, the RateLimit field's t, the 429
// body's reset_at).
//
//   - A fixed or calendar window ends at a boundary the gateway computes on its own clock
//     (algo.ResetAt): the service's reset is a duration that reaches the gateway a
//     reply's transit late, and a boundary on a whole second (midnight on the 1st)
//     turned into the next second in the headers.
//   - Otherwise it is the later of what the service last said (the fleet's reported
//     consumption; for token_bucket and gcra moved by a permit's refill for each permit
//     this gateway consumed since, which the service has not heard of) and the
//     gateway's own algorithm state, which follows every permit the gateway took. So the
//     reset moves with each admitted request between two replies, as without sync. The
//     consumption of a batch in flight is in neither until its reply lands (one round
//     trip), unless the gateway's own state covers it.
//
// Never synced (or no sync), it is the gateway's own algorithm state's.
func ResetAt(r *Record, p algo.Params, now int64) int64 {
	local := algo.ResetAt(p, r.Local, now)
	if _, ok := WindowEnd(p, now); ok || !r.Synced() {
		return local
	}
	global := r.ResetUs
	if k := r.Pending.Leased + r.Pending.Over; k > 0 && p.Kind.Refills() {
		// Rounded down to the millisecond as the service rounds its reset (SyncResult.Fill):
		// a refill that ends on a whole second must not cross into the next one and then
		// step back when the service's own answer for the same consumption lands.
		global += RefillUs(p, now, k)
		global -= global % 1000
	}
	return max(local, global, now)
}

// WindowEnd is the end of the window that contains now, on the gateway's clock, for the
// algorithms whose count starts afresh at a boundary of absolute time (fixed_window and
// calendar windows); false for the others. Nothing refused for such a window's count
// waits past it, so it bounds the retry time the gateway answers (the service's, a
// reply's transit late, may pass it by a few milliseconds).
func WindowEnd(p algo.Params, now int64) (int64, bool) {
	if !p.Kind.ResetsAtBoundary() {
		return 0, false
	}
	return algo.ResetAt(p, nil, now), true
}
