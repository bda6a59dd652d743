package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

func TestColdAllowance(t *testing.T) {
	tb := func(limit int64) algo.Params {
		return algo.Params{Kind: algo.TokenBucket, Limit: limit, WindowUs: 60_000_000, Burst: limit}
	}
	tests := []struct {
		name           string
		p              algo.Params
		nodes, atLeast int64
		want           int64
	}{
		{"one gateway", tb(100), 1, 0, 5},
		{"four gateways", tb(100), 4, 0, 1},
		{"sixteen gateways: under 20·N, wait", tb(100), 16, 0, 0},
		{"unknown fleet counts one", tb(1000), 0, 0, 50},
		{"large bucket, large fleet", tb(1_000_000), 1000, 0, 50},
		{"admit: at least one request", tb(10), 16, 1, 1},
		{"admit: the allowance when larger", tb(1000), 2, 3, 25},
		{"burst is the capacity", algo.Params{Kind: algo.GCRA, Limit: 10, WindowUs: 1_000_000, Burst: 400}, 2, 0, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ColdAllowance(tt.p, tt.nodes, tt.atLeast); got != tt.want {
				t.Fatalf("ColdAllowance = %d, want %d", got, tt.want)
			}
			// Every gateway spending its whole allowance admits at most 5 % of the
			// capacity (without atLeast).
			if tt.atLeast == 0 && max(tt.nodes, 1)*tt.want*ColdFraction > tt.p.Capacity() {
				t.Fatalf("%d gateways × %d exceeds 5 %% of %d", tt.nodes, tt.want, tt.p.Capacity())
			}
		})
	}
}

// TestDecideCold follows one gateway's record through a cold start: requests within the
// allowance are admitted outside any lease (Over), the one beyond it acquires, the cut
// and the reply of the batch that carries them give the allowance back only once the
// service has charged them, a record whose last reply left no room never admits cold,
// and neither does one whose valid lease ran dry under demand.
func TestDecideCold(t *testing.T) {
	const now = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 3_600_000_000, Burst: 100}
	env := Env{Sync: true, Healthy: true, IntervalUs: 100_000, RenewUs: 2_000_000, ColdAllowance: 3}

	var r Record
	for i := range 3 {
		d := DecideIn(nil, &r, p, now, 1, env)
		if !d.Allowed || !d.Cold || d.Over != 1 || d.Acquire {
			t.Fatalf("request %d within the allowance: %+v", i, d)
		}
	}
	if r.Cold != 3 || r.Pending.Over != 3 || !r.Urgent {
		t.Fatalf("after three cold admissions: cold %d, pending %+v, urgent %v", r.Cold, r.Pending, r.Urgent)
	}
	if d := DecideIn(nil, &r, p, now, 1, env); d.Allowed || !d.Acquire {
		t.Fatalf("beyond the allowance: %+v, want an acquire", d)
	}
	// Undo gives a cold admission back.
	before := r
	d := DecideIn(nil, &r, p, now, 1, Env{Sync: true, Healthy: true, ColdAllowance: 4})
	if r = Undo(r, p, now, 1, &d); r.Cold != before.Cold || r.Pending.Over != before.Pending.Over {
		t.Fatalf("undo: cold %d over %d, want %d %d", r.Cold, r.Pending.Over, before.Cold, before.Pending.Over)
	}

	// The batch carries them: still unconfirmed, so still no room.
	var delta wire.Delta
	r = Cut(r, p, now, 7, &delta)
	if delta.Over != 3 || r.Cold != 0 || r.ColdCut != 3 {
		t.Fatalf("cut: over %d, cold %d, cut %d", delta.Over, r.Cold, r.ColdCut)
	}
	if d := DecideIn(nil, &r, p, now, 1, env); !d.Acquire {
		t.Fatalf("allowance in flight: %+v, want an acquire", d)
	}
	// A refused batch gives them back to the pending count, and to Cold.
	if u := Uncut(r, &delta, 7); u.Cold != 3 || u.ColdCut != 0 || u.Pending.Over != 3 {
		t.Fatalf("uncut: cold %d cut %d over %d", u.Cold, u.ColdCut, u.Pending.Over)
	}
	// The reply charged them: the allowance is free again, against the room it reports.
	st := wire.State{Remaining: 50, Lease: 0, ServerMs: 1, ResetInMs: 1000}
	r, _ = ApplyReply(r, &st, &delta, 7, now+1000)
	if r.ColdCut != 0 || r.GlobalRemaining != 50 {
		t.Fatalf("reply: cold cut %d, global %d", r.ColdCut, r.GlobalRemaining)
	}
	if d := DecideIn(nil, &r, p, now+2000, 1, env); !d.Cold {
		t.Fatalf("after the reply: %+v, want a cold admission", d)
	}

	// The service last said the bucket holds nothing: no cold admission, an acquire
	// (its retry time has passed) or a refusal (it has not).
	spent := Record{SyncedUs: now, GlobalRemaining: 0, RetryUs: now + 1_000_000}
	if d := DecideIn(nil, &spent, p, now+10, 1, env); d.Allowed || d.Acquire {
		t.Fatalf("spent bucket, retry ahead: %+v, want a refusal", d)
	}
	if d := DecideIn(nil, &spent, p, now+2_000_000, 1, env); d.Allowed || !d.Acquire {
		t.Fatalf("spent bucket, retry passed: %+v, want an acquire", d)
	}
	// A valid lease that ran dry under demand acquires, though the last reply left room:
	// the allowance is for a bucket without a lease period, or every gateway of a hot key
	// would spend it at the bucket's last permits, each time. Once the lease has ended
	// (a key that comes back), the allowance applies again.
	dry := Record{SyncedUs: now, GlobalRemaining: 10, LeaseUntilUs: now + 5_000_000, LeaseEpoch: 1}
	if d := DecideIn(nil, &dry, p, now+10, 1, env); d.Allowed || !d.Acquire {
		t.Fatalf("valid lease ran dry: %+v, want an acquire", d)
	}
	if d := DecideIn(nil, &dry, p, now+5_000_000, 1, env); !d.Allowed || !d.Cold {
		t.Fatalf("lease ended: %+v, want a cold admission", d)
	}
	// No allowance (a rule that waits, or a small bucket on a large fleet): acquire.
	var fresh Record
	if d := DecideIn(nil, &fresh, p, now, 1, Env{Sync: true, Healthy: true}); !d.Acquire {
		t.Fatalf("no allowance: %+v, want an acquire", d)
	}
}

// TestDecideDryLease: a valid lease that ran dry decides within the cold-start
// allowance only for a slow key (its previous decision on this gateway is a sync
// interval old or more) whose bucket plainly has room (the service's last word, less
// this gateway's admissions outside a lease since, leaves more than half of the
// capacity unreserved after the request); otherwise it acquires, as a hot key at its
// bucket's last permits must (RATIONALE.md §2, step 4).
func TestDecideDryLease(t *testing.T) {
	const now = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, WindowUs: 1_000_000, Burst: 1000}
	env := Env{Sync: true, Healthy: true, IntervalUs: 100_000, RenewUs: 2_000_000, ColdAllowance: 50}
	dry := func(lastUsed, global int64) Record {
		return Record{SyncedUs: now - 500_000, UsedUs: lastUsed, GlobalRemaining: global,
			LeaseUntilUs: now + 500_000, LeaseEpoch: 1, ParamsTag: ParamsTag(p)}
	}
	for _, tt := range []struct {
		name string
		r    Record
		env  Env
		cold bool
	}{
		{"slow key, bucket nearly full: cold", dry(now-800_000, 990), env, true},
		{"slow key, exactly half left after it: cold", dry(now-800_000, 501), env, true},
		{"slow key, less than half left after it: acquire", dry(now-800_000, 500), env, false},
		{"hot key (used 5 ms ago), bucket full: acquire", dry(now-5_000, 990), env, false},
		{"used exactly an interval ago: cold", dry(now-100_000, 990), env, true},
		{"slow key, allowance spent: acquire", func() Record { r := dry(now-800_000, 990); r.ColdCut = 50; return r }(), env, false},
		{"slow key, no allowance: acquire", dry(now-800_000, 990), Env{Sync: true, Healthy: true, IntervalUs: 100_000}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.r
			d := DecideIn(nil, &r, p, now, 1, tt.env)
			if tt.cold != (d.Allowed && d.Cold && d.Over == 1) || tt.cold == d.Acquire {
				t.Fatalf("%+v, want cold %v (else an acquire)", d, tt.cold)
			}
			if tt.cold && (r.Cold != tt.r.Cold+1 || r.GlobalRemaining != tt.r.GlobalRemaining-1 || !r.Urgent) {
				t.Fatalf("cold admission: cold %d, global %d, urgent %v", r.Cold, r.GlobalRemaining, r.Urgent)
			}
		})
	}
}

// TestFirstLease: a gateway's first lease of a bucket, asked with a burst's demand sample,
// is at most capacity/(4·Nodes); an acquire's Want is granted from everything
// unreserved; a report over a real interval is sized by demand, within a quarter of the
// fleet share while the bucket is young (demand below its capacity over two epochs).
func TestFirstLease(t *testing.T) {
	const now = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 3_600_000_000, Burst: 100}
	delta := func(flags uint8, over, want, elapsed uint32) *wire.Delta {
		d := &wire.Delta{Key: "k", Rule: "r", Flags: flags, Over: over, Want: want, ElapsedMs: elapsed,
			Algo: uint8(p.Kind), Limit: 100, WindowMs: 3_600_000, Burst: 100}
		if want > 0 {
			d.Flags |= wire.FlagWant
		}
		return d
	}
	cfg := DefaultSyncConfig
	tests := []struct {
		name      string
		nodes     int64
		d         *wire.Delta
		reserved  int64 // outstanding leases before
		demand    int64 // the bucket's demand over the two epochs before
		wantGrant int64
	}{
		{"no fleet: half of the bucket", 1, delta(wire.FlagAcquire, 1, 0, 0), 0, 0, 49},
		{"four gateways: a quarter of the share", 4, delta(wire.FlagAcquire, 1, 0, 0), 0, 0, 6},
		{"sixteen gateways: the cost alone", 16, delta(wire.FlagAcquire, 1, 0, 0), 0, 0, 1},
		{"thirty gateways: nothing beyond the cost", 30, delta(wire.FlagAcquire, 1, 0, 0), 0, 0, 0},
		{"want: what waits", 16, delta(wire.FlagAcquire, 1, 30, 0), 0, 0, 30},
		{"want: from all that is free", 4, delta(wire.FlagAcquire, 1, 30, 5), 80, 0, 19},
		{"young bucket: a quarter of the fleet share, rounded up", 16, delta(0, 10, 0, 1000), 0, 0, 2},
		{"busy bucket: by demand, half of what is free", 16, delta(0, 10, 0, 1000), 0, 200, 45},
		// A hot key's lease ran dry and its gateway reports within the shortest interval
		// of its last reply: by demand, not as a first lease (which would be 1 here).
		{"busy bucket, report 50 ms after the last reply: by demand", 16, delta(0, 10, 0, 50), 0, 200, 45},
		{"busy bucket, never answered: a first lease", 16, delta(0, 10, 0, 0), 0, 200, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.Nodes = tt.nodes
			k, _, _, _, _ := epochClock(p, now, &c)
			b := Bucket{Leases: Leases{Epoch: k, Cur: tt.reserved, DemandPrev: tt.demand}}
			var pen Penalty
			r := Sync(&b, &pen, tt.d, now, c)
			if !r.Allowed || r.Grant != tt.wantGrant {
				t.Fatalf("allowed %v, grant %d, want %d", r.Allowed, r.Grant, tt.wantGrant)
			}
		})
	}
}
