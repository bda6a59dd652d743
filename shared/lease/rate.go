package lease

import "github.com/tollgate-rl/tollgate/shared/algo"

// Rate leases (RATIONALE.md §3, "Keys at their limit"). A bucket held at its limit has
// nothing unreserved beyond what refills, so a lease of a count of permits runs dry
// within a round trip and every gateway asks again: an acquire per few requests. A rate
// lease is the gateway's share r_i of the bucket's refill R instead: the gateway accrues
// r_i locally into a stock of at most c_i = C·r_i/R permits (C the capacity) while the
// lease is valid, decides from it (refusals included, with the Retry-After its own
// accrual gives), and reports what it used with its next report. The service charges
// the accrual to the bucket as it happens (lazily, at each call on the bucket, for the
// time since the last one), whether or not the gateway used it, keeps Σ r_i ≤ R, and
// keeps the bucket's own available permits at most C − Σ c_i: the stocks are the rest
// of the capacity. Rates are counted by lease epoch like counts (Leases.RateCur,
// RatePrev), so a dead gateway's rate stops counting with its epoch.
//
// Units: rates are milli-permits per second (as the demand samples are); accrual at the
// service is kept in millionths of a permit (rate × ms), exact below 2^53.

// RateReportUs is how often a bucket holding a rate lease is reported while it is
// used: its consumption and refusals (the penalty signal) reach the service, and its
// share is re-balanced, once a second instead of at every lease that runs dry.
const RateReportUs = 1_000_000

// MinRate is the smallest rate lease granted (milli-permits per second): one permit a
// second. A slower one would be reported (RateReportUs) more often than it admits; such
// keys keep count leases.
const MinRate = 1000

// RateOf is the refill rate of a bucket of parameters p in milli-permits per second,
// rounded down, for the algorithms whose refill is continuous (token_bucket and gcra),
// and 0 for the others or where the service's integer arithmetic would not be exact
// (the accrual products stay below 2^52): no rate lease then. Window algorithms give
// their whole limit back at a boundary rather than a permit at a time; their leases stay
// counts.
func RateOf(p algo.Params) int64 {
	if !p.Kind.Refills() || p.Limit <= 0 || p.WindowUs < 1000 || p.WindowUs%1000 != 0 {
		return 0
	}
	r := p.Limit * 1_000_000 / (p.WindowUs / 1000)
	if r < 1 || r >= 1<<32 || r*max(p.Capacity(), 2*maxEpochMs) >= 1<<52 {
		return 0
	}
	return r
}

// RateCap is the stock a rate lease of rate (milli-permits per second) may hold on a
// bucket of parameters p: floor(C·rate/R). The service reserves ceil(C·Σrate/R) of the
// capacity for the stocks of all rate leases out (capRates).
func RateCap(p algo.Params, rate int64) int64 {
	R := RateOf(p)
	if R <= 0 || rate <= 0 {
		return 0
	}
	return p.Capacity() * min(rate, R) / R
}

// capRates keeps what the bucket state st holds at most C − ceil(C·sum/R), sum the
// rates out: the stocks of the rate leases are the rest of the capacity. A state above
// that (it refilled while the stocks accrued, or a new rate lease was granted) is taken
// down to it.
func capRates(p algo.Params, st algo.State, now, R, sum int64) algo.State {
	if sum <= 0 || R <= 0 {
		return st
	}
	c := p.Capacity()
	sum = min(sum, R) // rates beyond R (a rule lowered meanwhile) leave the state nothing
	lim := c - (c*sum+R-1)/R
	if a := algo.Available(p, st, now); a > lim {
		st = algo.Take(p, st, now, a-lim)
	}
	return st
}

// epochStartMs is the start (ms) of l's stored epoch, the epoch of now being k and
// epochs eMs long (continuous algorithms).
func (l *Leases) epochStartMs(k uint32, now, eMs int64) int64 {
	return (now/(eMs*1000) - int64(int32(k-l.Epoch))) * eMs
}

// accrue returns the permits the rate leases of l accrued from l's accrual time to now
// (µs), the epoch of now being k and epochs eMs long (continuous algorithms only), and
// the time (ms) accrued to: now rounded up to the millisecond (the gateway starts
// accruing a new rate a millisecond after it hears of it, so rounding up never charges
// less than it accrues). Leases of the stored epoch accrue until two epochs after its
// start, those of the one before until one epoch after it: when they are reclaimed. The
// fraction of a permit is kept (AccFrac). The caller charges the n permits at fromMs,
// when the accrual began: taken at now, a state that refilled to its capacity
// meanwhile would lose the refill that paid for the accrual (a continuous charge never
// does: the rates are at most the refill), and go into debt.
func (l *Leases) accrue(k uint32, now, eMs int64) (n, atMs, fromMs int64) {
	s := l.epochStartMs(k, now, eMs)
	nowMs := ceilDiv(now, 1000)
	at := s + l.AccOff
	x := l.AccFrac
	if end := min(nowMs, s+2*eMs); end > at {
		x += l.RateCur * (end - at)
	}
	if end := min(nowMs, s+eMs); end > at {
		x += l.RatePrev * (end - at)
	}
	l.AccFrac = x % 1_000_000
	return x / 1_000_000, max(at, nowMs), at
}

// rateEmpty reports that no rate lease is out.
func (l *Leases) rateEmpty() bool { return l.RateCur == 0 && l.RatePrev == 0 }

// rateSlot is slot for the rate counts.
func (l *Leases) rateSlot(e uint32, j int64, win bool) *int64 {
	switch {
	case e == 0:
		return nil
	case e == l.Epoch:
		return &l.RateCur
	case e == l.Epoch-1 && !(win && j == 0):
		return &l.RatePrev
	}
	return nil
}

// RateWaitUs is how long a gateway's rate lease of rate takes to accrue n more permits
// from its accrual position atUs (0: paused, counted from now).
func RateWaitUs(rate, atUs, now, n int64) int64 {
	if rate <= 0 || n <= 0 {
		return 0
	}
	w := ceilDiv(n*1_000_000_000, rate)
	if atUs != 0 {
		w -= now - atUs
	}
	return max(w, 0)
}

// accrueRate adds to r's stock what its rate lease accrued since r.RateAtUs, capped at
// the lease's stock, and moves RateAtUs on by the time of the whole permits added
// (rounded up, so the gateway never accrues more than the exact integral). RateAtUs 0
// pauses the accrual: a report carrying the rate is in flight.
func (r *Record) accrueRate(p algo.Params, now int64) {
	if r.Rate <= 0 || r.RateAtUs == 0 || now <= r.RateAtUs {
		return
	}
	c := RateCap(p, r.Rate)
	need := c - r.Stock
	if need <= 0 {
		r.RateAtUs = now // full: what would accrue beyond the stock is lost
		return
	}
	dt := now - r.RateAtUs
	if dt >= ceilDiv(need*1_000_000_000, r.Rate) {
		r.Stock, r.RateAtUs = c, now
		return
	}
	n := dt * r.Rate / 1_000_000_000 // dt·rate < need·1e9 ≤ 1e18
	if n > 0 {
		r.Stock += n
		r.RateAtUs += ceilDiv(n*1_000_000_000, r.Rate)
	}
}

// RateLive reports whether r holds a rate lease usable at now.
func (r *Record) RateLive(now int64) bool {
	return r.Rate > 0 && r.Synced() && now < r.LeaseUntilUs
}
