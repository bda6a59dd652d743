package header

import (
	"math"
	"math/bits"
)

// RetryAfterSeconds turns the time until the bucket admits the request (retryUs, from
// the algorithm or the global state) into a Retry-After value in whole seconds, adding
// jitter drawn uniformly from [0, jitterMaxUs] with the caller's random number rnd (the
// filter injects randomness, so this stays pure and testable).
//
// The result is ceil((retryUs + jitter) / 1 s), so it is never below ceil(retryUs / 1 s)
// — a client that obeys it is never refused again for the same reason — and never above
// ceil((retryUs + jitterMaxUs) / 1 s). It is at least 1, because it is only sent with a
// refusal and 0 would invite an immediate retry. Negative inputs count as 0; sums that
// would overflow saturate.
func RetryAfterSeconds(retryUs int64, jitterMaxUs int64, rnd uint64) int64 {
	retryUs = max(retryUs, 0)
	var jitter int64
	if jitterMaxUs > 0 {
		// High half of rnd × (jitterMax+1): uniform over [0, jitterMax] without the
		// modulo bias of rnd % (jitterMax+1).
		hi, _ := bits.Mul64(rnd, uint64(jitterMaxUs)+1)
		jitter = int64(hi)
	}
	total := retryUs + jitter
	if total < retryUs { // overflow
		total = math.MaxInt64
	}
	secs := total / 1_000_000
	if total%1_000_000 != 0 {
		secs++
	}
	return max(secs, 1)
}
