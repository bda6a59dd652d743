package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestAdvanceEpochs: epochs are indexes mod 2^32, compared as signed differences. A
// stored epoch ahead of now (the server clock stepped back across an epoch boundary)
// ends nothing; one or more behind reclaims as the protocol says; an empty record just
// takes the current epoch, whatever the distance.
func TestAdvanceEpochs(t *testing.T) {
	full := Leases{Cur: 5, Prev: 3, DemandCur: 10, DemandPrev: 7}
	at := func(e uint32) Leases { l := full; l.Epoch = e; return l }
	tests := []struct {
		name      string
		before    Leases
		k         uint32
		j         int64
		win       bool
		after     Leases
		reclaimed int64
	}{
		{"same epoch", at(100), 100, 0, false, at(100), 0},
		{"next epoch", at(100), 101, 0, false, Leases{Epoch: 101, Prev: 5, DemandPrev: 10}, 3},
		{"next epoch across 2^32", at(1<<32 - 1), 0, 0, false, Leases{Epoch: 0, Prev: 5, DemandPrev: 10}, 3},
		{"next window", at(100), 101, 0, true, Leases{Epoch: 101}, 8},
		{"two epochs on", at(100), 102, 0, false, Leases{Epoch: 102}, 8},
		{"stored one epoch ahead", at(101), 100, 0, false, at(101), 0},
		{"stored ahead across 2^32", at(2), 1<<32 - 3, 0, false, at(2), 0},
		{"stored ahead, window", at(101), 100, 1, true, at(101), 0},
		{"empty record, far epoch", Leases{}, 3_000_000_000, 0, false, Leases{Epoch: 3_000_000_000}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.before
			if got := l.advance(tc.k, tc.j, tc.win); got != tc.reclaimed || l != tc.after {
				t.Fatalf("advance(%d) of %+v: reclaimed %d, %+v; want %d, %+v", tc.k, tc.before, got, l, tc.reclaimed, tc.after)
			}
		})
	}
}

// TestPastWindow: only an epoch behind the current window's first is of a past window;
// an epoch ahead of now is not.
func TestPastWindow(t *testing.T) {
	tests := []struct {
		name string
		e, k uint32
		j    int64
		want bool
	}{
		{"none", 0, 100, 3, false},
		{"current epoch", 100, 100, 3, false},
		{"first epoch of the window", 97, 100, 3, false},
		{"last epoch of the previous window", 96, 100, 3, true},
		{"previous window across 2^32", 1<<32 - 1, 1, 1, true},
		{"one epoch ahead", 101, 100, 3, false},
		{"ahead across 2^32", 1, 1<<32 - 1, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pastWindow(tc.e, tc.k, tc.j); got != tc.want {
				t.Fatalf("pastWindow(%d, %d, %d) = %v, want %v", tc.e, tc.k, tc.j, got, tc.want)
			}
		})
	}
}

// TestSyncClockStepsBack: the server clock steps back across an epoch boundary after a
// lease was granted. The gateway's report of that lease still finds it: what it used is
// charged (a fixed window would otherwise take it for a lease of a past window), what
// it keeps is renewed, nothing is reclaimed, and the reply dates the lease by the epoch
// it is kept in.
func TestSyncClockStepsBack(t *testing.T) {
	cfg := SyncConfig{EpochMs: 2000, HorizonMs: 1000, MaxShare: 4, RenewMs: 200, MinElapsedMs: 100, ValidMarginMs: 100,
		PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 8_000_000}
	const start = int64(1_700_000_040_000_000) // a minute's first µs: one window below
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.FixedWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			d := wire.Delta{Key: "k", Rule: "r", Algo: uint8(kind), Limit: 100, WindowMs: 60_000, Over: 4, ElapsedMs: 100}
			var b Bucket
			var pen Penalty
			t1 := start + 2_001_000 // epoch k+1
			r1 := Sync(&b, &pen, &d, t1, cfg)
			if r1.Grant < 4 {
				t.Fatalf("grant %d", r1.Grant)
			}
			t2 := start + 1_999_000 // epoch k: the clock stepped back 2 ms
			rep := wire.Delta{Key: "k", Rule: "r", Algo: d.Algo, Limit: 100, WindowMs: 60_000, ElapsedMs: 100,
				Leased: 2, Held: uint32(r1.Grant - 2), Epoch: r1.Epoch}
			r2 := Sync(&b, &pen, &rep, t2, cfg)
			if r2.Reclaimed != 0 || r2.Held != r1.Grant-2 || r2.Epoch != r1.Epoch {
				t.Fatalf("after the step back: reclaimed %d, held %d (want %d), epoch %d (lease's %d)", r2.Reclaimed, r2.Held, r1.Grant-2, r2.Epoch, r1.Epoch)
			}
			if got := b.Leases.Outstanding(); got != r2.Held+r2.Grant {
				t.Fatalf("outstanding %d, want held %d + grant %d", got, r2.Held, r2.Grant)
			}
			p := ParamsOf(&d)
			if used := p.Capacity() - algo.Available(p, b.State, t1); used != 6 {
				t.Fatalf("charged %d, want 4 + 2", used)
			}
		})
	}
}

// TestFleetLeasesKeepHalf: in a fleet, leases sized by demand leave half of the bucket
// unreserved (FleetLeaseKeep), whatever the number of reports asking for more; a
// gateway alone is not held back; and an acquire's Want is still covered from all that
// is unreserved, so a gateway whose demand runs above its share gets it (alone, the
// leases reserve the whole bucket, and the acquire finds nothing).
func TestFleetLeasesKeepHalf(t *testing.T) {
	const now = int64(1_700_000_000_000_000)
	tests := []struct {
		name    string
		nodes   int64
		maxOut  int64 // outstanding after the reports, at most
		minOut  int64 // ... and at least
		wantGet int64 // grant of the acquire that follows (Want 10; 0: refused)
	}{
		{"fleet of 4", 4, 50, 40, 10},
		{"fleet of 16", 16, 50, 40, 10},
		{"alone", 1, 100, 80, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultSyncConfig
			cfg.Nodes = tc.nodes
			var b Bucket
			var pen Penalty
			base := wire.Delta{Key: "k", Rule: "r", Algo: uint8(algo.TokenBucket), Limit: 100, WindowMs: 1000}
			// Twenty reports of gateways each asking 30 a second (refusals: demand,
			// nothing charged), none holding a lease: each would take its share.
			for i := range 20 {
				d := base
				d.Rejected, d.ElapsedMs = 30, 1000
				Sync(&b, &pen, &d, now+int64(i)*1000, cfg)
			}
			out := b.Leases.Outstanding()
			if out > tc.maxOut || out < tc.minOut {
				t.Fatalf("outstanding %d after the reports, want %d..%d", out, tc.minOut, tc.maxOut)
			}
			acq := base
			acq.Flags, acq.Over, acq.Want, acq.ElapsedMs = wire.FlagAcquire, 1, 10, 50
			r := Sync(&b, &pen, &acq, now+30_000, cfg)
			if r.Allowed != (tc.wantGet > 0) || r.Grant != tc.wantGet {
				t.Fatalf("acquire: allowed %v, grant %d, want %d (outstanding before %d)", r.Allowed, r.Grant, tc.wantGet, out)
			}
		})
	}
}
