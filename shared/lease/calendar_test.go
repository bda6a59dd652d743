package lease

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestCalendarEpochs: a calendar window's lease epochs restart at every period boundary
// (index 0 in the period, an epoch number above every epoch of the period before, so
// advance reclaims everything) and no epoch's leases are valid past the boundary, for
// months of 28 to 31 days, weeks and days, at offsets either side of UTC.
func TestCalendarEpochs(t *testing.T) {
	cfg := DefaultSyncConfig.Normalized()
	e := cfg.EpochMs * 1000
	for per := algo.Day; per <= algo.Month; per++ {
		for _, off := range []int64{0, 330, -480} {
			p := algo.CalendarParams(100, per, off)
			now := time.Date(2027, 12, 15, 0, 0, 0, 0, time.UTC).UnixMicro()
			for range 15 {
				_, _, end := algo.CalendarWindow(p, now)
				kLast, jLast, _, _, vLast := epochClock(p, end-1, &cfg)
				k, j, start, _, _ := epochClock(p, end, &cfg)
				if j != 0 || start != end || int32(k-kLast) < 1 {
					t.Fatalf("%s %s at %s: epoch %d (j %d, start %d) after %d (j %d)", per, algo.FormatOffset(off),
						time.UnixMicro(end).UTC(), k, j, start, kLast, jLast)
				}
				if vLast != end {
					t.Errorf("%s: leases of the last epoch valid until %d, want the boundary %d", per, vLast, end)
				}
				var l Leases
				l.advance(kLast, jLast, true)
				l.Cur, l.Prev = 5, 3
				if got := l.advance(k, j, true); got != 8 || l.Outstanding() != 0 {
					t.Errorf("%s: the boundary reclaimed %d, left %d outstanding", per, got, l.Outstanding())
				}
				if _, j2, s2, _, _ := epochClock(p, end+e, &cfg); j2 != 1 || s2 != end+e {
					t.Errorf("%s: the second epoch of a period is %d from %d", per, j2, s2)
				}
				now = end + 1
			}
		}
	}
}

// TestRefillUs: the wait for permits on a fixed or calendar window ends with the window;
// on the other algorithms it is the steady rate's.
func TestRefillUs(t *testing.T) {
	feb1 := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	tests := []struct {
		name string
		p    algo.Params
		now  int64
		n    int64
		want int64
	}{
		{"month_two_minutes_before_the_1st", algo.CalendarParams(5, algo.Month, 0), feb1 - 120_000_000, 1, 120_000_000},
		{"month_a_permit_sooner_than_the_end", algo.CalendarParams(1_000_000_000, algo.Month, 0), feb1 - 120_000_000, 1, 2678},
		{"fixed_window_end", algo.Params{Kind: algo.FixedWindow, Limit: 5, WindowUs: 60_000_000}, 50_000_000, 3, 10_000_000},
		{"token_bucket_rate", algo.Params{Kind: algo.TokenBucket, Limit: 5, WindowUs: 60_000_000}, 50_000_000, 3, 36_000_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RefillUs(tt.p, tt.now, tt.n); got != tt.want {
				t.Errorf("RefillUs = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestReplyAfterLongSilence: a bucket used again after more than 24.8 days (the low 32
// bits of the server's milliseconds then compare as older) takes the service's answer;
// an answer really older than the one applied (replies overtaking each other) is still
// ignored. A monthly quota used a month later kept the previous month's remaining and
// reset.
func TestReplyAfterLongSilence(t *testing.T) {
	day := int64(86_400_000) // ms
	base := uint64(1_700_000_000_000)
	now := int64(base) * 1000
	r := ApplyAcquire(Record{}, &wire.State{Remaining: 96, ResetInMs: 1000, ServerMs: base}, now)
	tests := []struct {
		name      string
		laterMs   int64
		remaining int64
		applied   bool
	}{
		{"a_second_older", -1000, 5, false},
		{"a_second_newer", 1000, 5, true},
		{"25_days_later", 25 * day, 100, true},
		{"43_days_later", 43 * day, 100, true},
		{"60_days_later", 60 * day, 100, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := now + tt.laterMs*1000
			got := ApplyAcquire(r, &wire.State{Remaining: tt.remaining, ResetInMs: 2000, ServerMs: uint64(int64(base) + tt.laterMs)}, at)
			if applied := got.GlobalRemaining == tt.remaining && got.ResetUs == at+2_000_000; applied != tt.applied {
				t.Errorf("remaining %d reset %d: applied %v, want %v", got.GlobalRemaining, got.ResetUs-at, applied, tt.applied)
			}
		})
	}
}
