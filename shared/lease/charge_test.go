package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// TestCharge: what a response reports beyond its estimate comes out of the lease while it
// lasts and is reported beyond it, into debt locally, and makes the bucket urgent when
// later requests must learn what it holds.
func TestCharge(t *testing.T) {
	const now = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10_000, WindowUs: 60_000_000}
	synced := Record{SyncedUs: now - 50*msUs, LeaseLeft: 500, LeaseUntilUs: now + 1000*msUs, LowWater: 100, GlobalRemaining: 4000}
	sync := Env{Sync: true, Healthy: true}
	tests := []struct {
		name       string
		r          Record
		n          int64
		env        Env
		wantLeased int64 // Pending.Leased added
		wantOver   int64 // Pending.Over added
		wantLease  int64 // LeaseLeft after
		wantGlobal int64
		wantUrgent bool
	}{
		{"within the lease", synced, 300, sync, 300, 0, 200, 4000, false},
		{"to the low water", synced, 400, sync, 400, 0, 100, 4000, true},
		{"beyond the lease", synced, 2000, sync, 500, 1500, 0, 2500, true},
		{"beyond what the fleet holds", synced, 9000, sync, 500, 8500, 0, -4500, true},
		{"expired lease", func() Record { r := synced; r.LeaseUntilUs = now; return r }(), 300, sync, 0, 300, 500, 3700, true},
		{"never synced", Record{}, 300, sync, 0, 300, 0, -300, true},
		{"zero", synced, 0, sync, 0, 0, 500, 4000, false},
		{"no sync service", synced, 300, Env{}, 0, 0, 500, 4000, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Charge(tt.r, p, now, tt.n, tt.env)
			if d := got.Pending.Leased - tt.r.Pending.Leased; d != tt.wantLeased {
				t.Errorf("leased +%d, want +%d", d, tt.wantLeased)
			}
			if d := got.Pending.Over - tt.r.Pending.Over; d != tt.wantOver {
				t.Errorf("over +%d, want +%d", d, tt.wantOver)
			}
			if got.LeaseLeft != tt.wantLease || got.GlobalRemaining != tt.wantGlobal || got.Urgent != tt.wantUrgent {
				t.Errorf("lease %d global %d urgent %v, want %d %d %v", got.LeaseLeft, got.GlobalRemaining, got.Urgent, tt.wantLease, tt.wantGlobal, tt.wantUrgent)
			}
			if got.Pending.Degraded {
				t.Error("a charge is reported as degraded: the service would forgive what the bucket does not hold")
			}
			// The local state went into debt by exactly n: what it holds fell by n.
			if a, b := algo.Available(p, tt.r.Local, now), algo.Available(p, got.Local, now); a-b != tt.n {
				t.Errorf("local state holds %d less, want %d", a-b, tt.n)
			}
		})
	}
}
