package lease

import (
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Record is a gateway's view of one bucket (caller key, rule, window), kept in Envoy
// shared data so every worker VM of the gateway decides against the same allowance and
// the one worker that syncs finds what all of them consumed.
//
// Times are absolute microseconds on the gateway's own clock. The service's durations are
// converted to it on receipt (ApplyReply), so gateway and server clocks are never compared.
type Record struct {
	// Local is the algorithm state this gateway keeps on its own: it decides alone when
	// sync is disabled and while degraded.
	Local algo.State
	// LeaseLeft is what remains of the lease the service reserved for this gateway,
	// dated LeaseEpoch, usable until LeaseUntilUs.
	LeaseLeft    int64
	LeaseEpoch   uint32
	LeaseUntilUs int64
	// LowWater: at or below this lease a report is due (the service sizes it so that the
	// renewal arrives before the lease runs out).
	LowWater int64
	// GlobalRemaining is the last-known unreserved global quota, less what this gateway
	// admitted outside its lease since.
	GlobalRemaining int64
	// SyncedUs is when the last reply was applied (0: never).
	SyncedUs int64
	// ServerMs is the low 32 bits of the server time of the newest state applied: an
	// older state never overwrites what a newer one said (replies can arrive out of
	// order, e.g. a paused request's answer and a batch reply).
	ServerMs       uint32
	ResetUs        int64 // global bucket full again / window end
	RetryUs        int64 // global bucket admits one permit again
	PenaltyUntilUs int64 // progressive-penalty cooldown end
	AnnouncedUs    int64 // earliest time the last 429 told the caller to come back
	// UsedUs is the last decision on this bucket (what makes it busy, not idle).
	UsedUs       int64
	PenaltyLevel uint8
	// CutSeq is the low 32 bits of the seq of the batch that carries this bucket's last
	// report, until its reply is applied (0: none in flight). A reply's lease is applied
	// only to a record whose CutSeq it matches, and only once.
	CutSeq uint32
	// ParamsTag is ParamsTag of the rule parameters the last decision used (0: not known,
	// a record of an earlier version): a lease used under other parameters is given back
	// at the first decision under new ones.
	ParamsTag uint32
	// Pending is consumption not yet cut into a batch.
	Pending Pending
	// Urgent asks for a report at the next sync: a lease at its low water or near its
	// end, a refusal, a lease returned.
	Urgent bool
	// Cold is what this gateway admitted on its cold-start allowance (outside any lease,
	// reported as Over) and has not cut into a batch yet; ColdCut is what a batch carries
	// whose reply has not been applied. Together they are the cold admissions the service
	// may not have charged yet, which the allowance bounds (RATIONALE.md §3).
	Cold, ColdCut int64
	// AcquireUntilUs: a worker of this gateway asked the service for this bucket (an
	// acquire) and waits for the answer until then (0: none). The other requests of the
	// bucket, on every worker, wait for that answer instead of asking again.
	AcquireUntilUs int64
	// Waiting is the cost of the requests of this gateway that wait for that answer: the
	// next acquire asks the service to cover it (wire.Delta.Want).
	Waiting int64
	// Rate is the rate lease the service granted (milli-permits per second, rate.go),
	// dated RateEpoch and usable until LeaseUntilUs: it accrues into Stock, at most
	// RateCap permits, from RateAtUs on (0: paused while a report carrying it is in
	// flight). RateBack is a rate given up (the rule changed) that the next report
	// tells the service to stop counting.
	Rate, Stock, RateAtUs, RateBack int64
	RateEpoch                       uint32
	// RateFrac is the part of a permit the rate had accrued when a report cut it
	// (billionths of a permit: µs × milli-permits per second), carried into the next
	// rate: the service charged it, and dropping it at every report lost half a permit
	// per gateway and report.
	RateFrac int64
}

// Pending is what a bucket's decisions consumed since its last report.
type Pending struct {
	Leased, Over, Returned, Rejected, Early int64
	// RateUsed is what was admitted out of the rate lease's stock (charged at the
	// service as it accrued: reported as demand only).
	RateUsed int64
	// Degraded: Over includes admissions made while the service was unreachable.
	Degraded bool
}

func (p *Pending) empty() bool {
	return p.Leased == 0 && p.Over == 0 && p.Returned == 0 && p.Rejected == 0 && p.Early == 0 && p.RateUsed == 0
}

// Env is what a decision needs to know about the gateway beyond the bucket.
type Env struct {
	// Sync is false when no sync service is configured: the gateway is the whole fleet.
	Sync bool
	// Healthy is false while the gateway cannot rely on the service (breaker open, or no
	// successful sync lately).
	Healthy bool
	// IntervalUs is the sync interval (a refusal that a new lease would lift answers
	// Retry-After of one interval).
	IntervalUs int64
	// RenewUs: a lease used this close to its end asks to be renewed.
	RenewUs int64
	// AcquireFailed: this request asked the service (an acquire) and got no answer
	// while the sync is otherwise healthy (a lost or late callout). It is decided without
	// the service: refused if the service last said the bucket cannot give the cost
	// before a retry time still to come, admitted degraded (the gateway's own state)
	// otherwise.
	AcquireFailed bool
	// ColdAllowance is what the bucket may admit outside a lease before the service has
	// charged it (ColdAllowance): a request of a bucket without a lease period that fits
	// in it is decided here instead of waiting for an acquire.
	ColdAllowance int64
}

// Decision is the outcome of Decide for one bucket.
type Decision struct {
	Allowed bool
	// Acquire: the lease cannot cover the cost, but the global bucket may: the request
	// should wait for the service (a FlagAcquire delta) instead of being refused.
	Acquire bool
	// Cold: admitted on the cold-start allowance (outside any lease, as Over); the
	// bucket's report, due at the next sync, brings its lease (the background acquire).
	Cold bool
	// Leased, Over and RateUsed split the admitted cost as added to Record.Pending;
	// Returned is lease dropped by this decision (expired). Undo needs them.
	Leased, Over, Returned, RateUsed int64
	// Rejected/Early are 1 when the request was refused (Early: before the Retry-After
	// this bucket had announced).
	Rejected, Early int64
	Remaining       int64 // for headers; never negative
	ResetUs         int64 // absolute, local clock
	RetryAfterUs    int64 // when refused: from now until the bucket can admit (un-jittered)
	Degraded        bool  // decided without the service (sync enabled but unhealthy)
	Penalized       bool  // refused by a progressive-penalty cooldown
	PenaltyLeftUs   int64 // when Penalized: what remains of the cooldown
	PenaltyLevel    uint8
	// Urgent: this decision made the bucket want a report at the next sync (it was not
	// urgent before): the caller queues it.
	Urgent bool
}

// Decide decides one request of cost on r at local time now and returns the record to
// store if the request is admitted by every bucket it touches. It never mutates r.
func Decide(r Record, p algo.Params, now, cost int64, env Env) (Record, Decision) {
	return DecideTo(nil, r, p, now, cost, env)
}

// DecideTo is Decide writing the returned record's new local state into dst's array
// when it has the capacity (algo.DecideTo), so a caller that keeps a buffer per bucket
// decides without allocating. dst must not overlap r.Local.
func DecideTo(dst algo.State, r Record, p algo.Params, now, cost int64, env Env) (Record, Decision) {
	d := DecideIn(dst, &r, p, now, cost, env)
	return r, d
}

// DecideIn is DecideTo deciding on *r in place, for the filter's request path: Go's wasm
// backend moves a Record (184 bytes) through linear memory on every pass and return by
// value, and such copies are the largest single item of a decision's guest time
// (RATIONALE.md §6).
func DecideIn(dst algo.State, r *Record, p algo.Params, now, cost int64, env Env) (d Decision) {
	lastUsed := r.UsedUs
	r.UsedUs = now
	if r.PenaltyUntilUs > now {
		d.PenaltyLevel = r.PenaltyLevel
		d.Penalized = true
		d.PenaltyLeftUs = r.PenaltyUntilUs - now
		// Never earlier than the bucket itself would admit the request: the service's
		// retry time when synced, the local algorithm's otherwise.
		wait := r.RetryUs - now
		if !r.Synced() {
			wait = algo.RetryAfter(p, r.Local, now, cost)
		}
		d.RetryAfterUs = max(d.PenaltyLeftUs, wait)
		d.ResetUs = max(ResetAt(r, p, now), r.PenaltyUntilUs)
		reject(r, now, &d, env.Sync)
		return d
	}
	if !env.Sync {
		decideLocal(dst, r, p, now, cost, &d)
		return d
	}
	if tag := ParamsTag(p); r.ParamsTag != tag {
		if r.ParamsTag != 0 && r.LeaseLeft > 0 {
			// The rule changed since the lease was used: it was granted under other
			// parameters, which a lowered limit may no longer back. It goes back, and the
			// service decides under the new ones (RATIONALE.md §3, rule changes).
			d.Returned = r.LeaseLeft
			r.Pending.Returned += r.LeaseLeft
			r.LeaseLeft = 0
			urgent(r, &d)
		}
		if r.ParamsTag != 0 && r.Rate > 0 {
			// A rate lease likewise: it stops accruing now and the next report gives
			// it back.
			r.RateBack += r.Rate
			r.Rate, r.Stock, r.RateAtUs = 0, 0, 0
			urgent(r, &d)
		}
		r.ParamsTag = tag
	}
	if r.LeaseLeft > 0 && now >= r.LeaseUntilUs {
		// The service will reclaim (or has reclaimed) this lease: stop using it and say so.
		d.Returned = r.LeaseLeft
		r.Pending.Returned += r.LeaseLeft
		r.LeaseLeft = 0
		urgent(r, &d)
	}
	if env.AcquireFailed && r.Synced() && r.RetryUs > now && r.GlobalRemaining < cost {
		// Refused only while the service's word stands: empty until RetryUs. A remaining
		// read at an older sync is stale (the bucket refills, and what this gateway held
		// was its own lease), and a slow service must not refuse callers within their
		// limit: they are admitted degraded below.
		d.RetryAfterUs = max(r.RetryUs-now, env.IntervalUs)
		d.ResetUs = ResetAt(r, p, now)
		reject(r, now, &d, true)
		return d
	}
	if !env.Healthy || env.AcquireFailed {
		decideLocal(dst, r, p, now, cost, &d)
		d.Degraded = true
		if d.Allowed {
			d.Over = cost
			r.Pending.Over += cost
			r.Pending.Degraded = true
		} else {
			r.Pending.Rejected++
			r.Pending.Early += d.Early
		}
		return d
	}
	leaseTime := r.Synced() && now < r.LeaseUntilUs
	if leaseTime && r.Rate > 0 && (r.GlobalRemaining >= 0 || r.Pending.Over == 0) {
		// A rate lease: the gateway's share of the refill, accrued here. Within it the
		// gateway decides alone, refusals included: when the stock cannot cover the
		// cost, nothing else of the lease can and the service last said the bucket holds
		// nothing unreserved, the request is refused with the wait the accrual gives,
		// and the refusal is reported with the lease's next report (RateReportUs), not at
		// the next sync (RATIONALE.md §3, keys at their limit). A bucket this gateway
		// put in debt itself (a response's charge beyond its lease, not reported yet)
		// does not use it: the debt is repaid first (the service shrinks the rates of a
		// bucket in debt).
		r.accrueRate(p, now)
		if r.RateAtUs != 0 && now-r.SyncedUs >= RateReportUs {
			urgent(r, &d)
		}
		if r.Stock >= cost {
			r.Stock -= cost
			d.RateUsed = cost
			r.Pending.RateUsed += cost
			admit(dst, r, p, now, cost, &d)
			return d
		}
		if r.LeaseLeft < cost && r.GlobalRemaining < cost && cost <= RateCap(p, r.Rate) {
			d.RetryAfterUs = max(RateWaitUs(r.Rate, r.RateAtUs, now, cost-r.Stock), 1000)
			d.ResetUs = ResetAt(r, p, now)
			reject(r, now, &d, false)
			// Not an early request for progressive penalties: the wait is a permit's
			// (33 ms at 30/s), which a client paced at its limit comes back within by
			// chance; counted so, such clients were put in cooldowns and admitted 74 %
			// of their requests. The rate lease holds the key to its limit anyway.
			d.Early = 0
			r.Pending.Rejected++
			return d
		}
	}
	switch {
	case leaseTime && r.LeaseLeft >= cost:
		r.LeaseLeft -= cost
		d.Leased = cost
		r.Pending.Leased += cost
		// With a rate lease the count is what is left beside it, and the rate's
		// reports renew both: the low water does not call for a report.
		if (r.LeaseLeft <= r.LowWater && r.Rate == 0) || r.LeaseUntilUs-now <= env.RenewUs {
			urgent(r, &d)
		}
		admit(dst, r, p, now, cost, &d)
		return d
	case r.Synced() && r.RetryUs > now && r.GlobalRemaining < cost:
		// The service last said the bucket is empty until RetryUs, and this gateway has
		// spent what it held since: a real refusal. Wait at least until the steady rate
		// refills the deficit (the retry time predates what was spent since).
		d.RetryAfterUs = max(r.RetryUs-now, RefillUs(p, now, cost-max(r.GlobalRemaining, 0)))
		if end, ok := WindowEnd(p, now); ok {
			d.RetryAfterUs = min(d.RetryAfterUs, end-now) // the window's end, exact
		}
		d.ResetUs = ResetAt(r, p, now)
		reject(r, now, &d, true)
		return d
	}
	// The lease is short, or there is none. Without a lease period (a cold start: never
	// synced, or the lease ended), or with a valid lease that ran dry while the bucket
	// plainly has room (a slow key's small lease), and within the cold-start allowance
	// the request is admitted here, outside the lease, and reported at the next sync,
	// whose reply brings a lease: the allowance bounds what the fleet admits before the
	// service has charged it (RATIONALE.md §3). Beyond it, and for a valid lease that ran
	// dry near the bucket's limit, the request asks the service (an acquire), which
	// decides it against what the bucket holds beyond every outstanding lease and brings
	// a lease back.
	if coldRoom(r, p, now, lastUsed, cost, &env) {
		r.Cold += cost
		r.Pending.Over += cost
		r.GlobalRemaining -= cost
		d.Over = cost
		d.Cold = true
		urgent(r, &d)
		admit(dst, r, p, now, cost, &d)
		return d
	}
	d.Acquire = true
	return d
}

// ParamsTag is a 32-bit digest of p, never 0 (Record.ParamsTag).
func ParamsTag(p algo.Params) uint32 {
	h := uint64(14695981039346656037) // FNV-1a offset basis, over the four values
	for _, v := range [...]uint64{uint64(p.Kind), uint64(p.Limit), uint64(p.WindowUs), uint64(p.Burst)} {
		h = (h ^ v) * 1099511628211
	}
	return uint32(h^h>>32) | 1
}

// coldRoom reports whether a request of cost fits in r's cold-start allowance: what
// the gateway admitted on the allowance and the service has not charged yet stays
// within env.ColdAllowance, and the service did not last say that the bucket holds
// less than that (a bucket it never heard of, or one whose last reply left room, less
// what was admitted outside a lease since).
//
// A bucket with a lease period (a valid lease that ran dry) uses the allowance only
// for a key this gateway sees less than once per sync interval (its previous decision,
// lastUsed, is an interval old or more) while the service's last word, less what this
// gateway admitted outside a lease since, leaves more than the half of the capacity a
// fleet keeps back from leases by demand (FleetLeaseKeep) unreserved after the
// request: a slow key, whose lease is sized by its few requests and runs dry within its
// validity, is decided here instead of holding its request for an acquire's round
// trip. A hot key's leases run dry under requests that come faster than the interval,
// or at the bucket's last permits, so it still acquires: spending every gateway's
// allowance there went beyond the limit each time, not once per cold start
// (RATIONALE.md §3).
func coldRoom(r *Record, p algo.Params, now, lastUsed, cost int64, env *Env) bool {
	if env.ColdAllowance <= 0 || r.Cold+r.ColdCut+cost > env.ColdAllowance {
		return false
	}
	switch {
	case !r.Synced():
		return true
	case now >= r.LeaseUntilUs:
		return r.GlobalRemaining >= cost
	}
	capa := p.Capacity()
	return now-lastUsed >= max(env.IntervalUs, 1) && r.GlobalRemaining-cost >= capa-capa/FleetLeaseKeep
}

// ColdFraction: the whole fleet may admit 1/ColdFraction of a bucket's capacity on
// cold-start allowances before the service has charged it, the documented cold-start
// bound of limit + 5 % (RATIONALE.md §3).
const ColdFraction = 20

// ColdAllowance is a gateway's cold-start allowance for a bucket of parameters p in a
// fleet of nodes gateways: floor(capacity / (20·nodes)), so that every gateway spending
// its allowance at once admits at most 5 % of the capacity beyond what the service
// reserved. It is 0 for capacities under 20·nodes: those requests wait for an acquire.
// With atLeast (a rule's cold_start "admit": one request's cost) it is never below that,
// trading the bound for never waiting.
func ColdAllowance(p algo.Params, nodes, atLeast int64) int64 {
	a := p.Capacity() / (ColdFraction * max(nodes, 1))
	return max(a, atLeast)
}

// RefillUs is how long bucket p takes, from now, to give back n permits at its steady
// rate: n·Window/Limit. A fixed or calendar window has no steady rate: it gives back its
// whole limit at the window's end, so the wait is also at most until that end (a monthly
// quota of 5 refused two minutes before the 1st is not sent away for six days).
func RefillUs(p algo.Params, now, n int64) int64 {
	perPermit := max(1, p.WindowUs/max(1, p.Limit))
	wait := max(n, 0) * perPermit
	if p.Kind.ResetsAtBoundary() {
		wait = min(wait, algo.ResetAt(p, nil, now)-now) // the end of the current window
	}
	return wait
}

// admit finishes an admission out of the lease: the local state follows this gateway's
// own traffic so that, if the service goes away, degraded decisions start from what
// this gateway actually admitted.
func admit(dst algo.State, r *Record, p algo.Params, now, cost int64, d *Decision) {
	d.Allowed = true
	r.Local = algo.TakeTo(dst, p, r.Local, now, cost)
	d.Remaining = min(max(0, r.LeaseLeft+r.Stock+max(0, r.GlobalRemaining)), p.Capacity())
	d.ResetUs = ResetAt(r, p, now)
}

func decideLocal(dst algo.State, r *Record, p algo.Params, now, cost int64, d *Decision) {
	res := algo.DecideTo(dst, p, r.Local, now, cost)
	d.ResetUs = res.ResetUs
	d.Remaining = max(0, res.Remaining)
	r.Local = res.State
	if !res.Allowed {
		d.RetryAfterUs = res.RetryAfterUs
		reject(r, now, d, false)
		return
	}
	d.Allowed = true
}

// reject records the announcement of a Retry-After so that a caller coming back before it
// is counted as Early (the progressive-penalty signal). With report set the refusal is
// also counted for the service (which turns Early refusals into penalties).
func reject(r *Record, now int64, d *Decision, report bool) {
	d.Allowed = false
	d.Rejected = 1
	if now < r.AnnouncedUs {
		d.Early = 1
	}
	d.RetryAfterUs = max(d.RetryAfterUs, 0)
	if announced := now + d.RetryAfterUs; announced > r.AnnouncedUs {
		r.AnnouncedUs = announced
	}
	if report {
		r.Pending.Rejected++
		r.Pending.Early += d.Early
		urgent(r, d)
	}
}

func urgent(r *Record, d *Decision) {
	if !r.Urgent {
		r.Urgent = true
		d.Urgent = true
	}
}

// Undo gives back what an admitting decision d took from r (cost permits at now): the
// inverse of Decide's bookkeeping, for a request that another bucket refused after this
// one was written. A lease Decide found expired stays returned.
func Undo(r Record, p algo.Params, now, cost int64, d *Decision) Record {
	if !d.Allowed {
		return r
	}
	r.LeaseLeft += d.Leased
	r.Pending.Leased = max(0, r.Pending.Leased-d.Leased)
	if d.RateUsed > 0 && r.RateAtUs != 0 && r.Pending.RateUsed >= d.RateUsed {
		// Not cut since (a cut drops the stock): the permits go back to it.
		r.Stock = min(r.Stock+d.RateUsed, RateCap(p, r.Rate))
		r.Pending.RateUsed -= d.RateUsed
	}
	r.Pending.Over = max(0, r.Pending.Over-d.Over)
	if d.Cold {
		r.Cold = max(0, r.Cold-d.Over)
		r.GlobalRemaining += d.Over
	}
	r.Local = algo.Refund(p, r.Local, now, cost)
	return r
}

// Acquired records a request the service admitted on an acquire (its cost is charged
// there already): only the local state, which follows this gateway's own traffic.
func Acquired(r Record, p algo.Params, now, cost int64) Record {
	r.UsedUs = now
	r.Local = algo.Take(p, r.Local, now, cost)
	return r
}

// Charge adds n permits a request consumed after it was admitted (what its response
// reported beyond the estimate it was admitted on) to r at local time now. Nothing is
// refused: the permits were used already. They come out of the lease while it lasts and
// are reported beyond it (Over) otherwise, which the service charges in full, into debt
// if need be; the local state goes into debt as well, so that degraded decisions see
// them. The record becomes urgent when the charge took it to its low water or beyond
// its lease: later requests must learn soon what the bucket holds.
func Charge(r Record, p algo.Params, now, n int64, env Env) Record {
	return ChargeTo(nil, r, p, now, n, env)
}

// ChargeTo is Charge writing the new local state into dst's array when it has the
// capacity (algo.TakeTo); dst must not overlap r.Local.
func ChargeTo(dst algo.State, r Record, p algo.Params, now, n int64, env Env) Record {
	if n <= 0 {
		return r
	}
	r.UsedUs = now
	r.Local = algo.TakeTo(dst, p, r.Local, now, n)
	if !env.Sync {
		return r
	}
	if r.RateLive(now) {
		// Out of the rate lease's stock first (charged as it accrued).
		r.accrueRate(p, now)
		s := min(n, r.Stock)
		r.Stock -= s
		r.Pending.RateUsed += s
		n -= s
		if n == 0 {
			return r
		}
	}
	leased := int64(0)
	if r.Synced() && now < r.LeaseUntilUs {
		leased = min(n, r.LeaseLeft)
	}
	r.LeaseLeft -= leased
	r.Pending.Leased += leased
	if over := n - leased; over > 0 {
		r.Pending.Over += over
		r.GlobalRemaining -= over
	}
	if leased < n || r.LeaseLeft <= r.LowWater {
		r.Urgent = true
	}
	if r.Synced() && r.GlobalRemaining < 1 {
		// This gateway knows the bucket is in debt before the service does (until the
		// next report): it refuses until the debt is refilled, instead of asking the
		// service, which would still admit on what it last heard.
		retry := now + RefillUs(p, now, 1-r.GlobalRemaining)
		if windowed(p) && r.ResetUs > now {
			retry = min(retry, r.ResetUs) // the window's end wipes a window's debt
		}
		r.RetryUs = max(r.RetryUs, retry)
	}
	return r
}

// Due reports whether r should be in the next batch: it is urgent, or a lease that was
// used since the last report ends within renewUs (renewing keeps it), or consumption
// that no live lease covers has waited staleUs since the last report. Consumption out
// of a lease that is still valid waits for the lease's renewal or its low-water mark
// (or staleLeasedUs, when not 0): the service counts it as reserved meanwhile (the
// admin API's remaining counts every lease as taken), so a key costs Redis one report
// per lease it uses up or renews, in proportion to its requests, not one per staleness
// period. inflight is the low 32 bits of the seq of the batch being cut or awaiting its
// reply (0: none): a record that batch carries is not due again (the service refuses a
// bucket's second delta in one batch), whereas one cut into a batch that was lost is.
func (r *Record) Due(now, staleUs, staleLeasedUs, renewUs int64, inflight uint32) bool {
	if r.CutSeq != 0 && r.CutSeq == inflight {
		return false
	}
	if r.RateBack > 0 || (r.Rate > 0 && r.RateAtUs != 0 && now-r.SyncedUs >= RateReportUs) {
		// A rate lease is reported once per RateReportUs whatever it did: its
		// consumption, its refusals (penalties) and a re-balanced share.
		return true
	}
	live := r.LeaseLeft > 0 && now < r.LeaseUntilUs
	if r.Pending.empty() {
		return live && r.UsedUs > r.SyncedUs && r.LeaseUntilUs-now <= renewUs
	}
	if r.Urgent || !r.Synced() || (r.LeaseLeft > 0 && r.LeaseUntilUs-now <= renewUs) {
		return true
	}
	p := &r.Pending
	if live && p.Over == 0 && p.Returned == 0 && p.Rejected == 0 {
		return staleLeasedUs > 0 && now-r.SyncedUs >= staleLeasedUs
	}
	return now-r.SyncedUs >= staleUs
}

// Cut moves r's pending consumption into delta d (whose Key, Rule, Tier, Window and
// params the caller fills in) for the batch numbered seq, and returns the record to
// store.
func Cut(r Record, p algo.Params, now int64, seq uint32, d *wire.Delta) Record {
	pd := &r.Pending
	d.Flags = 0
	if pd.Degraded {
		d.Flags |= wire.FlagDegraded
	}
	d.Leased, d.Over, d.Returned = clampU32(pd.Leased), clampU32(pd.Over), clampU32(pd.Returned)
	d.Rejected, d.Early = clampU32(pd.Rejected), clampU32(pd.Early)
	// Returned lease refers to the same epoch as the lease held.
	d.Held, d.Epoch = 0, r.LeaseEpoch
	if r.LeaseLeft > 0 && now < r.LeaseUntilUs {
		d.Held = clampU32(r.LeaseLeft)
	}
	d.ElapsedMs = 0
	if r.Synced() {
		d.ElapsedMs = clampU32((now - r.SyncedUs) / 1000)
	}
	d.Rate, d.RateUsed, d.RateEpoch, d.RateStock = 0, 0, 0, 0
	if RateOf(p) > 0 || r.Rate+r.RateBack > 0 {
		// The gateway takes rate leases on this bucket. The rate it holds stops
		// accruing until the reply brings the new rate (the service stops counting it
		// when it applies this report, so the old grant never overlaps the new one);
		// its stock is kept, and the reply says how much of it the new lease covers
		// (RATIONALE.md §3).
		d.Flags |= wire.FlagRate
		d.Rate, d.RateUsed, d.RateEpoch = clampU32(r.Rate+r.RateBack), clampU32(pd.RateUsed), r.RateEpoch
		r.RateFrac = 0
		if r.RateLive(now) && r.RateAtUs != 0 && now > r.RateAtUs {
			r.accrueRate(p, now)
			if r.RateAtUs != 0 && now > r.RateAtUs {
				r.RateFrac = min((now-r.RateAtUs)*r.Rate, 999_999_999)
			}
		}
		if !r.RateLive(now) {
			r.Stock = 0
		}
		d.RateStock = clampU32(r.Stock)
		r.RateAtUs, r.RateBack = 0, 0
	}
	r.Pending = Pending{}
	r.Urgent = false
	r.ColdCut += r.Cold
	r.Cold = 0
	if seq == 0 {
		seq = 1
	}
	r.CutSeq = seq
	return r
}

// Uncut gives a batch's consumption back to r's pending (the batch was refused for good
// and will not be resent, but its consumption happened and is reported with the next).
func Uncut(r Record, d *wire.Delta, seq uint32) Record {
	if r.CutSeq != seq {
		return r
	}
	r.CutSeq = 0
	r.Cold += r.ColdCut
	r.ColdCut = 0
	if d.Flags&wire.FlagRate != 0 {
		// The rate stopped with the cut and no reply brings a new one.
		r.Rate, r.Stock = 0, 0
		r.Pending.RateUsed += int64(d.RateUsed)
	}
	r.Pending.Leased += int64(d.Leased)
	r.Pending.Over += int64(d.Over)
	r.Pending.Rejected += int64(d.Rejected)
	r.Pending.Early += int64(d.Early)
	if d.Flags&wire.FlagDegraded != 0 {
		r.Pending.Degraded = true
	}
	return r
}

// ApplyReply folds the service's answer s to delta sent, cut into batch seq, into r at
// local time now. The lease part — what the service still reserves of the lease the
// gateway reported, and the new grant — is applied once, to the record that batch cut;
// the rest (remaining, reset, retry, penalty) only when s is newer than what r holds.
//
// Since the cut the gateway consumed from its lease (Pending.Leased) and may have got
// grants from acquires; the reply only speaks of what the batch reported (sent.Held), so
// the lease becomes what it is now, less the part of sent.Held the service no longer
// reserves, plus the grant.
//
// It returns lease to report as returned: when the remaining is negative once this
// gateway's unreported admissions are counted, the grant came out of permits it had
// already admitted, and that much is handed back.
func ApplyReply(r Record, s *wire.State, sent *wire.Delta, seq uint32, now int64) (Record, int64) {
	if seq == 0 {
		seq = 1
	}
	if r.CutSeq != seq {
		r, _ = r.overwrite(s, now, false)
		return r, 0
	}
	r.applyLease(s, sent, now)
	return r.overwrite(s, now, true)
}

// applyLease folds the lease part of the reply s to the delta sent, which carried r's
// lease (sent.Held) when it was cut, into r, and clears the cut.
func (r *Record) applyLease(s *wire.State, sent *wire.Delta, now int64) {
	r.CutSeq = 0
	r.ColdCut = 0 // charged: the service counts it in what it answers
	held := int64(sent.Held)
	acquired := max(0, r.LeaseLeft-held+r.Pending.Leased) // granted by acquires since the cut
	lost := held - min(held, int64(s.Held))
	r.LeaseLeft = max(0, r.LeaseLeft-lost) + int64(s.Lease)
	until := now + int64(s.ValidMs)*1000
	switch {
	case s.Held+s.Lease == 0 && acquired > 0:
		// Nothing from the batch: the acquired lease keeps its own epoch and end.
	case acquired > 0:
		r.LeaseEpoch, r.LeaseUntilUs = s.Epoch, min(until, r.LeaseUntilUs)
	default:
		r.LeaseEpoch, r.LeaseUntilUs = s.Epoch, until
	}
	if sent.Flags&wire.FlagRate != 0 {
		// The new rate (0 when the service granted none, or answered without rates)
		// accrues from a millisecond after now: the service charges it from the
		// millisecond after it granted it (rate.go).
		stock := r.Stock
		r.Rate, r.RateEpoch, r.Stock, r.RateAtUs = 0, 0, 0, 0
		if s.Flags&wire.StateRate != 0 && s.Rate > 0 && s.ValidMs > 0 {
			// The stock: what the service says it covers, less what the gateway used of
			// the stock it reported since.
			used := max(int64(sent.RateStock)-stock, 0)
			r.Rate, r.RateEpoch, r.RateAtUs = int64(s.Rate), s.Epoch, now+1000
			r.Stock = max(min(int64(s.Stock), RateCap(ParamsOf(sent), r.Rate))-used, 0)
			// The part of a permit the old rate had accrued counts at the new rate
			// (rounded down): less than one permit, within the new stock's cap.
			r.RateAtUs -= r.RateFrac / r.Rate
			r.LeaseUntilUs = min(r.LeaseUntilUs, until)
		}
	}
	r.LowWater = int64(s.LowWater)
	r.SyncedUs = now
}

// CutAcquire makes the acquire delta d (FlagAcquire, Over the cost asked for) carry
// what r consumed out of its lease since its last report, the lease it gave back and
// the lease it still holds, as a batch's delta would, and returns the record to store
// with the cut marked by seq (the acquire batch's, low 32 bits). The service then
// charges that consumption and frees its reservation before it decides the acquire:
// otherwise a bucket that refills faster than gateways report stays reserved by
// leases already spent, and the acquire is refused although the bucket is full
// (RATIONALE.md §3). It cuts nothing (false) when a batch carrying r is in flight or
// r has nothing to carry. The answer is applied with ApplyAcquireCut; an acquire that
// got no answer gives the consumption back with UncutAcquire, to be reported with the
// next batch.
func CutAcquire(r Record, now int64, seq uint32, d *wire.Delta) (Record, bool) {
	live := r.LeaseLeft > 0 && now < r.LeaseUntilUs
	pd := &r.Pending
	if r.CutSeq != 0 || !r.Synced() || (pd.Leased == 0 && pd.Returned == 0 && r.LeaseLeft <= 0) {
		return r, false
	}
	if r.LeaseLeft > 0 && !live {
		// The lease ended (Decide gives it back at the request that finds it ended, but
		// the acquiring decision was not stored): it goes back with the acquire, so the
		// answer's lease is not added to what is left of it.
		pd.Returned += r.LeaseLeft
		r.LeaseLeft = 0
	}
	d.Leased, d.Returned = clampU32(pd.Leased), clampU32(pd.Returned)
	d.Held, d.Epoch = 0, r.LeaseEpoch
	if live {
		d.Held = clampU32(r.LeaseLeft)
	}
	pd.Leased, pd.Returned = 0, 0
	if seq == 0 {
		seq = 1
	}
	r.CutSeq = seq
	return r, true
}

// UncutAcquire gives the consumption an unanswered acquire carried (CutAcquire) back
// to r's pending, to be reported with the next batch. The acquire may have been applied
// with its answer lost: the consumption is then charged twice, which refuses early,
// never admits more.
func UncutAcquire(r Record, d *wire.Delta, seq uint32) Record {
	if seq == 0 {
		seq = 1
	}
	if r.CutSeq != seq {
		return r
	}
	r.CutSeq = 0
	r.Pending.Leased += int64(d.Leased)
	r.Pending.Returned += int64(d.Returned)
	return r
}

// ApplyAcquireCut is ApplyAcquire for an acquire that carried r's lease (CutAcquire
// with seq): the lease part of s — what the service still reserves of the lease sent
// and the grant — is applied as a batch reply's is (ApplyReply).
func ApplyAcquireCut(r Record, s *wire.State, sent *wire.Delta, seq uint32, now int64) Record {
	if seq == 0 {
		seq = 1
	}
	if r.CutSeq != seq {
		return ApplyAcquire(r, s, now)
	}
	r.applyLease(s, sent, now)
	r, _ = r.overwrite(s, now, false)
	return r
}

// ApplyAcquire folds the answer to an acquire (a paused request's FlagAcquire delta)
// into r: the grant is added to the lease; a lease already held keeps its older epoch
// and earlier end, so it is never used past what the service reserves.
func ApplyAcquire(r Record, s *wire.State, now int64) Record {
	if g := int64(s.Lease); g > 0 {
		until := now + int64(s.ValidMs)*1000
		if r.LeaseLeft > 0 && now < r.LeaseUntilUs {
			r.LeaseUntilUs = min(r.LeaseUntilUs, until)
		} else {
			r.LeaseLeft = 0
			r.LeaseEpoch = s.Epoch
			r.LeaseUntilUs = until
		}
		r.LeaseLeft += g
		r.LowWater = int64(s.LowWater)
	}
	if !r.Synced() {
		r.SyncedUs = now
	}
	r, _ = r.overwrite(s, now, false)
	return r
}

// overwrite applies the fields of s that describe the global bucket, if s is newer than
// the state r last applied (force: the reply to r's own report, applied regardless).
// A replay's (StateReplay: the batch was applied before, and the service answers only
// the lease it granted then) are not the bucket's: its remaining, reset, retry and
// penalty read 0. Taken for the bucket's, they said it was spent: under load, where a
// sync slower than half an interval is hedged and the hedge's or the original's answer
// is a replay, the next request of every key in that batch whose lease had ended was
// held for an acquire (most of the acquires of BENCHMARKS.md §13's synced Envoy).
func (r Record) overwrite(s *wire.State, now int64, force bool) (Record, int64) {
	if s.Flags&wire.StateReplay != 0 {
		return r, 0
	}
	ms := uint32(s.ServerMs)
	// Replies overtake each other by a round trip at most. A state that looks more than
	// maxReorderMs older is one from after a long silence (the low 32 bits of the server
	// time wrap every 49.7 days and compare as signed differences over 24.8): a bucket
	// used again a month later must take the service's answer, not keep last month's
	// remaining and reset.
	d := int32(ms - r.ServerMs)
	older := r.ServerMs != 0 && d < 0 && d > -maxReorderMs
	if !force && older {
		return r, 0
	}
	if !older {
		r.ServerMs = ms
	}
	remaining := s.Remaining - r.Pending.Over
	var returned int64
	if remaining < 0 && r.LeaseLeft > 0 && s.Lease > 0 {
		returned = min(r.LeaseLeft, int64(s.Lease), -remaining)
		r.LeaseLeft -= returned
		r.Pending.Returned += returned
		remaining += returned
	}
	r.GlobalRemaining = remaining
	r.ResetUs = now + int64(s.ResetInMs)*1000
	retry := now + int64(s.RetryInMs)*1000
	if r.Pending.Over == 0 || remaining >= 1 || retry > r.RetryUs {
		r.RetryUs = retry
	}
	// else: consumption the service has not heard of (Charge) empties the bucket by
	// this gateway's count, and the retry time set for it is later: it stands.
	r.PenaltyLevel = s.PenaltyLevel
	r.PenaltyUntilUs = 0
	if s.PenaltyInMs > 0 {
		r.PenaltyUntilUs = now + int64(s.PenaltyInMs)*1000
	}
	return r, returned
}

// maxReorderMs bounds how much older than the newest applied state a reply can be and
// still be recognized as out of order: far above any request timeout.
const maxReorderMs = 3_600_000

// Synced reports whether a reply has ever been applied to r.
func (r *Record) Synced() bool { return r.SyncedUs != 0 }

// Idle reports whether r has seen nothing for idleUs and holds nothing worth keeping
// (no lease, nothing to report), so its shared-data slot may be reused.
func (r *Record) Idle(now, idleUs int64) bool {
	last := max(r.SyncedUs, r.AnnouncedUs, r.UsedUs)
	return (r.LeaseLeft == 0 && r.Rate == 0 || now >= r.LeaseUntilUs) && r.Pending.empty() && r.CutSeq == 0 && r.RateBack == 0 &&
		now-last > idleUs && r.PenaltyUntilUs <= now
}

// LastSeen is the last time anything happened to r (for least-recently-used eviction).
func (r *Record) LastSeen() int64 { return max(r.SyncedUs, r.AnnouncedUs, r.UsedUs) }

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
