package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const sec = int64(1_000_000)

var perMinute100 = algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 60 * sec}

func healthy(nodes int64) Env {
	return Env{Sync: true, Healthy: true, Nodes: nodes, LeaseTTLUs: sec, IntervalUs: sec / 10}
}

func TestDecideModes(t *testing.T) {
	now := int64(1_700_000_000) * sec
	synced := Record{SyncedUs: now - sec/10, LeaseLeft: 3, Overdraft: 2, GlobalRemaining: 10, ResetUs: now + 30*sec, RetryUs: now}
	tests := []struct {
		name      string
		rec       Record
		env       Env
		cost      int64
		allowed   bool
		leased    int64
		over      int64
		returned  int64
		degraded  bool
		flush     bool
		penalized bool
	}{
		{"standalone decides on the local algorithm", Record{}, Env{Nodes: 1}, 1, true, 0, 1, 0, false, false, false},
		{"cold start asks for a flush", Record{}, healthy(4), 1, true, 0, 1, 0, false, true, false},
		{"lease first", synced, healthy(4), 2, true, 2, 0, 0, false, false, false},
		{"overdraft when the lease is short", Record{SyncedUs: now - 1, LeaseLeft: 1, Overdraft: 2, GlobalRemaining: 10}, healthy(4), 2, true, 0, 2, 0, false, true, false},
		{"rejects when lease and overdraft are spent", Record{SyncedUs: now - 1, GlobalRemaining: 0, RetryUs: now + 5*sec}, healthy(4), 1, false, 0, 0, 0, false, true, false},
		{"stale lease is returned; a healthy fleet treats the bucket as cold", Record{SyncedUs: now - 2*sec, LeaseLeft: 7, GlobalRemaining: 40}, healthy(4), 1, true, 0, 1, 7, false, true, false},
		{"open breaker degrades", synced, Env{Sync: true, Nodes: 4, LeaseTTLUs: sec}, 1, true, 0, 1, 3, true, false, false},
		{"penalty cooldown rejects", Record{SyncedUs: now - 1, LeaseLeft: 50, PenaltyUntilUs: now + 4*sec, PenaltyLevel: 2}, healthy(4), 1, false, 0, 0, 0, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, d := Decide(tt.rec, perMinute100, now, tt.cost, tt.env)
			if d.Allowed != tt.allowed || d.Leased != tt.leased || d.Over != tt.over || d.Returned != tt.returned ||
				d.Degraded != tt.degraded || d.Flush != tt.flush || d.Penalized != tt.penalized {
				t.Fatalf("decision %+v", d)
			}
			if !d.Allowed && d.RetryAfterUs <= 0 {
				t.Fatalf("rejection without a retry time: %+v", d)
			}
			if d.Allowed && d.Rejected != 0 || !d.Allowed && d.Rejected != 1 {
				t.Fatalf("rejected count %d", d.Rejected)
			}
			if tt.rec.LeaseLeft-next.LeaseLeft != d.Leased+d.Returned {
				t.Fatalf("lease went %d -> %d for leased %d returned %d", tt.rec.LeaseLeft, next.LeaseLeft, d.Leased, d.Returned)
			}
		})
	}
}

// TestColdStartShare: before its first reply a gateway may spend only its share of a full
// bucket, so a fleet of cold gateways cannot together exceed the capacity.
func TestColdStartShare(t *testing.T) {
	now := int64(1_700_000_000) * sec
	for _, nodes := range []int64{1, 2, 4, 7} {
		var r Record
		admitted := int64(0)
		for i := 0; i < 500; i++ {
			var d Decision
			r, d = Decide(r, perMinute100, now, 1, healthy(nodes))
			if d.Allowed {
				admitted++
			}
		}
		if want := perMinute100.Limit / nodes; admitted != want {
			t.Errorf("nodes=%d: admitted %d cold, want %d", nodes, admitted, want)
		}
	}
}

// TestEarlyRetriesCount: a caller that comes back before the announced Retry-After is
// counted as early (the progressive-penalty signal); one that waits is not.
func TestEarlyRetriesCount(t *testing.T) {
	now := int64(1_700_000_000) * sec
	r := Record{SyncedUs: now, GlobalRemaining: 0, RetryUs: now + 10*sec}
	// A refusal because this gateway's share ran out while the global bucket still has
	// permits is not the caller's fault: it never counts as early.
	soft := Record{SyncedUs: now, GlobalRemaining: 5, RetryUs: now}
	for i := 0; i < 3; i++ {
		var d Decision
		soft, d = Decide(soft, perMinute100, now+int64(i), 1, healthy(1))
		if d.Allowed || d.Early != 0 || d.Rejected != 1 || !d.Flush {
			t.Fatalf("soft refusal %d: %+v", i, d)
		}
	}
	env := healthy(1)
	env.LeaseTTLUs = 100 * sec
	r, d := Decide(r, perMinute100, now, 1, env)
	if d.Allowed || d.Early != 0 {
		t.Fatalf("first rejection: %+v", d)
	}
	r, d = Decide(r, perMinute100, now+sec, 1, env)
	if d.Early != 1 {
		t.Fatalf("retry after 1s of a 10s Retry-After not counted early: %+v", d)
	}
	_, d = Decide(r, perMinute100, now+11*sec, 1, env)
	if d.Early != 0 {
		t.Fatalf("retry after the announced time counted early: %+v", d)
	}
}

func TestApplyReply(t *testing.T) {
	now := int64(1_700_000_000) * sec
	r := Record{LeaseLeft: 2}
	r, _ = ApplyReply(r, &wire.State{Lease: 5, Remaining: 40, ResetInMs: 3000, RetryInMs: 0, PenaltyInMs: 2000, PenaltyLevel: 1}, now, 4, 0)
	if r.LeaseLeft != 7 || r.Overdraft != 10 || r.GlobalRemaining != 40 || r.SyncedUs != now ||
		r.ResetUs != now+3*sec || r.PenaltyUntilUs != now+2*sec || r.PenaltyLevel != 1 {
		t.Fatalf("record %+v", r)
	}
	r, _ = ApplyReply(r, &wire.State{Remaining: -5}, now+sec, 4, 0)
	if r.Overdraft != 0 || r.PenaltyUntilUs != 0 {
		t.Fatalf("debt must leave no overdraft and a cleared penalty: %+v", r)
	}
}

func TestRecordEncoding(t *testing.T) {
	now := int64(1_700_000_000) * sec
	tests := []struct {
		name string
		rec  Record
	}{
		{"zero", Record{}},
		{"cold with times", Record{AnnouncedUs: now + 3*sec, ResetUs: now + 60*sec, Local: algo.Take(perMinute100, nil, now, 3)}},
		{"used after sync", Record{UsedUs: now + 2*sec, SyncedUs: now, LeaseLeft: 1, OverSinceSync: 6, RetryUs: now + 3*sec, Local: algo.Take(perMinute100, nil, now, 1)}},
		{"synced", Record{SyncedUs: now, LeaseLeft: 12, Overdraft: 3, GlobalRemaining: -4, ResetUs: now + 60*sec, RetryUs: now + 2*sec,
			PenaltyUntilUs: now + 8*sec, AnnouncedUs: now + sec, PenaltyLevel: 3, Local: algo.Take(perMinute100, nil, now, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := AppendRecord(nil, &tt.rec)
			if len(b) > 64 {
				t.Fatalf("record is %d bytes, budget 64", len(b))
			}
			var got Record
			if err := DecodeRecord(b, &got); err != nil {
				t.Fatal(err)
			}
			// SyncedUs is kept in milliseconds rounded down: a lease never looks younger.
			if got.SyncedUs > tt.rec.SyncedUs || tt.rec.SyncedUs-got.SyncedUs >= 1000 || got.LeaseLeft != tt.rec.LeaseLeft || got.Overdraft != tt.rec.Overdraft ||
				got.GlobalRemaining != tt.rec.GlobalRemaining || got.PenaltyLevel != tt.rec.PenaltyLevel ||
				got.UsedUs != tt.rec.UsedUs || got.OverSinceSync != tt.rec.OverSinceSync ||
				string(got.Local) != string(tt.rec.Local) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tt.rec)
			}
			for _, pair := range [][2]int64{{got.ResetUs, tt.rec.ResetUs}, {got.RetryUs, tt.rec.RetryUs},
				{got.PenaltyUntilUs, tt.rec.PenaltyUntilUs}, {got.AnnouncedUs, tt.rec.AnnouncedUs}} {
				// Times are kept in milliseconds rounded up: never earlier, < 1 ms later.
				if pair[0] < pair[1] || pair[0]-pair[1] >= 1000 || (pair[1] == 0) != (pair[0] == 0) {
					t.Fatalf("time %d decoded as %d", pair[1], pair[0])
				}
			}
		})
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, &Record{SyncedUs: 5, LeaseLeft: 1}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Record
		if DecodeRecord(data, &r) != nil {
			return
		}
		var again Record
		if err := DecodeRecord(AppendRecord(nil, &r), &again); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
	})
}

// Over admitted outside the lease that the reply could not include (other workers, or after
// the batch was cut) is taken off the reply's remaining and stays counted until reported.
func TestApplyReplySubtractsUnreportedOver(t *testing.T) {
	now := int64(1_700_000_000) * sec
	r := Record{OverSinceSync: 30}
	r, _ = ApplyReply(r, &wire.State{Remaining: 100}, now, 2, 10)
	if r.GlobalRemaining != 80 || r.Overdraft != 40 || r.OverSinceSync != 20 {
		t.Fatalf("record %+v", r)
	}
	r, _ = ApplyReply(r, &wire.State{Remaining: 60}, now, 2, 20)
	if r.GlobalRemaining != 60 || r.OverSinceSync != 0 {
		t.Fatalf("once reported nothing is taken off: %+v", r)
	}
	// A lease granted out of permits this gateway already admitted goes straight back.
	r = Record{OverSinceSync: 14}
	r, ret := ApplyReply(r, &wire.State{Remaining: 12, Lease: 2}, now, 1, 1)
	if ret != 1 || r.LeaseLeft != 1 || r.GlobalRemaining != 0 {
		t.Fatalf("returned %d, record %+v; want 1 returned, lease 1, remaining 0", ret, r)
	}
}

// A bucket whose lease expired restarts cold, but never beyond what the service last said:
// an empty bucket stays refused until its RetryUs, and a partial one restarts from the
// last-known remaining plus the refill since.
func TestExpiredLeaseRestart(t *testing.T) {
	now := int64(1_700_000_000) * sec
	env := healthy(1)
	empty := Record{SyncedUs: now - 2*sec, GlobalRemaining: 0, RetryUs: now + 30*sec}
	if _, d := Decide(empty, perMinute100, now, 1, env); d.Allowed || d.RetryAfterUs != 30*sec {
		t.Fatalf("a spent bucket refilled after a pause: %+v", d)
	}
	// The service leased this gateway everything; the expired lease goes back to the pool.
	leased := Record{SyncedUs: now - 2*sec, LeaseLeft: 2, GlobalRemaining: 0, RetryUs: now + 30*sec}
	if _, d := Decide(leased, perMinute100, now, 1, env); !d.Allowed || d.Returned != 2 {
		t.Fatalf("a returned lease must count as available: %+v", d)
	}
	// 2 s at 100/min refills 3 (one per 600 ms); 5 were left: 8 admitted, then refusals.
	r := Record{SyncedUs: now - 2*sec, GlobalRemaining: 5, RetryUs: now - sec}
	admitted := 0
	for i := 0; i < 20; i++ {
		var d Decision
		r, d = Decide(r, perMinute100, now, 1, env)
		if d.Allowed {
			admitted++
		} else if d.Early != 0 || d.RetryAfterUs != env.IntervalUs {
			t.Fatalf("a spent cold slice must be a soft refusal: %+v", d)
		}
	}
	if admitted != 8 {
		t.Fatalf("admitted %d after the restart, want 8", admitted)
	}
	if r.OverSinceSync != 8 {
		t.Fatalf("OverSinceSync %d", r.OverSinceSync)
	}
}

// A never-synced bucket in use is not idle (local mode eviction).
func TestIdleUsesLastDecision(t *testing.T) {
	now := int64(1_700_000_000) * sec
	r, _ := Decide(Record{}, perMinute100, now, 1, Env{Nodes: 1})
	if r.Idle(now+sec, 10*sec) {
		t.Fatal("a bucket used a second ago is idle")
	}
	if !r.Idle(now+11*sec, 10*sec) {
		t.Fatal("a bucket unused for 11 s is not idle")
	}
}

// Penalized and refused answers never tell the caller to come back before the bucket
// itself would admit the request.
func TestRetryNeverBeforeTheBucket(t *testing.T) {
	now := int64(1_700_000_000) * sec
	env := healthy(1)
	env.LeaseTTLUs = 100 * sec
	pen := Record{SyncedUs: now, PenaltyUntilUs: now + sec, RetryUs: now + 5*sec, PenaltyLevel: 1}
	if _, d := Decide(pen, perMinute100, now, 1, env); !d.Penalized || d.RetryAfterUs != 5*sec {
		t.Fatalf("penalty shorter than the bucket's wait: %+v", d)
	}
	// The overdraft is spent and the global bucket was at 2 when the reply came (RetryUs
	// then was "now"): refill at 100/min is 600 ms a permit, so a cost of 4 waits 1.2 s.
	spent := Record{SyncedUs: now, GlobalRemaining: 2, RetryUs: now}
	if _, d := Decide(spent, perMinute100, now+sec/10, 4, env); d.Allowed || d.RetryAfterUs != 1200*sec/1000 {
		t.Fatalf("refusal with a stale retry time: %+v", d)
	}
}

// A slow client whose every request finds the lease expired is not starved by a large
// fleet: the returned lease was this gateway's and stays usable here.
func TestExpiredLeaseStaysWithTheGateway(t *testing.T) {
	now := int64(1_700_000_000) * sec
	small := algo.Params{Kind: algo.TokenBucket, Limit: 3, WindowUs: 60 * sec}
	env := healthy(8)
	r := Record{SyncedUs: now - 1250*1000, LeaseLeft: 2, GlobalRemaining: 0, RetryUs: now + 20*sec}
	if _, d := Decide(r, small, now, 1, env); !d.Allowed || d.Returned != 2 {
		t.Fatalf("the gateway's own expired lease must stay usable with 8 gateways: %+v", d)
	}
}

// Undo reverses every kind of admission exactly (up to the local algorithm's refund).
func TestUndoInvertsDecide(t *testing.T) {
	now := int64(1_700_000_000) * sec
	tests := []struct {
		name string
		rec  Record
		env  Env
	}{
		{"leased", Record{SyncedUs: now - 1, UsedUs: now - 1, LeaseLeft: 3, Overdraft: 2, GlobalRemaining: 10}, healthy(4)},
		{"overdraft", Record{SyncedUs: now - 1, UsedUs: now - 1, Overdraft: 2, GlobalRemaining: 10, OverSinceSync: 1}, healthy(4)},
		{"cold", Record{}, healthy(2)},
		{"degraded", Record{SyncedUs: now - 1, UsedUs: now - 1, GlobalRemaining: 10}, Env{Sync: true, Nodes: 4, LeaseTTLUs: sec}},
		{"standalone", Record{}, Env{Nodes: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, d := Decide(tt.rec, perMinute100, now, 1, tt.env)
			if !d.Allowed {
				t.Fatalf("not admitted: %+v", d)
			}
			back := Undo(next, perMinute100, now, 1, &d)
			want := tt.rec
			want.UsedUs = now // the decision happened; only its consumption is undone
			if back.LeaseLeft != want.LeaseLeft || back.Overdraft != want.Overdraft ||
				back.GlobalRemaining != want.GlobalRemaining || back.OverSinceSync != want.OverSinceSync {
				t.Fatalf("undo:\n got %+v\nwant %+v", back, want)
			}
			if got, wantAvail := algo.Available(perMinute100, back.Local, now), algo.Available(perMinute100, next.Local, now)+1; got != wantAvail {
				t.Fatalf("local state not refunded: available %d, want %d", got, wantAvail)
			}
		})
	}
}
