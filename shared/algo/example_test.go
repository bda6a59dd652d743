package algo_test

import (
	"fmt"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// Decide requests with one algorithm: a token bucket of 2 permits per second. The
// state is bytes the caller keeps (Envoy shared data, a Redis string); the clock is the
// caller's, in microseconds.
func ExampleDecide() {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 2, WindowUs: 1_000_000}
	if err := p.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	var st algo.State // empty: a full bucket
	now := int64(1_700_000_000_000_000)
	for i, at := range []int64{0, 0, 0, 500_000} {
		r := algo.Decide(p, st, now+at, 1)
		st = r.State // refused or not: a refusal may still roll a window over
		fmt.Printf("request %d at +%d ms: allowed %v, remaining %d, retry after %d ms\n",
			i+1, at/1000, r.Allowed, r.Remaining, r.RetryAfterUs/1000)
	}
	// Output:
	// request 1 at +0 ms: allowed true, remaining 1, retry after 0 ms
	// request 2 at +0 ms: allowed true, remaining 0, retry after 0 ms
	// request 3 at +0 ms: allowed false, remaining 0, retry after 500 ms
	// request 4 at +500 ms: allowed true, remaining 0, retry after 0 ms
}
