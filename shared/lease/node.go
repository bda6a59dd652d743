package lease

import (
	"encoding/binary"
	"errors"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Record is a gateway's view of one bucket (caller key, rule, window), kept in Envoy
// shared data so every worker VM of the gateway decides against the same allowance.
//
// Times are absolute microseconds on the gateway's own clock. The service's durations are
// converted to it on receipt (ApplyReply), so gateway and server clocks are never compared.
type Record struct {
	// Local is the algorithm state this gateway keeps on its own: it decides alone when sync
	// is disabled, on a cold start and while degraded.
	Local algo.State
	// LeaseLeft is what remains of the lease the service reserved for this gateway.
	LeaseLeft int64
	// Overdraft is this gateway's slice of the global unreserved pool (RATIONALE §2).
	Overdraft int64
	// GlobalRemaining is the last-known global unreserved quota minus what this gateway
	// has admitted from its overdraft since.
	GlobalRemaining int64
	// SyncedUs is when the last reply was applied (0: never, a cold bucket).
	SyncedUs       int64
	ResetUs        int64 // global bucket full again / window end
	RetryUs        int64 // global bucket admits one permit again
	PenaltyUntilUs int64 // progressive-penalty cooldown end
	AnnouncedUs    int64 // earliest time the last 429 told the caller to come back
	// UsedUs is the last decision on this bucket (what makes it busy, not idle).
	UsedUs int64
	// OverSinceSync is what this gateway admitted outside its lease (cold start,
	// overdraft) that no applied reply has accounted for yet: a reply's remaining cannot
	// include it, so ApplyReply takes it off (RATIONALE §3).
	OverSinceSync int64
	PenaltyLevel  uint8
}

// Env is what a decision needs to know about the gateway beyond the bucket.
type Env struct {
	// Sync is false when no sync service is configured: the gateway is the whole fleet.
	Sync bool
	// Healthy is false while the circuit breaker is open.
	Healthy bool
	// Nodes is the fleet size (from the last reply, or the configured expectation).
	Nodes int64
	// LeaseTTLUs is how long a lease stays usable without a successful sync.
	LeaseTTLUs int64
	// IntervalUs is the sync interval (a rejected caller whose lease ran dry while the
	// global bucket still had permits is told to come back after it).
	IntervalUs int64
}

// Decision is the outcome of Decide for one bucket.
type Decision struct {
	Allowed bool
	// Leased and Over split the admitted cost for the sync batch (wire.Delta);
	// Returned is lease dropped by this decision (expired), to be reported.
	Leased, Over, Returned int64
	// Rejected/Early are 1 when the request was rejected (Early: before the Retry-After
	// this bucket had announced).
	Rejected, Early int64
	Remaining       int64 // for headers; never negative
	ResetUs         int64 // absolute, local clock
	RetryAfterUs    int64 // when !Allowed: from now until the bucket can admit (un-jittered)
	Degraded        bool  // decided without a valid lease (sync enabled but unhealthy)
	// FromOverdraft is set when Over came out of the overdraft slice; Unreported when
	// Over was added to Record.OverSinceSync (cold start or overdraft). Undo needs both.
	FromOverdraft, Unreported bool
	Penalized                 bool  // rejected by a progressive-penalty cooldown
	PenaltyLeftUs             int64 // when Penalized: what remains of the cooldown
	PenaltyLevel              uint8
	// Flush asks for an early sync: the bucket is new or its lease ran dry.
	Flush bool
}

// Decide decides one request of cost on r at local time now and returns the record to
// store if the request is admitted by every bucket it touches. It never mutates r.
func Decide(r Record, p algo.Params, now, cost int64, env Env) (Record, Decision) {
	var d Decision
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
		d.ResetUs = maxI(r.ResetUs, r.PenaltyUntilUs)
		return reject(r, now, d)
	}
	capacity := p.Capacity()
	nodes := env.Nodes
	if nodes < 1 {
		nodes = 1
	}
	synced := r.SyncedUs != 0
	leaseValid := synced && env.Healthy && now-r.SyncedUs <= env.LeaseTTLUs
	if env.Sync && !leaseValid && r.LeaseLeft > 0 {
		// The lease is stale: the service will reclaim it; give it back explicitly so a
		// gateway that reconnects before the reclaim does not strand it (RATIONALE §2).
		d.Returned = r.LeaseLeft
		r.LeaseLeft = 0
	}
	switch {
	case !env.Sync:
		return decideLocal(r, p, now, cost, d)
	case !env.Healthy:
		d.Degraded = true
		return decideLocal(r, p, now, cost, d)
	case !leaseValid:
		// Never synced, or idle past the lease TTL while the service is reachable: a cold
		// start. Allow this gateway's fair share of what the bucket can hold until the
		// reply to the flush asked for here arrives.
		d.Flush = true
		// The lease just returned (d.Returned) is back in the pool too: the service may
		// have leased this gateway everything it had.
		known := max(0, r.GlobalRemaining) + d.Returned
		if synced && r.RetryUs > now && known < cost {
			// The service last said the bucket is empty until RetryUs: that still holds.
			d.RetryAfterUs = r.RetryUs - now
			d.ResetUs = r.ResetUs
			return reject(r, now, d)
		}
		if synced || len(r.Local) == 0 {
			slice := capacity / nodes
			if synced {
				// The lease just returned was reserved for this gateway: it stays usable
				// here. The unreserved rest — what the bucket held at the last reply plus
				// what it refilled since — is split with the rest of the fleet.
				refill := (now - r.SyncedUs) / max(1, p.WindowUs/max(1, p.Limit))
				slice = min(capacity, d.Returned+(max(0, r.GlobalRemaining)+refill)/nodes)
			}
			r.SyncedUs = 0
			r.Local = algo.Take(p, nil, now, capacity-slice)
		}
		r, d = decideLocal(r, p, now, cost, d)
		if !d.Allowed {
			// This gateway's cold slice is spent, not necessarily the bucket: not the
			// caller's fault, so no announced Retry-After and no penalty signal.
			return soft(r, d, env)
		}
		r.OverSinceSync += cost
		d.Unreported = true
		return r, d
	}
	// Synced with a valid lease.
	switch {
	case r.LeaseLeft >= cost:
		r.LeaseLeft -= cost
		d.Leased = cost
	case r.Overdraft >= cost:
		r.Overdraft -= cost
		r.GlobalRemaining -= cost
		r.OverSinceSync += cost
		d.Over = cost
		d.FromOverdraft, d.Unreported = true, true
		d.Flush = true
	default:
		d.Flush = true
		d.ResetUs = r.ResetUs
		d.Remaining = 0
		if r.GlobalRemaining >= cost {
			// The global bucket has permits but this gateway's share is spent: the flush
			// asked for here brings a new lease within a sync interval.
			return soft(r, d, env)
		}
		// The global bucket is empty as far as this gateway knows: wait until the
		// service's retry time, and at least until the steady rate refills the deficit
		// (the last reply's retry time predates what this gateway spent since).
		perPermit := max(1, p.WindowUs/max(1, p.Limit))
		d.RetryAfterUs = max(r.RetryUs-now, (cost-r.GlobalRemaining)*perPermit)
		return reject(r, now, d)
	}
	d.Allowed = true
	// The local state follows this gateway's own traffic so that, if the service goes
	// away, degraded decisions start from what this gateway actually admitted.
	r.Local = algo.Take(p, r.Local, now, cost)
	d.Remaining = maxI(0, r.LeaseLeft+maxI(0, r.GlobalRemaining))
	d.ResetUs = maxI(r.ResetUs, now)
	return r, d
}

func decideLocal(r Record, p algo.Params, now, cost int64, d Decision) (Record, Decision) {
	res := algo.Decide(p, r.Local, now, cost)
	d.ResetUs = res.ResetUs
	d.Remaining = maxI(0, res.Remaining)
	if !res.Allowed {
		d.RetryAfterUs = res.RetryAfterUs
		r.Local = res.State
		return reject(r, now, d)
	}
	d.Allowed = true
	d.Over = cost
	r.Local = res.State
	return r, d
}

// reject records the announcement of a Retry-After so that a caller coming back before it
// is counted as Early (the progressive-penalty signal).
func reject(r Record, now int64, d Decision) (Record, Decision) {
	d.Allowed = false
	d.Rejected = 1
	if now < r.AnnouncedUs {
		d.Early = 1
	}
	if d.RetryAfterUs < 0 {
		d.RetryAfterUs = 0
	}
	if announced := now + d.RetryAfterUs; announced > r.AnnouncedUs {
		r.AnnouncedUs = announced
	}
	return r, d
}

// Undo gives back what an admitting decision d took from r (cost permits at now): the
// exact inverse of Decide's bookkeeping, for a request that another bucket refused after
// this one was written.
func Undo(r Record, p algo.Params, now, cost int64, d *Decision) Record {
	if !d.Allowed {
		return r
	}
	r.LeaseLeft += d.Leased
	if d.FromOverdraft {
		r.Overdraft += d.Over
		r.GlobalRemaining += d.Over
	}
	if d.Unreported {
		r.OverSinceSync = max(0, r.OverSinceSync-d.Over)
	}
	r.Local = algo.Refund(p, r.Local, now, cost)
	return r
}

// soft refuses without blaming the caller: the gateway's share ran out while the global
// bucket may still hold permits. It answers one sync interval, announces nothing and
// sends no penalty signal; the flush it asks for brings a new lease.
func soft(r Record, d Decision, env Env) (Record, Decision) {
	d.Allowed = false
	d.Flush = true
	d.Rejected = 1
	d.Early = 0
	d.Remaining = 0
	d.RetryAfterUs = max(env.IntervalUs, 1)
	return r, d
}

// ApplyReply folds the service's authoritative state into r at local time now.
// reportedOver is the Over of the delta this reply answers (0 for a bucket the batch did
// not carry): the rest of r.OverSinceSync has not reached the service yet, so it is taken
// off the reply's remaining, and stays counted until a reply accounts for it.
//
// When that leaves the remaining negative, the lease just granted came out of permits
// this gateway had already admitted: that much of it is handed straight back (returned,
// to be reported as wire.Delta.Returned), and the unreported admissions will consume it
// when they reach the service.
func ApplyReply(r Record, s *wire.State, now, nodes, reportedOver int64) (Record, int64) {
	if nodes < 1 {
		nodes = 1
	}
	unreported := max(0, r.OverSinceSync-reportedOver)
	remaining := s.Remaining - unreported
	r.OverSinceSync = unreported
	r.LeaseLeft += int64(s.Lease)
	var returned int64
	if remaining < 0 && r.LeaseLeft > 0 {
		returned = min(r.LeaseLeft, -remaining)
		r.LeaseLeft -= returned
		remaining += returned
	}
	r.GlobalRemaining = remaining
	r.Overdraft = max(0, remaining) / nodes
	r.SyncedUs = now
	r.ResetUs = now + int64(s.ResetInMs)*1000
	r.RetryUs = now + int64(s.RetryInMs)*1000
	r.PenaltyLevel = s.PenaltyLevel
	if s.PenaltyInMs > 0 {
		r.PenaltyUntilUs = now + int64(s.PenaltyInMs)*1000
	} else {
		r.PenaltyUntilUs = 0
	}
	return r, returned
}

// Synced reports whether a reply has ever been applied to r.
func (r *Record) Synced() bool { return r.SyncedUs != 0 }

// Idle reports whether r has seen nothing for idleUs and holds no lease worth keeping,
// so its shared-data slot may be reused.
func (r *Record) Idle(now, idleUs int64) bool {
	last := max(r.SyncedUs, r.AnnouncedUs, r.UsedUs)
	return r.LeaseLeft == 0 && now-last > idleUs && r.PenaltyUntilUs <= now
}

// Encoding: a fixed 47-byte header followed by the algorithm state (13 or 17 bytes for
// every algorithm but the sliding window log), so a record is ≤ 64 bytes:
//
//	0      version (2)
//	1      flags (bit 0: synced, bit 1: used)
//	2      penalty level
//	3..11  base (int64 µs): UsedUs, or the earliest time set when never used; the
//	       times below are relative to it
//	11..15 SyncedUs, 15..19 ResetUs, 19..23 RetryUs, 23..27 PenaltyUntilUs,
//	27..31 AnnouncedUs: int32 milliseconds relative to UsedUs, rounded up so a deadline
//	       is never brought forward (SyncedUs rounded down, so a lease never looks younger);
//	       ±24 days is far beyond any window or lease
//	31..35 LeaseLeft, 35..39 Overdraft, 39..43 GlobalRemaining, 43..47 OverSinceSync
//	       (int32, saturated)
//	47..   algorithm state (the rest of the value)
const (
	recordVersion = 2
	headerSize    = 47
	flagSynced    = 1
	flagUsed      = 2
)

// MaxRecordSize is the encoded size bound for the fixed-size algorithms.
const MaxRecordSize = 64

// ErrRecord reports an undecodable record.
var ErrRecord = errors.New("lease: malformed record")

// AppendRecord encodes r after dst.
func AppendRecord(dst []byte, r *Record) []byte {
	var h [headerSize]byte
	h[0] = recordVersion
	base := r.UsedUs
	if base == 0 {
		for _, t := range [...]int64{r.SyncedUs, r.ResetUs, r.RetryUs, r.PenaltyUntilUs, r.AnnouncedUs} {
			if t != 0 && (base == 0 || t < base) {
				base = t
			}
		}
	}
	if r.SyncedUs != 0 {
		h[1] |= flagSynced
	}
	if r.UsedUs != 0 {
		h[1] |= flagUsed
	}
	h[2] = r.PenaltyLevel
	binary.LittleEndian.PutUint64(h[3:], uint64(base))
	putRel(h[11:], r.SyncedUs, base, false)
	putRel(h[15:], r.ResetUs, base, true)
	putRel(h[19:], r.RetryUs, base, true)
	putRel(h[23:], r.PenaltyUntilUs, base, true)
	putRel(h[27:], r.AnnouncedUs, base, true)
	putI32(h[31:], r.LeaseLeft)
	putI32(h[35:], r.Overdraft)
	putI32(h[39:], r.GlobalRemaining)
	putI32(h[43:], r.OverSinceSync)
	dst = append(dst, h[:]...)
	return append(dst, r.Local...)
}

// DecodeRecord decodes data into r, reusing r.Local's capacity.
func DecodeRecord(data []byte, r *Record) error {
	if len(data) < headerSize || data[0] != recordVersion {
		return ErrRecord
	}
	base := int64(binary.LittleEndian.Uint64(data[3:]))
	r.UsedUs = 0
	if data[1]&flagUsed != 0 {
		r.UsedUs = base
	}
	r.PenaltyLevel = data[2]
	r.SyncedUs = 0
	if data[1]&flagSynced != 0 {
		r.SyncedUs = getRel(data[11:], base)
	}
	r.ResetUs = getRel(data[15:], base)
	r.RetryUs = getRel(data[19:], base)
	r.PenaltyUntilUs = getRel(data[23:], base)
	r.AnnouncedUs = getRel(data[27:], base)
	r.LeaseLeft = getI32(data[31:])
	r.Overdraft = getI32(data[35:])
	r.GlobalRemaining = getI32(data[39:])
	r.OverSinceSync = getI32(data[43:])
	r.Local = append(r.Local[:0], data[headerSize:]...)
	return nil
}

const relNone = -1 << 31 // marks a zero (unset) time

func putRel(b []byte, t, base int64, up bool) {
	v := int64(relNone)
	if t != 0 {
		if up {
			v = clampI32(ceilDiv(t-base, 1000))
		} else {
			v = clampI32(floorDiv(t-base, 1000))
		}
		if v == relNone {
			v++
		}
	}
	binary.LittleEndian.PutUint32(b, uint32(int32(v)))
}

func getRel(b []byte, base int64) int64 {
	v := int64(int32(binary.LittleEndian.Uint32(b)))
	if v == relNone {
		return 0
	}
	return base + v*1000
}

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

func putI32(b []byte, v int64) { binary.LittleEndian.PutUint32(b, uint32(int32(clampI32(v)))) }
func getI32(b []byte) int64    { return int64(int32(binary.LittleEndian.Uint32(b))) }

func clampI32(v int64) int64 {
	const lo, hi = -1 << 31, 1<<31 - 1
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

func maxI(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
