package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestReplayKeepsTheBucketState: a replayed reply (the batch or acquire was applied
// before: a hedged or resent callout) hands over the lease the first application
// granted, and says nothing of the bucket — its remaining, reset, retry and penalty
// read 0. The record keeps what the service last said of the bucket, so a key whose
// lease ends is admitted on its allowance afterwards instead of holding its next
// request for an acquire on a bucket it believes spent.
func TestReplayKeepsTheBucketState(t *testing.T) {
	const now = 1_700_000_000_000_000
	testParams := algo.Params{Kind: algo.TokenBucket, Limit: 1000, WindowUs: 1_000_000, Burst: 1000}
	env := Env{Sync: true, Healthy: true, IntervalUs: 100_000, RenewUs: 2_000_000, ColdAllowance: 50}
	base := Record{SyncedUs: now - 2_000_000, ServerMs: 1000, GlobalRemaining: 900, ResetUs: now + 500_000,
		RetryUs: now - 1_000_000, PenaltyUntilUs: now + 3_000_000, PenaltyLevel: 2, Pending: Pending{Over: 1}, Cold: 1}
	for _, tt := range []struct {
		name  string
		apply func(r Record, s *wire.State, sent *wire.Delta) Record
	}{
		{"batch reply", func(r Record, s *wire.State, sent *wire.Delta) Record {
			r, _ = ApplyReply(r, s, sent, 7, now)
			return r
		}},
		{"acquire answer", func(r Record, s *wire.State, _ *wire.Delta) Record { return ApplyAcquire(r, s, now) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var sent wire.Delta
			r := Cut(base, testParams, now, 7, &sent)
			replay := wire.State{Flags: wire.StateReplay | wire.StateAllowed, Lease: 3, Epoch: 5, ValidMs: 5000, ServerMs: 2000}
			r = tt.apply(r, &replay, &sent)
			if r.LeaseLeft != 3 || r.LeaseUntilUs != now+5_000_000 {
				t.Fatalf("the replay's grant: lease %d until %+d µs, want 3 for 5 s", r.LeaseLeft, r.LeaseUntilUs-now)
			}
			if r.GlobalRemaining != base.GlobalRemaining || r.ResetUs != base.ResetUs || r.RetryUs != base.RetryUs ||
				r.PenaltyUntilUs != base.PenaltyUntilUs || r.PenaltyLevel != base.PenaltyLevel || r.ServerMs != base.ServerMs {
				t.Fatalf("the bucket's state changed: %+v", r)
			}
			// Its lease ended: the key comes back and is admitted on its allowance.
			d := DecideIn(nil, &r, testParams, now+6_000_000, 1, env)
			if !d.Allowed || !d.Cold {
				t.Fatalf("after the lease ended: %+v, want a cold admission", d)
			}
		})
	}
}
