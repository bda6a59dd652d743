package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// A request whose acquire got no answer (a late or lost callout, the sync otherwise
// healthy) is refused only while the service's last word stands: it said the bucket is
// empty until RetryUs, and that time has not come. A record whose remaining was small
// at its last sync but which has no standing retry time (the bucket refilled since, or
// the remaining was this gateway's own lease, now ended) is admitted degraded: a slow
// service must not refuse callers within their limit.
func TestDecideAcquireFailed(t *testing.T) {
	const now = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, WindowUs: 1_000_000, Burst: 1000}
	env := Env{Sync: true, Healthy: true, IntervalUs: 100_000, RenewUs: 2_000_000, AcquireFailed: true}
	tests := []struct {
		name       string
		rec        Record
		wantRefuse bool
	}{
		{"empty until a retry time to come: refused",
			Record{SyncedUs: now - 50_000, GlobalRemaining: 0, RetryUs: now + 200_000}, true},
		{"empty at a sync 30 s ago, its retry time passed: admitted degraded",
			Record{SyncedUs: now - 30_000_000, GlobalRemaining: 0, RetryUs: now - 29_000_000}, false},
		{"nothing beyond its own lease, which ended: admitted degraded",
			Record{SyncedUs: now - 5_000_000, GlobalRemaining: 0, LeaseUntilUs: now - 1}, false},
		{"room left at the last sync: admitted degraded",
			Record{SyncedUs: now - 50_000, GlobalRemaining: 500}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rec
			d := DecideIn(nil, &r, p, now, 1, env)
			if refused := !d.Allowed; refused != tt.wantRefuse {
				t.Fatalf("refused %v, want %v: %+v", refused, tt.wantRefuse, d)
			}
			if !tt.wantRefuse && !d.Degraded {
				t.Errorf("admitted without the degraded mark: %+v", d)
			}
		})
	}
}
