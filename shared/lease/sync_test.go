package lease

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

var testCfg = SyncConfig{LeaseTTLUs: 3_000_000, HorizonMs: 200, PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 8_000_000}

func delta(kind algo.Kind, limit, windowMs, burst uint32) wire.Delta {
	return wire.Delta{Key: "k", Rule: "r", Algo: uint8(kind), Limit: limit, WindowMs: windowMs, Burst: burst}
}

// fleet drives Sync the way gateways do: each node holds what it was granted, spends it
// (Leased), admits some outside it (Over), drops some (Returned) and is sometimes silent
// long enough for its lease to expire.
type fleet struct {
	t        *testing.T
	rng      *rand.Rand
	b        Bucket
	pen      Penalty
	now      int64
	seq      map[WorkerID]uint64
	local    map[string]int64 // lease each node believes it holds
	reported int64            // Σ Leased + Over (strict: when allowed)
}

func newFleet(t *testing.T, seed uint64) *fleet {
	return &fleet{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e37)), now: 1_000_000, seq: map[WorkerID]uint64{}, local: map[string]int64{}}
}

func (f *fleet) step(node string, worker uint32, d wire.Delta) SyncResult {
	f.t.Helper()
	id := WorkerID{node, worker}
	f.seq[id]++
	before := f.b.Fields()
	penBefore := f.pen
	r := Sync(&f.b, &f.pen, node, worker, f.seq[id], &d, f.now, testCfg)
	if r.Replay {
		f.t.Fatalf("fresh seq answered as replay")
	}
	f.reported += int64(d.Leased)
	if d.Flags&wire.FlagStrict == 0 || r.Allowed {
		f.reported += int64(d.Over)
	}
	f.local[node] += r.Grant

	// Replaying the same batch at the same time changes nothing and answers the same.
	after := f.b.Fields()
	penAfter := f.pen
	rr := Sync(&f.b, &f.pen, node, worker, f.seq[id], &d, f.now, testCfg)
	want := r
	want.Replay, want.Overshoot, want.Reclaimed = true, 0, 0
	if rr != want {
		f.t.Fatalf("replay answered %+v, first answer %+v", rr, r)
	}
	if !maps.Equal(after, f.b.Fields()) || penAfter != f.pen {
		f.t.Fatalf("replay changed the bucket:\nbefore %v\nafter  %v", after, f.b.Fields())
	}
	// An older seq is a replay too.
	if f.seq[id] > 1 {
		if ro := Sync(&f.b, &f.pen, node, worker, f.seq[id]-1, &d, f.now, testCfg); !ro.Replay {
			f.t.Fatalf("older seq applied again (before: %v)", before)
		}
	}
	_ = penBefore
	return r
}

// TestSyncAccounting checks RATIONALE §2's invariant on a fixed window that does not
// roll during the test, where Available is exactly limit − net permits taken.
func TestSyncAccounting(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			f := newFleet(t, seed)
			const limit = 500
			p := delta(algo.FixedWindow, limit, 3_600_000, 0)
			params := ParamsOf(&p)
			nodes := []string{"a", "b", "c", "d:with:colons"}
			for i := 0; i < 400; i++ {
				node := nodes[f.rng.IntN(len(nodes))]
				d := p
				if l := f.local[node]; l > 0 {
					d.Leased = uint32(f.rng.Int64N(l + 1))
					f.local[node] -= int64(d.Leased)
					if f.rng.IntN(8) == 0 {
						d.Returned = uint32(f.rng.Int64N(f.local[node] + 1))
						f.local[node] -= int64(d.Returned)
					}
				}
				if f.rng.IntN(3) == 0 {
					d.Over = uint32(f.rng.IntN(20))
				}
				if f.rng.IntN(10) == 0 {
					d.Flags |= wire.FlagStrict
				}
				d.Rejected = uint32(f.rng.IntN(3))
				if f.rng.IntN(20) == 0 {
					d.Early = 1
				}
				// Mostly 100 ms apart; sometimes a silence long enough to expire leases.
				switch f.rng.IntN(40) {
				case 0:
					f.now += testCfg.LeaseTTLUs + 1
					for n := range f.local {
						f.local[n] = 0 // nodes drop leases they could not renew
					}
				default:
					f.now += int64(f.rng.IntN(100_000))
				}
				f.step(node, uint32(f.rng.IntN(3)), d)

				out := f.b.Outstanding()
				taken := limit - algo.Available(params, f.b.State, f.now)
				if taken != f.reported+out {
					t.Fatalf("step %d: taken %d != reported %d + outstanding %d", i, taken, f.reported, out)
				}
				if out > limit {
					t.Fatalf("step %d: outstanding leases %d exceed the bucket (%d)", i, out, limit)
				}
			}
		})
	}
}

// TestSyncLeasesBounded: with refill (token bucket, GCRA, sliding windows) outstanding
// leases never exceed capacity and a grant never exceeds what was available.
func TestSyncLeasesBounded(t *testing.T) {
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingWindowLog, algo.SlidingWindowCounter, algo.FixedWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			f := newFleet(t, uint64(kind)+100)
			p := delta(kind, 100, 1000, 0)
			params := ParamsOf(&p)
			for i := 0; i < 500; i++ {
				node := fmt.Sprint("n", f.rng.IntN(5))
				d := p
				l := f.local[node]
				d.Leased = uint32(min(l, int64(f.rng.IntN(40))))
				f.local[node] -= int64(d.Leased)
				d.Over = uint32(f.rng.IntN(3))
				d.Rejected = uint32(f.rng.IntN(5))
				f.now += int64(f.rng.IntN(60_000))
				avail := algo.Available(params, f.b.State, f.now)
				r := f.step(node, 0, d)
				if r.Grant > max(avail, 0)+int64(d.Leased)+f.b.Outstanding() {
					t.Fatalf("step %d: grant %d from a bucket holding %d", i, r.Grant, avail)
				}
				if out := f.b.Outstanding(); out > params.Capacity() {
					t.Fatalf("step %d: outstanding %d > capacity %d", i, out, params.Capacity())
				}
				if r.Remaining != algo.Available(params, f.b.State, f.now) {
					t.Fatalf("step %d: remaining %d is not the bucket's available", i, r.Remaining)
				}
			}
		})
	}
}

func TestSyncExpiryReclaims(t *testing.T) {
	var b Bucket
	var pen Penalty
	d := delta(algo.FixedWindow, 1000, 3_600_000, 0)
	params := ParamsOf(&d)
	now := int64(10_000_000)
	d.Over = 50
	ra := Sync(&b, &pen, "a", 0, 1, &d, now, testCfg)
	if ra.Grant == 0 || b.Nodes["a"].Outstanding != ra.Grant {
		t.Fatalf("node a got no lease: %+v", ra)
	}
	d.Over = 0
	// b syncs just before a's lease expires: nothing reclaimed.
	rb := Sync(&b, &pen, "b", 0, 1, &d, now+testCfg.LeaseTTLUs, testCfg)
	if rb.Reclaimed != 0 || b.Nodes["a"] == nil {
		t.Fatalf("lease reclaimed before its TTL: %+v", rb)
	}
	availBefore := algo.Available(params, b.State, now)
	rb = Sync(&b, &pen, "b", 0, 2, &d, now+testCfg.LeaseTTLUs+1, testCfg)
	if rb.Reclaimed != ra.Grant {
		t.Fatalf("reclaimed %d, a held %d", rb.Reclaimed, ra.Grant)
	}
	if b.Nodes["a"] != nil {
		t.Fatalf("expired node a still recorded")
	}
	if _, ok := b.Applied[WorkerID{"a", 0}]; ok {
		t.Fatalf("expired node a's idempotency record kept")
	}
	if got := algo.Available(params, b.State, now) + b.Nodes["b"].Outstanding; got != availBefore+ra.Grant {
		t.Fatalf("available+b's lease = %d, want %d (a's lease back in the pool)", got, availBefore+ra.Grant)
	}
	// a comes back and reports consumption from the reclaimed lease: charged as overage.
	d.Leased = uint32(ra.Grant)
	r := Sync(&b, &pen, "a", 0, 2, &d, now+testCfg.LeaseTTLUs+2, testCfg)
	if r.Replay {
		t.Fatal("seq 2 after reclaim treated as replay")
	}
}

func TestSyncGrants(t *testing.T) {
	tests := []struct {
		name      string
		limit     uint32
		over      uint32
		prevNodes map[string]int64 // demand of other live nodes
		wantMin   int64
		wantMax   int64
	}{
		// 50 permits in one 100 ms interval: 500/s, horizon 200 ms → 100.
		{name: "demand sized", limit: 10_000, over: 50, wantMin: 100, wantMax: 100},
		{name: "at least one", limit: 10_000, over: 0, wantMin: 0, wantMax: 0},
		{name: "capped by pool", limit: 60, over: 50, wantMin: 10, wantMax: 10},
		// 100 in 100 ms asks for 200, but another node has the same demand: half the pool.
		{name: "fair share", limit: 200, over: 100, prevNodes: map[string]int64{"x": 1_000_000}, wantMin: 50, wantMax: 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b Bucket
			var pen Penalty
			now := int64(5_000_000)
			d := delta(algo.FixedWindow, tc.limit, 3_600_000, 0)
			for n, dem := range tc.prevNodes {
				if b.Nodes == nil {
					b.Nodes = map[string]*NodeLease{}
				}
				b.Nodes[n] = &NodeLease{Demand: dem, LastSyncUs: now}
			}
			d.Over = tc.over
			r := Sync(&b, &pen, "a", 0, 1, &d, now, testCfg)
			if r.Grant < tc.wantMin || r.Grant > tc.wantMax {
				t.Fatalf("grant %d, want [%d, %d] (demand %d)", r.Grant, tc.wantMin, tc.wantMax, b.Nodes["a"].Demand)
			}
		})
	}
	t.Run("at least one when the share rounds to zero", func(t *testing.T) {
		var b Bucket
		var pen Penalty
		d := delta(algo.FixedWindow, 100, 3_600_000, 0)
		d.Rejected = 1
		now := int64(59_000_000)
		b.Nodes = map[string]*NodeLease{"a": {LastSyncUs: now - 2_900_000}, "x": {Demand: 1 << 31, LastSyncUs: now}}
		r := Sync(&b, &pen, "a", 0, 1, &d, now, testCfg)
		if b.Nodes["a"].Demand <= 0 || r.Grant != 1 {
			t.Fatalf("grant %d with demand %d, want 1", r.Grant, b.Nodes["a"].Demand)
		}
	})
}

func TestSyncStrict(t *testing.T) {
	var b Bucket
	var pen Penalty
	d := delta(algo.FixedWindow, 10, 3_600_000, 0)
	d.Flags = wire.FlagStrict
	now := int64(1_000_000)
	for i := 1; i <= 12; i++ {
		d.Over = 1
		r := Sync(&b, &pen, "a", 0, uint64(i), &d, now, testCfg)
		if want := i <= 10; r.Allowed != want {
			t.Fatalf("check %d: allowed %v, want %v (%+v)", i, r.Allowed, want, r)
		}
		if r.Grant != 0 {
			t.Fatalf("strict delta granted a lease")
		}
		if !r.Allowed && r.RetryUs == 0 {
			t.Fatalf("refused without retry-after")
		}
		// A replayed refusal stays a refusal; a replayed admission stays one.
		if rr := Sync(&b, &pen, "a", 0, uint64(i), &d, now, testCfg); rr.Allowed != r.Allowed {
			t.Fatalf("replay of check %d answered allowed=%v", i, rr.Allowed)
		}
	}
}

func TestSyncPenaltyGrowsAndCaps(t *testing.T) {
	var b Bucket
	var pen Penalty
	d := delta(algo.TokenBucket, 10, 1000, 0)
	d.Early, d.Rejected = 1, 1
	now := int64(1_000_000)
	var last int64
	levels := []int64{1, 2, 3, 4, 4, 4}
	for i, want := range levels {
		now += testCfg.PenaltyBaseUs
		r := Sync(&b, &pen, "a", 0, uint64(i+1), &d, now, testCfg)
		if r.Level != want {
			t.Fatalf("step %d: level %d, want %d", i, r.Level, want)
		}
		if r.PenaltyUs < last && r.PenaltyUs != testCfg.PenaltyMaxUs {
			t.Fatalf("step %d: cooldown shrank %d -> %d", i, last, r.PenaltyUs)
		}
		if r.PenaltyUs > testCfg.PenaltyMaxUs {
			t.Fatalf("step %d: cooldown %d above cap %d", i, r.PenaltyUs, testCfg.PenaltyMaxUs)
		}
		if r.Grant != 0 {
			t.Fatalf("penalized key granted a lease")
		}
		last = r.PenaltyUs
	}
	// Two early reports within one base interval count once.
	r := Sync(&b, &pen, "a", 1, 1, &d, now+1, testCfg)
	if r.Level != 4 {
		t.Fatalf("level moved within one base interval: %d", r.Level)
	}
	// Calm for PenaltyMax after the cooldown: forgiven.
	d.Early, d.Rejected = 0, 0
	r = Sync(&b, &pen, "a", 0, 100, &d, pen.UntilUs+testCfg.PenaltyMaxUs, testCfg)
	if r.Level != 0 || r.PenaltyUs != 0 || len(pen.Fields()) != 0 {
		t.Fatalf("penalty not forgiven: %+v %+v", r, pen)
	}
}

func TestSyncAlgorithmChangeResetsState(t *testing.T) {
	var b Bucket
	var pen Penalty
	d := delta(algo.FixedWindow, 10, 60_000, 0)
	d.Over = 10
	Sync(&b, &pen, "a", 0, 1, &d, 1_000_000, testCfg)
	d.Algo, d.Over = uint8(algo.GCRA), 0
	r := Sync(&b, &pen, "a", 0, 2, &d, 1_000_001, testCfg)
	if r.Remaining+r.Held != 10 {
		t.Fatalf("after switching algorithm: remaining %d + held %d, want a fresh bucket of 10", r.Remaining, r.Held)
	}
}

func TestBucketFieldsRoundTrip(t *testing.T) {
	f := newFleet(t, 7)
	d := delta(algo.SlidingWindowCounter, 1000, 1000, 0)
	for i := 0; i < 50; i++ {
		d.Over = uint32(f.rng.IntN(30))
		f.now += 20_000
		f.step(fmt.Sprint("node:", i%4), uint32(i%3), d)
		fields := f.b.Fields()
		got, ignored := ParseBucket(fields)
		if ignored != 0 {
			t.Fatalf("%d fields ignored in %v", ignored, fields)
		}
		if !maps.Equal(got.Fields(), fields) {
			t.Fatalf("round trip:\n%v\n%v", fields, got.Fields())
		}
	}
	pen := Penalty{Level: 3, UntilUs: 99, LastUs: 7}
	if got := ParsePenalty(pen.Fields()); got != pen {
		t.Fatalf("penalty round trip %+v", got)
	}
}

func FuzzParseBucket(f *testing.F) {
	f.Add("st", "\x10abc", "o:n", "5", "q:n:1", "99")
	f.Add("p", "0:10:1000000:0", "g:a:b:3", "-1", "s:x", "junk")
	f.Add("q::1", "1", "q:n:x", "1", "d:", "1")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		fields := map[string]string{k1: v1, k2: v2, k3: v3}
		b, _ := ParseBucket(fields)
		// Whatever was understood re-encodes to fields that parse back the same.
		again, ignored := ParseBucket(b.Fields())
		if ignored != 0 || !maps.Equal(again.Fields(), b.Fields()) {
			t.Fatalf("re-encoding is not stable: %v -> %v", b.Fields(), again.Fields())
		}
	})
}

func FuzzParseParams(f *testing.F) {
	f.Add("0:10:1000000:0")
	f.Add("4:1:1000:5")
	f.Add("1::2:3")
	f.Fuzz(func(t *testing.T, s string) {
		p, ok := ParseParams(s)
		if !ok {
			return
		}
		if q, ok := ParseParams(FormatParams(p)); !ok || q != p {
			t.Fatalf("%q -> %+v -> %q", s, p, FormatParams(p))
		}
	})
}

// Consumption admitted while a gateway was cut off (FlagDegraded) is charged only up to
// what the bucket holds: the outage's over-admission is recorded as overshoot but not
// turned into debt that would lock out callers within their limit afterwards. Ordinary
// overage is still charged in full.
func TestSyncForgivesDegradedOverage(t *testing.T) {
	tests := []struct {
		name      string
		flags     uint8
		wantAvail int64
	}{
		{"degraded overage is forgiven", wire.FlagDegraded, 0},
		{"ordinary overage is debt", 0, -30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Bucket
			var pen Penalty
			d := delta(algo.FixedWindow, 100, 3_600_000, 0)
			d.Over, d.Flags = 130, tt.flags
			now := int64(1_000_000)
			r := Sync(&b, &pen, "a", 0, 1, &d, now, testCfg)
			if r.Overshoot != 30 {
				t.Fatalf("overshoot %d, want 30", r.Overshoot)
			}
			p := ParamsOf(&d)
			if got := algo.Available(p, b.State, now); got != tt.wantAvail {
				t.Fatalf("available %d, want %d", got, tt.wantAvail)
			}
		})
	}
}
