package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestCalendarLeasesAcrossBoundary drives two gateways' reports on one calendar bucket
// across a period boundary — month ends of several lengths, a leap February, a year end,
// a Monday, offsets either side of UTC — through the script and the Go twin, which must
// agree on every answer and stored byte. It shows what the boundary does to leases: a
// lease granted in the period's last epoch is valid until the boundary (less the
// margin), not beyond; the first report after it reclaims every lease of the old period
// and is not charged for a lease of that period; the count starts afresh.
func TestCalendarLeasesAcrossBoundary(t *testing.T) {
	at := func(off int, y int, m time.Month, d int) int64 {
		return time.Date(y, m, d, 0, 0, 0, 0, time.FixedZone("", off*60)).UnixMicro()
	}
	cases := []struct {
		name string
		per  algo.Period
		off  int
		b    int64 // the boundary
	}{
		{"jan31_to_feb1", algo.Month, 0, at(0, 2027, 2, 1)},
		{"feb28_to_mar1", algo.Month, 0, at(0, 2027, 3, 1)},
		{"feb29_to_mar1_leap", algo.Month, 0, at(0, 2028, 3, 1)},
		{"dec31_to_jan1", algo.Month, 0, at(0, 2029, 1, 1)},
		{"month_plus_0530", algo.Month, 330, at(330, 2027, 3, 1)},
		{"month_minus_0800", algo.Month, -480, at(-480, 2029, 1, 1)},
		{"week_monday", algo.Week, 0, at(0, 2027, 3, 1)},
		{"day_plus_14", algo.Day, 840, at(840, 2028, 2, 29)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var clock int64
			s, _ := newStore(t, Standalone, nil)
			s.nowUs = func() int64 { return clock }
			cfg := s.cfg.Lease
			e := cfg.EpochMs * 1000
			tw := newTwin()
			p := algo.CalendarParams(10, tc.per, int64(tc.off))
			key := fmt.Sprintf("cal-%s-%d", tc.name, time.Now().UnixNano())
			seqs := map[string]uint64{}
			send := func(now int64, node string, d wire.Delta) lease.SyncResult {
				t.Helper()
				clock = now
				d.Key, d.Rule, d.Algo, d.Limit, d.WindowMs, d.Burst = key, "plan", uint8(algo.Calendar), uint32(p.Limit), uint32(p.WindowUs/1000), uint32(p.Burst)
				seqs[node]++
				b := wire.Batch{Node: key + "-" + node, Seq: seqs[node], Deltas: []wire.Delta{d}}
				out, err := s.Apply(context.Background(), &b, Options{Idempotent: true})
				if err != nil || out.States[0].Flags&wire.StateRefused != 0 {
					t.Fatalf("apply: %v %+v", err, out.States[0])
				}
				want := tw.apply(t, s, &b, []bool{false}, now, cfg)
				if out.Results[0] != want[0] {
					t.Fatalf("at %d µs from the boundary:\nlua %+v\ngo  %+v", now-tc.b, out.Results[0], want[0])
				}
				compareStored(t, s, tw, &b, 0)
				return want[0]
			}
			// Both gateways ask in the old period's last epoch; their demand earns leases.
			r1 := send(tc.b-e+e/4, "n1", wire.Delta{Over: 3, ElapsedMs: 500})
			r2 := send(tc.b-e+e/2, "n2", wire.Delta{Over: 3, ElapsedMs: 500})
			if r1.Grant == 0 || r2.Grant == 0 {
				t.Fatalf("no leases granted before the boundary: %+v %+v", r1, r2)
			}
			margin := min(cfg.ValidMarginMs*1000, e/10)
			if end := tc.b - (tc.b - e + e/2) - margin; r2.ValidUs != end {
				t.Errorf("a lease granted in the last epoch is valid %d µs, want %d (to the boundary less the margin)", r2.ValidUs, end)
			}
			if r2.ResetUs != e/2 {
				t.Errorf("reset in %d µs, want %d (the boundary)", r2.ResetUs, e/2)
			}
			// After the boundary n2 reports one permit of its old lease: the old period's
			// leases are reclaimed and its consumption is not charged to the new period.
			r3 := send(tc.b+1, "n2", wire.Delta{Leased: 1, Held: uint32(r2.Grant - 1), Epoch: r2.Epoch, ElapsedMs: 600})
			if r3.Reclaimed != r1.Grant+r2.Grant || r3.Held != 0 {
				t.Errorf("first report after the boundary reclaimed %d and renewed %d, want %d and 0", r3.Reclaimed, r3.Held, r1.Grant+r2.Grant)
			}
			_, _, next := algo.CalendarWindow(p, tc.b)
			if r3.ResetUs != next-(tc.b+1) {
				t.Errorf("reset in %d µs, want %d (the next boundary)", r3.ResetUs, next-tc.b-1)
			}
			if r3.Remaining+r3.Grant != p.Limit {
				t.Errorf("new period: remaining %d + granted %d, want the full limit %d", r3.Remaining, r3.Grant, p.Limit)
			}
			// n1 comes back with its old lease too: nothing of it counts any more.
			send(tc.b+e/4, "n1", wire.Delta{Leased: uint32(r1.Grant), Epoch: r1.Epoch, ElapsedMs: 700})
			// The key lives until the next boundary plus two epochs, not a month blindly.
			pttl := s.rdb.PTTL(context.Background(), BucketKey(key, "plan", "", 0)).Val()
			want := time.Duration(next-(tc.b+e/4)+2*e) * time.Microsecond
			if pttl > want || pttl < want-2*time.Second {
				t.Errorf("PTTL %v, want %v (the period's end plus two epochs)", pttl, want)
			}
		})
	}
}

// TestCalendarUsageAndReset: /v1/usage of a monthly quota on a real Redis names the
// calendar, counts what was reported and points its reset at the next boundary (the
// Feb 1 of the offset, then Mar 1 after the boundary), and /v1/reset deletes the bucket.
// The bucket key's TTL is covered by TestCalendarLeasesAcrossBoundary.
func TestCalendarUsageAndReset(t *testing.T) {
	s, now := usageStore(t)
	ctx := context.Background()
	off := int64(330)
	feb1 := time.Date(2028, 2, 1, 0, 0, 0, 0, time.FixedZone("", int(off)*60)).UnixMicro()
	mar1 := time.Date(2028, 3, 1, 0, 0, 0, 0, time.FixedZone("", int(off)*60)).UnixMicro()
	p := algo.CalendarParams(1000, algo.Month, off)
	key := uniq("plan")
	d := wire.Delta{Key: key, Rule: "plan", Algo: uint8(algo.Calendar), Limit: 1000, WindowMs: uint32(p.WindowUs / 1000),
		Burst: uint32(p.Burst), Over: 990, ElapsedMs: 100, Flags: wire.FlagStrict}
	*now = feb1 - 5_000_000
	if _, err := s.Apply(ctx, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{d}}, Options{Idempotent: true}); err != nil {
		t.Fatal(err)
	}
	check := func(at, remaining, resetUs int64) {
		t.Helper()
		*now = at
		u, err := s.Usage(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(u.Buckets) != 1 {
			t.Fatalf("%d buckets: %+v", len(u.Buckets), u.Buckets)
		}
		b := u.Buckets[0]
		want := BucketUsage{RedisKey: BucketKey(key, "plan", "", 0), Rule: "plan", Algorithm: "fixed_window", Limit: 1000,
			WindowMs: 31 * 86_400_000, Calendar: &CalendarUsage{Period: "month", UTCOffset: "+05:30"},
			Remaining: remaining, Available: remaining, ResetInMs: (resetUs - at + 999) / 1000}
		if b.Calendar == nil || *b.Calendar != *want.Calendar {
			t.Errorf("calendar %+v, want %+v", b.Calendar, want.Calendar)
		}
		b.Calendar = want.Calendar
		if b != want {
			t.Errorf("at %d µs from Feb 1:\n got %+v\nwant %+v", at-feb1, b, want)
		}
	}
	check(feb1-1, 10, feb1) // January's count, reset at the boundary
	check(feb1, 1000, mar1) // February: a fresh count, reset on Mar 1 (29 days: 2028 is a leap year)
	if mar1-feb1 != 29*algo.DayUs {
		t.Fatalf("February 2028 is %d days", (mar1-feb1)/algo.DayUs)
	}
	*now = feb1 - 1
	n, err := s.Reset(ctx, key)
	if err != nil || n != 1 {
		t.Fatalf("reset deleted %d keys (%v), want the bucket", n, err)
	}
	if u, err := s.Usage(ctx, key); err != nil || len(u.Buckets) != 0 {
		t.Errorf("after reset: %+v (%v), want no bucket", u, err)
	}
}
