package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The service side of rate leases, on one gcra bucket of 1,000/s (R = 1,000,000
// milli-permits per second, C = 1,000): what a grant gives, what the accrual charges,
// and that leases of ended epochs stop being charged.
func TestSyncRateLease(t *testing.T) {
	const t0 = 1_700_000_000_000_000 // an epoch boundary (20 s epochs)
	p := algo.Params{Kind: algo.GCRA, Limit: 1000, WindowUs: 1_000_000}
	R, C := RateOf(p), p.Capacity()
	atLimit := func(rate, epoch uint32) wire.Delta { // a second of 2× the limit, refused beyond its lease
		return wire.Delta{Flags: wire.FlagRate, Algo: uint8(p.Kind), Limit: 1000, WindowMs: 1000, ElapsedMs: 1000,
			Rejected: 2000, Rate: rate, RateEpoch: epoch, Epoch: epoch}
	}
	cfg := DefaultSyncConfig
	cfg.RateLeases = true // the Go model's (off in the service)
	for _, c := range []struct {
		name  string
		setup func(b *Bucket) // the state before the report
		nodes int64
		// wantRate: the rate granted; wantStock: the stock it starts with
		wantRate, wantStock int64
	}{
		{name: "spent bucket, one gateway: the whole refill", setup: func(b *Bucket) { b.State = algo.Take(p, nil, t0, C) },
			wantRate: R, wantStock: 0},
		{name: "a full bucket: the count covers the demand", setup: func(b *Bucket) {}, wantRate: 0},
		{name: "counts out of half the bucket: half the refill", setup: func(b *Bucket) {
			b.State = algo.Take(p, nil, t0, C/2)
			b.Leases = Leases{Epoch: uint32(t0 / 20_000_000), Cur: C / 2}
		}, wantRate: R / 2},
		{name: "a bucket a capacity in debt: none", setup: func(b *Bucket) { b.State = algo.Take(p, nil, t0, 2*C+1) }, wantRate: 0},
		{name: "a bucket a tenth in debt: nine tenths", setup: func(b *Bucket) { b.State = algo.Take(p, nil, t0, C+C/10+1) }, wantRate: R * 9 / 10},
		{name: "two gateways: half of what is free", setup: func(b *Bucket) {
			b.State = algo.Take(p, nil, t0, C)
			b.Leases = Leases{Epoch: uint32(t0 / 20_000_000), DemandCur: 10 * C}
		}, nodes: 2, wantRate: R / 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b Bucket
			c.setup(&b)
			cfg := cfg
			cfg.Nodes = c.nodes
			d := atLimit(0, 0)
			r := Sync(&b, &Penalty{}, &d, t0, cfg)
			if r.Rate != c.wantRate || r.Stock != c.wantStock {
				t.Fatalf("rate %d stock %d (grant %d), want rate %d stock %d", r.Rate, r.Stock, r.Grant, c.wantRate, c.wantStock)
			}
			if r.Rate > 0 && r.ValidUs <= 0 {
				t.Errorf("a rate lease with no validity: %+v", r)
			}
			if got := b.Leases.RateCur; got != r.Rate {
				t.Errorf("rate_cur %d, want the grant %d", got, r.Rate)
			}
			// The state never holds more than C less the stocks' share.
			if a, lim := algo.Available(p, b.State, t0), C-(C*b.Leases.RateCur+R-1)/R; a > lim {
				t.Errorf("state holds %d, above C − ceil(C·Σr/R) = %d", a, lim)
			}
		})
	}

	// Accrual: a gateway holding the whole refill of a spent bucket reports a second
	// later; the state was charged what refilled (it holds nothing more), and the
	// fraction of a permit is kept.
	var b Bucket
	b.State = algo.Take(p, nil, t0, C)
	d := atLimit(0, 0)
	r := Sync(&b, &Penalty{}, &d, t0, cfg)
	if r.Rate != R {
		t.Fatalf("rate %d, want %d", r.Rate, R)
	}
	d = atLimit(uint32(r.Rate), r.Epoch)
	r = Sync(&b, &Penalty{}, &d, t0+1_000_500, cfg)
	if a := algo.Available(p, b.State, t0+1_000_500); a != 0 && a != -1 {
		t.Errorf("after a second at the whole refill the state holds %d, want 0 (or a permit owed: the accrual is charged to the millisecond rounded up)", a)
	}
	if r.Rate != R {
		t.Errorf("renewed rate %d, want %d (a permit owed is rounding)", r.Rate, R)
	}
	// Silence: the gateway died. Its rate stops being charged when its epoch is
	// reclaimed, so a minute later the bucket is full, not in debt.
	later := int64(t0 + 60_000_000)
	other := wire.Delta{Algo: uint8(p.Kind), Limit: 1000, WindowMs: 1000, ElapsedMs: 1000}
	Sync(&b, &Penalty{}, &other, later, cfg)
	if a := algo.Available(p, b.State, later); a != C || !b.Leases.rateEmpty() {
		t.Errorf("a minute after the holder went silent: state holds %d (want %d), rates %d/%d", a, C, b.Leases.RateCur, b.Leases.RatePrev)
	}
}

// A gateway's rate lease accrues into its stock at its rate, at most RateCap, decides
// from it, and refuses locally with the wait to its next permit when it is spent.
func TestDecideRateLease(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.GCRA, Limit: 1000, WindowUs: 1_000_000}
	r := Record{SyncedUs: t0, LeaseUntilUs: t0 + 10_000_000, Rate: 250_000, RateAtUs: t0, RateEpoch: 1, ParamsTag: ParamsTag(p)}
	env := Env{Sync: true, Healthy: true, IntervalUs: 100_000, RenewUs: 2_000_000}
	if c := RateCap(p, r.Rate); c != 250 {
		t.Fatalf("RateCap %d, want 250", c)
	}
	// 10 ms at 250/s: 2 permits (2.5 accrued, floored), then a refusal whose wait is
	// the time to the third.
	admitted := 0
	for i := 0; i < 5; i++ {
		d := DecideIn(nil, &r, p, t0+10_000, 1, env)
		switch {
		case d.Allowed:
			admitted++
			if d.RateUsed != 1 {
				t.Errorf("admitted without the stock: %+v", d)
			}
		case d.Acquire:
			t.Fatalf("request %d acquires; the rate lease decides", i)
		default:
			if d.RetryAfterUs < 1_000 || d.RetryAfterUs > 4_000 {
				t.Errorf("Retry-After %d µs, want the next permit's (about 2 ms)", d.RetryAfterUs)
			}
		}
	}
	if admitted != 2 || r.Pending.RateUsed != 2 || r.Pending.Rejected != 3 || r.Pending.Early != 0 {
		t.Errorf("%d admitted, pending %+v; want 2 admitted out of the stock, 3 refused, none early (no penalty)", admitted, r.Pending)
	}
	if r.Urgent {
		t.Errorf("a refusal within a rate lease asked for the next sync; it waits for the lease's report")
	}
	// Idle for 10 s: the stock stops at its cap.
	r.accrueRate(p, t0+9_000_000)
	if r.Stock != 250 {
		t.Errorf("stock %d after 9 s, want the cap 250", r.Stock)
	}
	// The report cuts the rate: the accrual pauses until the reply, the stock is kept
	// and reported, and the delta tells the service to stop counting the rate.
	var d wire.Delta
	r = Cut(r, p, t0+9_000_000, 7, &d)
	if d.Flags&wire.FlagRate == 0 || d.Rate != 250_000 || d.RateUsed != 2 || d.RateEpoch != 1 || d.RateStock != 250 || r.Stock != 250 || r.RateAtUs != 0 {
		t.Errorf("cut: delta %+v, record stock %d at %d", d, r.Stock, r.RateAtUs)
	}
	// Ten permits used from the stock while the report is in flight; the reply renews
	// half the rate, whose cap (125) covers what the stock still holds: 125 − 10.
	for range 10 {
		if dd := DecideIn(nil, &r, p, t0+9_001_000, 1, env); !dd.Allowed {
			t.Fatalf("refused with a stock of %d while the report is in flight", r.Stock)
		}
	}
	st := wire.State{Flags: wire.StateRate, Rate: 125_000, Stock: 125, Epoch: 2, ValidMs: 10_000}
	d.Algo, d.Limit, d.WindowMs = uint8(p.Kind), 1000, 1000
	r, _ = ApplyReply(r, &st, &d, 7, t0+9_002_000)
	if r.Rate != 125_000 || r.Stock != 115 || r.RateEpoch != 2 {
		t.Errorf("after the reply: rate %d stock %d epoch %d, want 125000, 115, 2", r.Rate, r.Stock, r.RateEpoch)
	}
}

// With a gateway's own record (SyncNode), a report releases no more rate than that
// gateway was granted: a forged rate naming another gateway's epoch leaves that lease
// counted, and the honest gateway's own report releases it as before. Without the
// record (Sync) the forged rate released it.
func TestSyncNodeRateRelease(t *testing.T) {
	const t0 = 1_700_000_000_000_000 // an epoch boundary (20 s epochs)
	p := algo.Params{Kind: algo.GCRA, Limit: 1000, WindowUs: 1_000_000}
	R, C := RateOf(p), p.Capacity()
	cfg := DefaultSyncConfig
	cfg.Nodes = 2
	cfg.RateLeases = true // the Go model's (off in the service)
	atLimit := func(rate, epoch uint32) wire.Delta {
		return wire.Delta{Flags: wire.FlagRate, Algo: uint8(p.Kind), Limit: 1000, WindowMs: 1000, ElapsedMs: 1000,
			Rejected: 2000, Rate: rate, RateEpoch: epoch, Epoch: epoch}
	}
	for _, c := range []struct {
		name        string
		node        bool // SyncNode with the gateways' own records, else Sync
		wantOutLeft bool // the honest gateway's rate still counted after the forged report
	}{
		{"own records: the forged rate releases nothing", true, true},
		{"no record: the forged rate released the honest lease", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b Bucket
			b.State = algo.Take(p, nil, t0, C)
			b.Leases = Leases{Epoch: uint32(t0 / 20_000_000), DemandCur: 10 * C}
			var honest, forger Leases
			sync := func(own *Leases, d *wire.Delta, now int64) SyncResult {
				if c.node {
					return SyncNode(&b, &Penalty{}, own, d, now, cfg)
				}
				return Sync(&b, &Penalty{}, d, now, cfg)
			}
			d := atLimit(0, 0)
			r := sync(&honest, &d, t0)
			if r.Rate != R/2 {
				t.Fatalf("honest rate %d, want %d", r.Rate, R/2)
			}
			if c.node && honest.RateCur != r.Rate {
				t.Fatalf("own record counts rate %d, want %d", honest.RateCur, r.Rate)
			}
			// The forger claims the honest gateway's rate, asking for nothing more
			// (strict: no grant), so only the release moves the rate counted.
			f := atLimit(uint32(r.Rate), r.Epoch)
			f.Flags |= wire.FlagStrict
			sync(&forger, &f, t0+1000)
			if left := b.Leases.RateCur == r.Rate; left != c.wantOutLeft {
				t.Fatalf("after the forged report rate_cur %d (honest lease %d): still counted %v, want %v",
					b.Leases.RateCur, r.Rate, left, c.wantOutLeft)
			}
			if !c.node {
				return
			}
			// The honest gateway's own report releases its lease and is granted anew.
			h := atLimit(uint32(r.Rate), r.Epoch)
			h.Flags |= wire.FlagStrict
			sync(&honest, &h, t0+2000)
			if b.Leases.RateCur != 0 || honest.RateCur != 0 {
				t.Fatalf("after the honest release rate_cur %d, own %d, want 0 and 0", b.Leases.RateCur, honest.RateCur)
			}
		})
	}
}
