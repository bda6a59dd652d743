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
	PenaltyLevel   uint8
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
	Penalized       bool  // rejected by a progressive-penalty cooldown
	PenaltyLevel    uint8
	// Flush asks for an early sync: the bucket is new or its lease ran dry.
	Flush bool
}

// Decide decides one request of cost on r at local time now and returns the record to
// store if the request is admitted by every bucket it touches. It never mutates r.
func Decide(r Record, p algo.Params, now, cost int64, env Env) (Record, Decision) {
	var d Decision
	if r.PenaltyUntilUs > now {
		d.PenaltyLevel = r.PenaltyLevel
		d.Penalized = true
		d.RetryAfterUs = r.PenaltyUntilUs - now
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
		// start. Allow this gateway's fair share of a full bucket until the reply to the
		// flush asked for here arrives.
		d.Flush = true
		if synced || len(r.Local) == 0 {
			r.SyncedUs = 0
			r.Local = algo.Take(p, nil, now, capacity-capacity/nodes)
		}
		return decideLocal(r, p, now, cost, d)
	}
	// Synced with a valid lease.
	switch {
	case r.LeaseLeft >= cost:
		r.LeaseLeft -= cost
		d.Leased = cost
	case r.Overdraft >= cost:
		r.Overdraft -= cost
		r.GlobalRemaining -= cost
		d.Over = cost
		d.Flush = true
	default:
		d.Flush = true
		d.ResetUs = r.ResetUs
		d.Remaining = 0
		if r.GlobalRemaining >= cost || r.RetryUs <= now {
			// The global bucket has permits but this gateway's share is spent: the flush
			// asked for here brings a new lease within a sync interval. The caller did
			// nothing wrong, so this refusal neither announces a Retry-After nor counts
			// toward progressive penalties.
			d.RetryAfterUs = env.IntervalUs
			d.Rejected = 1
			return r, d
		}
		d.RetryAfterUs = r.RetryUs - now
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

// ApplyReply folds the service's authoritative state into r at local time now.
func ApplyReply(r Record, s *wire.State, now, nodes int64) Record {
	if nodes < 1 {
		nodes = 1
	}
	r.LeaseLeft += int64(s.Lease)
	r.GlobalRemaining = s.Remaining
	r.Overdraft = maxI(0, s.Remaining) / nodes
	r.SyncedUs = now
	r.ResetUs = now + int64(s.ResetInMs)*1000
	r.RetryUs = now + int64(s.RetryInMs)*1000
	r.PenaltyLevel = s.PenaltyLevel
	if s.PenaltyInMs > 0 {
		r.PenaltyUntilUs = now + int64(s.PenaltyInMs)*1000
	} else {
		r.PenaltyUntilUs = 0
	}
	return r
}

// Synced reports whether a reply has ever been applied to r.
func (r *Record) Synced() bool { return r.SyncedUs != 0 }

// Idle reports whether r has seen nothing for idleUs and holds no lease worth keeping,
// so its shared-data slot may be reused.
func (r *Record) Idle(now, idleUs int64) bool {
	last := maxI(r.SyncedUs, r.AnnouncedUs)
	return r.LeaseLeft == 0 && now-last > idleUs && r.PenaltyUntilUs <= now
}

// Encoding: a fixed 40-byte header followed by the algorithm state (≤ 24 bytes for every
// algorithm but the sliding window log), so a record is ≤ 64 bytes:
//
//	0      version (1)
//	1      flags (bit 0: synced)
//	2      penalty level
//	3..11  base time (int64 µs): SyncedUs when synced, else the earliest set time
//	11..15 LeaseLeft, 15..19 Overdraft, 19..23 GlobalRemaining (int32, saturated)
//	23..27 ResetUs, 27..31 RetryUs, 31..35 PenaltyUntilUs, 35..39 AnnouncedUs
//	       (int32 milliseconds after base, rounded up so a deadline is never brought
//	       forward; ±24 days is far beyond any window)
//	39     length of the algorithm state
//	40..   algorithm state
const (
	recordVersion = 1
	headerSize    = 40
	flagSynced    = 1
)

// MaxRecordSize is the encoded size bound for fixed-size algorithms.
const MaxRecordSize = headerSize + algo.MaxStateSize

// ErrRecord reports an undecodable record.
var ErrRecord = errors.New("lease: malformed record")

// AppendRecord encodes r after dst.
func AppendRecord(dst []byte, r *Record) []byte {
	var h [headerSize]byte
	h[0] = recordVersion
	base := r.SyncedUs
	if base != 0 {
		h[1] = flagSynced
	} else {
		for _, t := range [...]int64{r.ResetUs, r.RetryUs, r.PenaltyUntilUs, r.AnnouncedUs} {
			if t != 0 && (base == 0 || t < base) {
				base = t
			}
		}
	}
	h[2] = r.PenaltyLevel
	binary.LittleEndian.PutUint64(h[3:], uint64(base))
	putI32(h[11:], r.LeaseLeft)
	putI32(h[15:], r.Overdraft)
	putI32(h[19:], r.GlobalRemaining)
	putRel(h[23:], r.ResetUs, base)
	putRel(h[27:], r.RetryUs, base)
	putRel(h[31:], r.PenaltyUntilUs, base)
	putRel(h[35:], r.AnnouncedUs, base)
	n := len(r.Local)
	if n > 255 {
		n = 0 // only an unbounded sliding-window log gets here: it restarts fresh
	}
	h[39] = byte(n)
	dst = append(dst, h[:]...)
	return append(dst, r.Local[:n]...)
}

// DecodeRecord decodes data into r, reusing r.Local's capacity.
func DecodeRecord(data []byte, r *Record) error {
	if len(data) < headerSize || data[0] != recordVersion {
		return ErrRecord
	}
	n := int(data[39])
	if len(data) != headerSize+n {
		return ErrRecord
	}
	base := int64(binary.LittleEndian.Uint64(data[3:]))
	r.SyncedUs = 0
	if data[1]&flagSynced != 0 {
		r.SyncedUs = base
	}
	r.PenaltyLevel = data[2]
	r.LeaseLeft = getI32(data[11:])
	r.Overdraft = getI32(data[15:])
	r.GlobalRemaining = getI32(data[19:])
	r.ResetUs = getRel(data[23:], base)
	r.RetryUs = getRel(data[27:], base)
	r.PenaltyUntilUs = getRel(data[31:], base)
	r.AnnouncedUs = getRel(data[35:], base)
	r.Local = append(r.Local[:0], data[headerSize:]...)
	return nil
}

const relNone = -1 << 31 // marks a zero (unset) time

func putRel(b []byte, t, base int64) {
	v := int64(relNone)
	if t != 0 {
		v = clampI32(ceilDiv(t-base, 1000))
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
