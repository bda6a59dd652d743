package lease

// This file is the Go twin of the sync service's lease script
// (ratelimit/store/scripts/lease.lua). The service runs the Lua inside Redis; this code
// exists so the protocol can be reasoned about, property-tested and simulated natively,
// and the store's differential test checks that both produce the same outputs and store
// the same bytes, step by step, on random delta sequences (RATIONALE.md §2).
//
// Arithmetic is integer-only and every intermediate value stays below 2^53, so Lua's
// doubles compute exactly what Go's int64 computes: demand samples are clamped to 2^22
// permits over at least MinElapsedMs, rates to 2^31 milli-permits per second, and
// horizons to MaxHorizonMs, so rate × horizon < 2^48.

import (
	"encoding/binary"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// SyncConfig holds the service-side lease settings (flags of tollgate-ratelimit).
type SyncConfig struct {
	// RateLeases grants rate leases (RATIONALE.md §3, "Keys at their limit"), to a
	// gateway alone, and in fleets of more than one. Off in the service, whose Lua twin
	// grants none: through real proxies (e2e TestFleetOneKey, one key at 10× its limit
	// over 4 gateways that start together) rates admitted 54–84 % of the allowance on a
	// quiet machine and 112 % on a loaded one, where counts alone stay within 1 % — each
	// gateway is a fleet of one to the service until it has counted the others (about
	// two seconds), and a rate granted then lasts its epochs — and the Redis bucket
	// showed accrual charged that the gateways' stocks had not used. The Go model keeps
	// the paths under test.
	RateLeases bool
	// EpochMs is the lease epoch. A lease granted or renewed during epoch k is reclaimed
	// when epoch k+2 begins: a gateway that stops reporting (it died) gives its leases
	// back within two epochs, and a gateway renews a lease it still holds whenever it
	// reports the bucket. Window algorithms also end every lease with the window.
	EpochMs int64
	// HorizonMs: a lease covers this much of the gateway's demand (the longer, the rarer
	// the reports of a bucket whose consumption stays within its lease).
	HorizonMs int64
	// MaxShare: one lease is at most capacity/MaxShare permits (1: no cap beyond the
	// fair share). Besides, a lease is at most the gateway's share of the bucket's
	// demand times its capacity, and one grant at most half of what the bucket still has
	// unreserved, so that no gateway can reserve a bucket away from the others.
	MaxShare int64
	// RenewMs: the gateway reports again when its lease falls to what its demand
	// consumes in this long (the low-water mark), so the renewal arrives before the
	// lease runs out.
	RenewMs int64
	// MinElapsedMs is the shortest interval a demand sample is measured over (a bucket's
	// first report counts its first admissions over one sync interval).
	MinElapsedMs int64
	// ValidMarginMs shortens the validity a reply announces, to cover the reply's
	// transit and clock-rate differences: a gateway stops using a lease before the
	// service can reclaim it.
	ValidMarginMs int64
	// PenaltyBaseUs is the first progressive-penalty cooldown; each further early
	// request (at most one step per PenaltyBaseUs) doubles it up to PenaltyMaxUs. A key
	// that stays calm for PenaltyMaxUs after its cooldown ends starts over at level 0.
	PenaltyBaseUs int64
	PenaltyMaxUs  int64
	// Nodes is the fleet size the service counts when it applies the delta (Reply.Nodes;
	// 0 or 1: no fleet). It caps a gateway's first lease of a bucket (FirstLeaseShare): a
	// cold start's demand sample (a burst over the shortest interval) would otherwise
	// hand the first gateways half the bucket each, and the others' first requests would
	// find it reserved (RATIONALE.md §2, "Grants").
	Nodes int64
	// Claimant is the tag (NodeTag) of the gateway whose delta this is. With a fleet
	// (Nodes > 1) a key's penalty level never exceeds the number of distinct gateways
	// that claimed early requests for it, less one: one gateway's word alone, a forged
	// report included, cannot penalize a key (RATIONALE.md §3, "What one gateway can do").
	Claimant uint32
}

// DefaultSyncConfig is the service's default configuration.
var DefaultSyncConfig = SyncConfig{
	EpochMs: 20_000, HorizonMs: 10_000, MaxShare: 2, RenewMs: 500, MinElapsedMs: 100,
	ValidMarginMs: 1_000, PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 60_000_000,
}

// Bounds of the integer arithmetic (see the file comment).
const (
	MaxHorizonMs  = 120_000
	maxEpochMs    = 3_600_000
	maxCount      = 1 << 22
	maxRate       = 1 << 31
	maxElapsedMs  = 60_000
	maxPenaltyLvl = 62
	maxHeld       = 1<<32 - 1 // wire fields are uint32
	maxDemand     = 1 << 32   // permits counted per epoch
	maxShareDen   = 1 << 20
	maxNodes      = 1 << 20 // the service's fleet count stops far below (FleetMaxNodes)
)

// Normalized returns c with out-of-range values replaced so the integer bounds hold.
func (c SyncConfig) Normalized() SyncConfig {
	d := DefaultSyncConfig
	if c.EpochMs <= 0 {
		c.EpochMs = d.EpochMs
	}
	c.EpochMs = min(c.EpochMs, maxEpochMs)
	if c.HorizonMs <= 0 {
		c.HorizonMs = d.HorizonMs
	}
	c.HorizonMs = min(c.HorizonMs, MaxHorizonMs)
	if c.MaxShare <= 0 {
		c.MaxShare = d.MaxShare
	}
	if c.RenewMs <= 0 {
		c.RenewMs = d.RenewMs
	}
	c.RenewMs = min(c.RenewMs, MaxHorizonMs)
	if c.MinElapsedMs <= 0 {
		c.MinElapsedMs = d.MinElapsedMs
	}
	c.MinElapsedMs = min(c.MinElapsedMs, maxElapsedMs)
	if c.ValidMarginMs < 0 {
		c.ValidMarginMs = 0
	}
	if c.PenaltyBaseUs <= 0 {
		c.PenaltyBaseUs = d.PenaltyBaseUs
	}
	if c.PenaltyMaxUs < c.PenaltyBaseUs {
		c.PenaltyMaxUs = c.PenaltyBaseUs
	}
	c.Nodes = min(max(c.Nodes, 0), maxNodes)
	return c
}

// FirstLeaseShare: a gateway's first lease of a bucket (it holds none and never applied
// a reply for it, ElapsedMs 0: its demand sample is a cold start's first requests, which
// says nothing of its share) is at most capacity/(FirstLeaseShare·Nodes), so first
// leases the fleet's gateways cannot use reserve at most a quarter of the bucket
// (RATIONALE.md §3, "Cold starts"). Where the cap is 0 (a small bucket on a large fleet)
// an acquire gets no lease beyond its cost and its Want, and a report none: the next
// acquire (Want) or a report over a real interval sizes the lease.
const FirstLeaseShare = 4

// FleetLeaseKeep: in a fleet (more than one gateway), leases sized by demand leave
// floor(capacity/FleetLeaseKeep) of a bucket unreserved. Each gateway's lease follows
// its share of the demand, so with nothing kept the leases summed to the whole
// capacity, and a gateway whose demand ran above its share for a moment (a burst, a
// Poisson client's noise) found the rest reserved by gateways that did not use theirs:
// over 16 gateways, clients at 4× their limit for 200 ms a second saw 12.6 % of the
// requests one perfect bucket admitted refused (0.8 % with half kept; 4.6 % with a
// third, 7.3 % with a quarter). What is kept goes to acquires, whose Want is covered
// from all that is unreserved (RATIONALE.md §2, "Grants"; BENCHMARKS.md §11).
const FleetLeaseKeep = 2

// Leases is the service's bookkeeping of the leases of one bucket, whatever the number
// of gateways: what is outstanding, by the epoch in which it was granted or last
// renewed. No gateway is named: a gateway reports the epoch of the lease it holds, and
// an epoch's leases are reclaimed together (RATIONALE.md §2).
type Leases struct {
	Epoch uint32 // epoch index (mod 2^32) of Cur
	Cur   int64  // outstanding leases granted or renewed in Epoch
	Prev  int64  // ... in Epoch-1 (always 0 for window algorithms at a window start)
	// DemandCur and DemandPrev are the permits gateways reported using or asking for
	// (admitted and refused) in Epoch and Epoch-1: the bucket's demand, which a
	// gateway's own demand is compared with to size its fair share.
	DemandCur, DemandPrev int64
	// RateCur and RatePrev are the rate leases out (milli-permits per second) granted or
	// renewed in Epoch and Epoch-1 (rate.go); AccOff is when their accrual was last
	// charged to the state (ms after the start of Epoch) and AccFrac the part of a
	// permit accrued beyond what was charged (millionths). All four are 0 when no rate
	// lease is out.
	RateCur, RatePrev, AccOff, AccFrac int64
}

// Outstanding is Σ of the outstanding leases.
func (l *Leases) Outstanding() int64 { return l.Cur + l.Prev }

// Bucket is the global record of one (caller key, rule, window): the Redis string
// tg:{key}:rule:window, the algorithm state of everything reported consumed, and the
// leases outstanding beside it. The leases are not taken from State when granted: what
// the bucket can still give is Available(State) − Outstanding, and a lease's
// consumption is charged when it is reported. So the bucket never holds more than its
// capacity, however long a lease is held (RATIONALE.md §2).
type Bucket struct {
	State  algo.State
	Leases Leases
}

// Penalty is a caller key's progressive-penalty record (the hash tg:{key}:p).
type Penalty struct {
	Level   int64 // "l"
	UntilUs int64 // "u": cooldown end
	LastUs  int64 // "t": when the level last grew (at level 0: the last early claim)
	// Nodes ("n") is the tags of the gateways that claimed early requests for the key
	// since the record started, 8 hex digits each, at most maxClaimants of them.
	Nodes string
	// Owner ("o") is the tag of the gateway whose own cooldown OwnLevel ("ol"),
	// OwnUntilUs ("ou") and OwnLastUs ("ot") are: in a fleet its claims step it, and
	// only the answers to it carry it. One gateway's at a time, until it decays.
	Owner                           string
	OwnLevel, OwnUntilUs, OwnLastUs int64
}

// tagHex is a node tag as penalty records write it: 8 hex digits.
func tagHex(tag uint32) string { return strconv.FormatUint(uint64(tag)|1<<32, 16)[1:] }

// maxClaimants bounds Penalty.Nodes: beyond it the level is bounded by the cooldown
// cap (PenaltyMaxUs) long before, at the default settings.
const maxClaimants = 16

// NodeTag is the tag a gateway's node id is known by in penalty records (FNV-1a, 32
// bits): a collision merges two gateways' claims, which only makes the bound tighter.
func NodeTag(node string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(node); i++ {
		h ^= uint32(node[i])
		h *= 16777619
	}
	return h
}

// claim records the early claim of the gateway tagged tag at now and returns how many
// distinct gateways claimed early for the key.
func (p *Penalty) claim(tag uint32, now int64) int64 {
	t := tagHex(tag)
	found := false
	for i := 0; i+8 <= len(p.Nodes); i += 8 {
		if p.Nodes[i:i+8] == t {
			found = true
			break
		}
	}
	if !found && len(p.Nodes) < 8*maxClaimants {
		p.Nodes += t
	}
	if p.Level == 0 {
		p.LastUs = now
	}
	return int64(len(p.Nodes) / 8)
}

// SyncResult is what the script returns for one delta. Durations are from now.
type SyncResult struct {
	Replay    bool // the batch was applied before: the lease fields repeat that application
	Allowed   bool // FlagStrict/FlagAcquire: Over was taken; otherwise true
	Remaining int64
	Grant     int64 // new lease for the gateway
	Held      int64 // lease the gateway reported holding that is still reserved (renewed)
	Epoch     uint32
	ValidUs   int64 // how long the gateway may use Held+Grant
	LowWater  int64
	ResetUs   int64
	RetryUs   int64
	PenaltyUs int64
	Level     int64
	// Overshoot is the part of this delta's unconditional charge that exceeded what the
	// bucket held unreserved: admitted while the bucket was (or went) into debt.
	Overshoot int64
	// Clamped is the part of the charge beyond one capacity of debt, which is not
	// charged: no report can lock a key out for more than one window.
	Clamped int64
	// Reclaimed is lease whose epoch ended, given back to the bucket by this call.
	Reclaimed int64
	// Excess is the part of the charge beyond what the rule could have admitted over the
	// period the delta reports (ReportBound), which is not charged: a forged report
	// cannot charge a key more than its rule allows in that time.
	Excess int64
	// Rate is the rate lease granted (milli-permits per second, rate.go), answered when
	// the delta asked with FlagRate (RateAnswer).
	Rate       int64
	RateAnswer bool
	// Stock is what the rate lease starts with (permits the state held beyond what the
	// stocks leave it, taken from the state).
	Stock int64
	NowUs int64 // server time of the call
}

// maxReportWindows bounds the windows ReportBound counts (2^20: the bound stays below
// 2^53 for every uint32 limit, so the script computes it exactly in doubles).
const maxReportWindows = 1 << 20

// ReportBound is the most a gateway's report of elapsedMs can have consumed on a bucket
// of parameters p outside its lease: a full bucket (the capacity) plus the larger of the
// limit and the capacity for every window, rounded up, of the period — what the rule
// admits from full over that time, with room to spare. ElapsedMs is the time since the
// gateway last applied a reply for the bucket (0 if never), so a forged period can only
// loosen this bound; the debt cap (one capacity) still holds. Reports the gateway made
// while the service was unreachable (FlagDegraded) are charged at most what the bucket
// held, well inside it.
func ReportBound(p algo.Params, elapsedMs int64) int64 {
	// Calendar months count as 28 days here: a period of elapsed spans at most this many
	// windows plus one.
	win := max(p.ShortestWindowUs(), 1)
	n := min((max(elapsedMs, 0)*1000+win-1)/win, maxReportWindows)
	return max(p.Limit, p.Capacity()) * (n + 1)
}

// Fill writes r into the wire State a gateway receives. Durations round up to
// milliseconds so gateways reset late rather than early (RATIONALE.md §4), except the
// validity, which rounds down so a lease is never used past it.
func (r *SyncResult) Fill(st *wire.State) {
	st.Flags = 0
	if r.Allowed {
		st.Flags |= wire.StateAllowed
	}
	if r.Replay {
		st.Flags |= wire.StateReplay
	}
	st.Remaining = r.Remaining
	st.Lease = clampU32(r.Grant)
	st.Held = clampU32(r.Held)
	st.Epoch = r.Epoch
	st.ValidMs = clampU32(r.ValidUs / 1000)
	st.LowWater = clampU32(r.LowWater)
	// The reset is rounded down: the gateway adds it to its own clock (microseconds), and
	// a reset on a whole second (every window algorithm's) rounded up would cross into the
	// next second, so the header's reset would step back when the next reply lands exactly.
	st.ResetInMs = clampU32(max(r.ResetUs, 0) / 1000)
	st.RetryInMs = clampU32(ceilMs(r.RetryUs))
	st.PenaltyInMs = clampU32(ceilMs(r.PenaltyUs))
	st.PenaltyLevel = uint8(min(max(r.Level, 0), 255))
	st.ServerMs = uint64(max(r.NowUs, 0) / 1000)
	st.Rate, st.Stock = 0, 0
	if r.RateAnswer {
		st.Flags |= wire.StateRate
		st.Rate = clampU32(r.Rate)
		st.Stock = clampU32(r.Stock)
	}
}

func ceilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

func clampU32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }

// ParamsOf returns the algorithm parameters a delta carries.
func ParamsOf(d *wire.Delta) algo.Params {
	return algo.Params{Kind: algo.Kind(d.Algo), Limit: int64(d.Limit), WindowUs: int64(d.WindowMs) * 1000, Burst: int64(d.Burst)}
}

// windowed reports the algorithms whose buckets start afresh at window boundaries: a
// lease granted in one window means nothing in the next.
func windowed(p algo.Params) bool {
	return p.Kind.Windowed()
}

// epochClock places now in the lease epochs of p: the epoch index (mod 2^32), the index
// of the epoch within the current window (0 for continuous algorithms), and when the
// leases of this epoch stop being usable. Continuous algorithms use epochs of EpochMs
// from the Unix epoch. Window algorithms cut every window into epochs of at most
// EpochMs, counted from the window's start, so a window boundary is an epoch boundary;
// their leases end with the window. A calendar window's periods differ in length (28
// to 31 days): its epochs are numbered as if every period were the longest (WindowUs),
// from the period's index, so consecutive periods still have increasing epochs; an
// epoch never runs past the period's end.
func epochClock(p algo.Params, now int64, cfg *SyncConfig) (k uint32, j, start, length, validUntil int64) {
	e := cfg.EpochMs * 1000
	if p.Kind.CalendarPeriods() {
		wi, ws, we := algo.CalendarWindow(p, now)
		n := (algo.MaxWindowUs + e - 1) / e // e < one day, the shortest period
		j = (now - ws) / e
		return uint32((wi*n + j) % (1 << 32)), j, ws + j*e, e, min(ws+(j+2)*e, we)
	}
	if !windowed(p) || p.WindowUs <= 0 {
		q := now / e
		return uint32(q % (1 << 32)), 0, q * e, e, (q + 2) * e
	}
	w := p.WindowUs
	wi := now / w
	ws := wi * w
	el := min(e, w)
	n := (w + el - 1) / el // epochs per window
	j = (now - ws) / el
	return uint32((wi*n + j) % (1 << 32)), j, ws + j*el, el, min(ws+(j+2)*el, ws+w)
}

// advance moves the leases to the epoch of now and returns what it reclaimed: the
// previous epoch's leases when the epoch moved on by one (within one window), all of
// them otherwise. Epochs are indexes mod 2^32 compared as signed differences: a stored
// epoch ahead of now (the server clock stepped back across an epoch boundary) has not
// ended, so nothing moves; an empty record simply takes the current epoch.
func (l *Leases) advance(k uint32, j int64, win bool) (reclaimed int64) {
	d := int32(k - l.Epoch)
	switch {
	case d < 0 && !l.empty():
		return 0
	case d == 0:
	case d == 1 && !(win && j == 0):
		reclaimed = l.Prev
		l.Prev, l.Cur = l.Cur, 0
		l.DemandPrev, l.DemandCur = l.DemandCur, 0
		l.RatePrev, l.RateCur = l.RateCur, 0
	default:
		reclaimed = l.Cur + l.Prev
		l.Cur, l.Prev = 0, 0
		l.DemandCur, l.DemandPrev = 0, 0
		l.RateCur, l.RatePrev = 0, 0
	}
	l.Epoch = k
	return reclaimed
}

// Advance moves b's leases to the lease epoch of now for a bucket of parameters p, as
// the script does first on every call: the rate leases' accrual is charged to the state
// and what an ended epoch (or window) reserved stops counting. It returns what it
// reclaimed. Readers of a stored bucket (the usage API) call it so that they count what
// the script would, not what it last wrote.
func (b *Bucket) Advance(p algo.Params, now int64, cfg SyncConfig) int64 {
	cfg = cfg.Normalized()
	k, j, _, _, _ := epochClock(p, now, &cfg)
	reclaimed, _ := b.advance(p, now, k, j, &cfg)
	return reclaimed
}

// advance is Advance at the epoch k (j within its window): the rate leases accrued
// since the last call are charged first, at the rates of the epochs they were granted
// in (rate.go), then the epochs move on and the state is cut to what the stocks leave
// it. A bucket whose rule takes no rate lease any more (it changed) stops counting
// them: its gateways give them back at their first decision under the new rule. It
// returns what the epochs reclaimed and the time the accrual was charged to (-1: none).
func (b *Bucket) advance(p algo.Params, now int64, k uint32, j int64, cfg *SyncConfig) (reclaimed, accMs int64) {
	R, win := RateOf(p), windowed(p)
	var accrued, fromMs int64
	accMs = -1
	if !b.Leases.rateEmpty() {
		if R > 0 && !win {
			accrued, accMs, fromMs = b.Leases.accrue(k, now, cfg.EpochMs)
		} else {
			b.Leases.RateCur, b.Leases.RatePrev = 0, 0
		}
	}
	reclaimed = b.Leases.advance(k, j, win)
	if accrued > 0 {
		b.State = algo.Take(p, b.State, fromMs*1000, accrued)
	}
	b.State = capRates(p, b.State, now, R, b.Leases.RateCur+b.Leases.RatePrev)
	return reclaimed, accMs
}

// empty reports a record with nothing outstanding and no demand counted.
func (l *Leases) empty() bool {
	return l.Cur == 0 && l.Prev == 0 && l.DemandCur == 0 && l.DemandPrev == 0 && l.rateEmpty()
}

// slot returns the outstanding amount that leases of epoch e count in, or nil when
// they are no longer reserved (reclaimed, or of another window).
func (l *Leases) slot(e uint32, j int64, win bool) *int64 {
	switch {
	case e == 0:
		return nil
	case e == l.Epoch:
		return &l.Cur
	case e == l.Epoch-1 && !(win && j == 0):
		return &l.Prev
	}
	return nil
}

// NodeCap is what one gateway of a fleet may hold of a bucket of capacity capa, own
// being its record (SyncNode): a lease's share, ceil(capa/MaxShare), or what its reports
// were charged over its two epochs (own.DemandCur + own.DemandPrev), up to capa, when
// that is more. Forged demand that is charged nothing (refusal counts, Want, leases
// never reported) reserves at most the share; beyond it a gateway holds no more than it
// paid for, as permits taken from the key's bucket, in the last two epochs. The share
// alone held a gateway that carries a key's traffic to half of a small bucket while its
// spent leases waited for their report (a gcra of 100/s, burst 20, at 90 % of its limit
// through one gateway of four: 1,240 of 1,800 admitted, 1,259 without the per-gateway
// record; filter/nativehost TestNodeBoundsCostHonestFleetsNothing).
func NodeCap(capa int64, own *Leases, cfg SyncConfig) int64 {
	ms := cfg.Normalized().MaxShare
	share := (capa + ms - 1) / ms
	return max(share, min(own.DemandCur+own.DemandPrev, capa))
}

// pastWindow reports whether epoch e belongs to a window before the current one (the
// current window's epochs are k-j .. k). An epoch ahead of k (signed difference) is not
// of a past window.
func pastWindow(e, k uint32, j int64) bool {
	return e != 0 && int64(int32(k-e)) > j
}

// Sync applies delta d to bucket b and the key's penalty record pen at server time now
// (µs), following RATIONALE.md §2, without a record of the sending gateway's own leases
// (SyncNode with own nil: what one gateway holds is not bounded on its own). b and pen
// are updated in place.
func Sync(b *Bucket, pen *Penalty, d *wire.Delta, now int64, cfg SyncConfig) SyncResult {
	return SyncNode(b, pen, nil, d, now, cfg)
}

// SyncNode is Sync with own, the record of the sending gateway's own leases of the
// bucket (the same epochs and slots as b.Leases, for its leases alone; its DemandCur
// and DemandPrev count the permits its reports were charged, not demand): a gateway
// renews no more than it was granted, so a forged Held cannot take over another
// gateway's lease, and in a fleet (Nodes > 1) its leases outstanding stay within
// NodeCap: ceil(capacity/MaxShare), or what it was charged over its two epochs when that
// is more, so forged demand (Want, Rejected, a Held it does not report) cannot reserve
// more of a bucket than one lease may, and a gateway that carries a key's traffic holds
// what it uses (RATIONALE.md §3, "What one gateway can do"). It is the reference the
// Lua script is tested against.
func SyncNode(b *Bucket, pen *Penalty, own *Leases, d *wire.Delta, now int64, cfg SyncConfig) SyncResult {
	cfg = cfg.Normalized()
	p := ParamsOf(d)
	win := windowed(p)
	strict := d.Flags&(wire.FlagStrict|wire.FlagAcquire) != 0
	r := SyncResult{NowUs: now, Allowed: true}

	// 1. Epochs: leases of an ended epoch (or window) go back to the bucket. They were
	// never taken from the state, so nothing is refunded: they just stop counting.
	k, j, estart, elen, validUntil := epochClock(p, now, &cfg)
	// Rate leases accrued since the last call are charged first (Bucket.advance).
	R := RateOf(p)
	r.RateAnswer = d.Flags&wire.FlagRate != 0
	var accMs int64
	r.Reclaimed, accMs = b.advance(p, now, k, j, &cfg)
	st := b.State
	slot := b.Leases.slot(d.Epoch, j, win)
	var oslot, oother, bother *int64
	if own != nil {
		own.advance(k, j, win)
		oslot = own.slot(d.Epoch, j, win)
		// The gateway's other live epoch, in its record and in the bucket's: one record
		// at a gateway can hold leases of both (an acquire's of the epoch before and a
		// renewal's of this one, reported under the renewal's epoch), and what it
		// reports is taken from where its own record counts it.
		if oslot != nil {
			e := d.Epoch + 1
			if oslot == &own.Cur {
				e = d.Epoch - 1
			}
			oother, bother = own.slot(e, j, win), b.Leases.slot(e, j, win)
		}
	}
	owned := func() int64 { // what the gateway's own slot still counts (no record: no bound)
		if own == nil {
			return maxHeld
		}
		if oslot == nil {
			return 0
		}
		return *oslot
	}
	osub := func(x int64) {
		if oslot != nil {
			*oslot -= min(x, *oslot)
		}
	}
	otake := func(x int64) { // osub, then what is left of x from its other live epoch
		if oslot != nil {
			t := min(x, *oslot)
			*oslot -= t
			if oother != nil {
				*oother -= min(x-t, *oother)
			}
		}
	}

	// 2. Consumption, charged now. What a lease covered stops being outstanding as it
	// is charged, so it changes nothing for the other gateways. A fixed (or calendar)
	// window's lease of an earlier window was counted in that window: its consumption is
	// not charged to this one.
	avail0 := algo.Available(p, st, now) - b.Leases.Outstanding()
	leased, over := int64(d.Leased), int64(d.Over)
	var covered int64
	if slot != nil {
		covered = min(leased, *slot)
		*slot -= covered
	}
	otake(leased)
	uncovered := leased - covered
	if p.Kind.ResetsAtBoundary() && pastWindow(d.Epoch, k, j) {
		uncovered = 0
	}
	if !strict {
		uncovered += over
	}
	if uncovered > 0 {
		r.Overshoot = max(0, uncovered-max(avail0, 0))
		if d.Flags&wire.FlagDegraded != 0 {
			uncovered -= r.Overshoot // forgive what an outage admitted beyond the bucket
		}
		// No more than the rule could admit over the period the delta reports.
		if bound := ReportBound(p, int64(d.ElapsedMs)); uncovered > bound {
			r.Excess = uncovered - bound
			uncovered = bound
		}
		// Debt is capped at one capacity (one window of the steady rate).
		if limit := max(avail0+p.Capacity(), 0); uncovered > limit {
			r.Clamped = uncovered - limit
			uncovered = limit
		}
	}
	charged := covered + uncovered // what this gateway's report is charged (NodeCap)
	if charged > 0 {
		st = algo.Take(p, st, now, charged)
	}

	// 3. Penalty before the grant: a key that ignores Retry-After gets no new lease. An
	// early request is one refused because the bucket was spent: the claim counts only
	// while the bucket is spent here, once what this report says was consumed is charged.
	// Leases still out do not count: a gateway whose lease ran dry while others hold
	// unused permits refused a caller who is within the limit, not early.
	// With a fleet, a claim steps the level only while the level is below the number of
	// distinct gateways that claimed, less one: an early request is the gateway's word
	// (only it told the caller its Retry-After), and one gateway's word alone, a forged
	// report included, does not penalize a key that other gateways serve.
	decayPenalty(pen, now, cfg)
	if d.Early > 0 && algo.Available(p, st, now) < 1 {
		claimants := pen.claim(cfg.Claimant, now)
		if (cfg.Nodes <= 1 || pen.Level < claimants-1) && (pen.Level == 0 || now-pen.LastUs >= cfg.PenaltyBaseUs) {
			if penaltyCooldown(pen.Level, cfg) < cfg.PenaltyMaxUs && pen.Level < maxPenaltyLvl {
				pen.Level++
			}
			pen.UntilUs = max(pen.UntilUs, now+penaltyCooldown(pen.Level, cfg))
			pen.LastUs = now
		}
		// The claimant's own cooldown (one gateway's at a time), which only the answers
		// to it carry: a lone gateway still penalizes the callers that ignore its
		// Retry-After, and harms only its own traffic.
		tag := tagHex(cfg.Claimant)
		if cfg.Nodes > 1 && (pen.Owner == "" || pen.Owner == tag) && (pen.OwnLevel == 0 || now-pen.OwnLastUs >= cfg.PenaltyBaseUs) {
			pen.Owner = tag
			if penaltyCooldown(pen.OwnLevel, cfg) < cfg.PenaltyMaxUs && pen.OwnLevel < maxPenaltyLvl {
				pen.OwnLevel++
			}
			pen.OwnUntilUs = max(pen.OwnUntilUs, now+penaltyCooldown(pen.OwnLevel, cfg))
			pen.OwnLastUs = now
		}
	}
	// What this gateway's answer carries: the key's cooldown, and its own when it owns one.
	eff := *pen
	if pen.Owner != "" && pen.Owner == tagHex(cfg.Claimant) {
		eff.Level, eff.UntilUs = max(pen.Level, pen.OwnLevel), max(pen.UntilUs, pen.OwnUntilUs)
	}
	penalized := eff.UntilUs > now
	if strict && over > 0 {
		if penalized {
			r.Allowed = false
		} else {
			eff := algo.Take(p, st, now, b.Leases.Outstanding())
			r.Allowed = algo.Decide(p, eff, now, over).Allowed
			if r.Allowed {
				st = algo.Take(p, st, now, over)
				charged += over
			}
		}
	}

	if own != nil && cfg.Nodes > 1 && d.Flags&(wire.FlagStrict|FlagNoLease) == 0 {
		// Only where NodeCap can apply: in a fleet, on a delta that may be granted a
		// lease (strict checks and the service's lease-less paths write no record).
		own.DemandCur = min(own.DemandCur+charged, maxDemand)
	}

	// 4. Returned lease stops counting; the lease the gateway keeps is renewed (moved to
	// this epoch), as far as the bucket can still back it: when the leases outstanding
	// exceed what the bucket holds (its rule's limit was lowered, or consumption beyond
	// every lease put it into debt), the renewal gives up the difference, so a lowered
	// limit caps the leases out at each gateway's next report.
	otake(int64(d.Returned))
	if slot != nil {
		*slot -= min(int64(d.Returned), *slot)
		h := min(int64(d.Held), *slot, owned()) // no more than this gateway was granted
		*slot -= h
		osub(h)
		if oother != nil && bother != nil {
			// The rest of what it holds from its other live epoch, as its own record
			// counts it there (held to the epoch its report names, a gateway lost one
			// or two permits of a small bucket at each epoch boundary and the bucket
			// kept them reserved: a gcra of 100/s, burst 20, over four gateways at 90 %
			// of its limit admitted 0.3-1.1 % fewer than without the record).
			h2 := min(int64(d.Held)-h, *oother, *bother)
			*oother -= h2
			*bother -= h2
			h += h2
		}
		if short := b.Leases.Outstanding() + h - max(algo.Available(p, st, now), 0); short > 0 {
			h -= min(h, short)
		}
		r.Held = h
		b.Leases.Cur += h
		if own != nil {
			own.Cur += h
		}
	}
	// The rate lease the gateway held stops counting: it stopped accruing it when it cut
	// this report, and the grant below gives it its rate anew.
	// Its stock, within the released rate's cap, is what the new rate keeps (below).
	// With the gateway's own record, no more than it was granted (rclaim): a forged Rate
	// releases no other gateway's rate lease, nor counts as its own in the grant.
	var keep int64
	rclaim := int64(d.Rate)
	if r.RateAnswer {
		if own != nil {
			rclaim = 0
			if ors := own.rateSlot(d.RateEpoch, j, win); ors != nil {
				rclaim = min(int64(d.Rate), *ors)
				*ors -= rclaim
			}
		}
		if rs := b.Leases.rateSlot(d.RateEpoch, j, win); rs != nil {
			held := min(rclaim, *rs)
			*rs -= held
			keep = min(int64(d.RateStock), RateCap(p, held))
		}
	}

	// 5. Demand: the gateway's over the interval it reports, the bucket's over this
	// epoch and the previous one (both in milli-permits per second).
	count := leased + over + int64(d.Rejected)
	if r.RateAnswer {
		count += int64(d.RateUsed) // charged as it accrued: demand only
	}
	count = min(count, maxCount)
	elapsed := min(max(int64(d.ElapsedMs), cfg.MinElapsedMs), maxElapsedMs)
	rate := min(count*1_000_000/elapsed, maxRate)
	b.Leases.DemandCur = min(b.Leases.DemandCur+count, maxDemand)
	spanMs := max((now-estart+elen)/1000, 1) // ms the two epochs' counts span
	total := min((b.Leases.DemandCur+b.Leases.DemandPrev)*1_000_000/spanMs, maxRate)

	// 6. Grant: the gateway's demand over the horizon, at most its share of the
	// bucket's demand times the capacity (and 1/MaxShare of it; a gateway holding no
	// lease, its share of the fleet), and at most half of what is unreserved (all of it
	// when that is a single permit). An acquire's Want, the cost of the requests waiting
	// for it, is covered first, from all that is unreserved.
	if !penalized && d.Flags&(wire.FlagStrict|FlagNoLease) == 0 && (d.Flags&wire.FlagAcquire == 0 || r.Allowed) {
		capa := p.Capacity()
		dn, den := min(rate, total), max(total, 1)
		if den > maxShareDen {
			f := (den + maxShareDen - 1) / maxShareDen
			dn, den = dn/f, max(den/f, 1)
		}
		share := capa * dn / den
		target := min((rate*cfg.HorizonMs+999_999)/1_000_000, share, (capa+cfg.MaxShare-1)/cfg.MaxShare)
		acquire := d.Flags&wire.FlagAcquire != 0
		first := int64(-1) // the cap of a first lease (-1: none)
		// Only a gateway that never heard of the bucket: a hot key's gateway whose lease
		// ran dry also reports within MinElapsedMs of its last reply, and capping those
		// leases too handed a gcra bucket of burst 20 over four gateways a permit per
		// round trip (the adversarial simulation admitted 95 % of what a perfect bucket
		// would, against 98.8 % so).
		if cfg.Nodes > 1 && r.Held == 0 && d.ElapsedMs == 0 {
			first = capa / (FirstLeaseShare * cfg.Nodes)
			target = min(target, first)
		} else if cfg.Nodes > 1 && b.Leases.DemandCur+b.Leases.DemandPrev < capa {
			// A young bucket: the fleet asked it for less than its capacity over two
			// epochs, so the gateway's rate (over its last interval) against the
			// bucket's (over the epochs) compares a burst with a bucket barely used and
			// says nothing of the gateway's share: leases sized by it reserve the bucket
			// for the gateways that reported first, and the others' requests find it
			// reserved while it holds permits nobody uses. Beyond the acquire's Want, a
			// lease stays within a quarter of the fleet share, rounded up.
			target = min(target, (capa+FirstLeaseShare*cfg.Nodes-1)/(FirstLeaseShare*cfg.Nodes))
		}
		if rate > 0 && target < 1 && first != 0 {
			target = 1
		}
		demandTarget := target
		var want int64
		if acquire {
			want = int64(d.Want)
		}
		if want > 0 {
			// The gateway says what waits: that, not a guess from a burst's demand sample
			// (its next report sizes the lease by demand).
			target = r.Held + want
		}
		free := algo.Available(p, st, now) - b.Leases.Outstanding()
		avail := free
		if avail > 1 {
			avail /= 2
		}
		if cfg.Nodes > 1 {
			// In a fleet, leases by demand leave capacity/FleetLeaseKeep unreserved for
			// the acquires of gateways whose demand runs above their share (RATIONALE.md
			// §2, "Grants").
			avail = min(avail, capa-capa/FleetLeaseKeep-b.Leases.Outstanding())
		}
		avail = max(avail, min(want, free))
		g := min(target-r.Held, avail, maxHeld-r.Held)
		if own != nil && cfg.Nodes > 1 {
			// What one gateway holds in all (NodeCap). A lone gateway harms only its own
			// traffic.
			g = min(g, NodeCap(capa, own, cfg)-own.Outstanding())
		}
		if g > 0 {
			r.Grant = g
			b.Leases.Cur += g
			if own != nil {
				own.Cur += g
			}
		}
		// A rate lease, when the count cannot cover the gateway's demand (the bucket is
		// spent: a key at its limit) and the bucket is not a cold start's: the gateway's
		// share of the refill by demand, within what the stocks may reserve beside the
		// counts out (ceil(C·Σrate/R) ≤ C − outstanding), what it held and half of the
		// rest at most when other gateways share the bucket (RATIONALE.md §3).
		// Only for a key asked for its whole refill or more: by this gateway alone, or
		// by the fleet over the epochs (95 % of R: the estimate spans whole epochs). A
		// key below its limit keeps counts: rates split its capacity into the gateways'
		// stocks, and a burst on one gateway would be refused while the others' stocks
		// hold permits (the fleet simulation's client at 90 % of its limit saw 12-20 %
		// false rejections with rates granted below the limit).
		// Only with RateLeases (off in the service).
		if cfg.RateLeases && r.RateAnswer && R > 0 && capa > 0 && r.Held+r.Grant < demandTarget && first < 0 &&
			(cfg.Nodes <= 1 || rate >= R || total*100 >= R*95) &&
			(cfg.Nodes <= 1 || b.Leases.DemandCur+b.Leases.DemandPrev >= capa) {
			// The stocks' share of the capacity, C·Σrate/R, stays within what the counts
			// out and the bucket's debt leave: a debt of d permits beyond the first leaves
			// the state a net refill of R·(d−1)/C to repay it. The first is rounding: the
			// accrual is charged to the millisecond rounded up, and a state a fraction of a
			// permit short reads as one permit owed.
			// Its share of the bucket's demand (all of it alone): not its own demand,
			// which at the limit is the refill give or take its noise (a client paced at
			// its limit lost a fifth of its requests to leases sized by it).
			wantR := R * dn / den
			if cfg.Nodes <= 1 {
				wantR = R
			}
			a := algo.Available(p, st, now)
			room := max(capa-b.Leases.Outstanding()-max(-a-1, 0), 0)*R/capa - (b.Leases.RateCur + b.Leases.RatePrev)
			availR := room
			if held := min(rclaim, room); cfg.Nodes > 1 && room > 1 {
				availR = max(held+(room-held)/2, room/2) // its own and half of the rest
			}
			// At least the rate whose cap covers the stock the gateway keeps, where the
			// room allows (it did for the rate released, unless counts or a debt grew).
			gr := max(min(wantR, availR), min((keep*R+capa-1)/capa, max(room, 0)))
			if gr >= MinRate && RateCap(p, gr) >= 1 {
				r.Rate = gr
				b.Leases.RateCur += gr
				if own != nil {
					// Not capped per gateway as its counts are (ceil(capacity/MaxShare)):
					// the grant above already keeps a fleet's gateway to its own rate and
					// half of the rest (RATIONALE.md §3, "What one gateway can do").
					own.RateCur += gr
				}
				// What the state holds beyond C − Σ stocks (never a count out: the room
				// above) moves into this lease's stock, beside what it keeps, at most its
				// cap: nothing is lost to the cap, and the state's permits reach the
				// gateways.
				keep = min(keep, RateCap(p, gr))
				st = capRates(p, st, now, R, b.Leases.RateCur+b.Leases.RatePrev)
				r.Stock = min(keep+max(max(a, 0)-max(algo.Available(p, st, now), 0), 0), RateCap(p, gr))
			}
		}
	}
	if b.Leases.rateEmpty() {
		b.Leases.AccOff, b.Leases.AccFrac = 0, 0
	} else {
		if nowMs := ceilDiv(now, 1000); accMs < nowMs {
			accMs = nowMs
		}
		b.Leases.AccOff = max(accMs-b.Leases.epochStartMs(k, now, cfg.EpochMs), 0)
	}
	r.LowWater = min((rate*cfg.RenewMs+999_999)/1_000_000, (r.Held+r.Grant)/2)
	r.Epoch = b.Leases.Epoch // k, unless the stored epoch is ahead: the lease is kept there
	if r.Held+r.Grant > 0 || r.Rate > 0 {
		margin := min(cfg.ValidMarginMs*1000, min(cfg.EpochMs*1000, max(p.WindowUs, 1))/10)
		r.ValidUs = max(validUntil-now-margin, 0)
	}
	b.State = st

	// 7. Reply: the state as the other gateways see it, every lease counted as taken.
	finish(&r, p, st, b.Leases.Outstanding(), now, &eff, strict && !r.Allowed, over)
	return r
}

// finish fills the reply fields derived from the state at now.
func finish(r *SyncResult, p algo.Params, st algo.State, outstanding, now int64, pen *Penalty, refused bool, over int64) {
	eff := algo.Take(p, st, now, outstanding)
	r.Remaining = algo.Available(p, eff, now)
	// The reset is the charged state's: outstanding leases counted as taken at now would
	// move it later on every call and back when they are returned unused, so a client
	// refused again and again would see it jump about with nothing consumed. Retry times
	// and Remaining count every lease.
	r.ResetUs = max(algo.ResetAt(p, st, now)-now, 0)
	cost := int64(1)
	if refused && over > 1 {
		cost = over
	}
	r.RetryUs = max(algo.RetryAfter(p, eff, now, cost), 0)
	r.PenaltyUs = max(pen.UntilUs-now, 0)
	r.Level = pen.Level
}

// TTLUs is how long the bucket's Redis key must live after a call at now: until the
// bucket is full again with every lease counted, at least two windows and two epochs.
// A calendar window's key lives until its period ends plus two epochs: the boundary
// resets the count, the leases and the demand, so nothing in the key counts after it
// (the two epochs cover a server clock stepping back across the boundary), and a
// daily quota's key does not outlive its day by a month.
func TTLUs(b *Bucket, d *wire.Delta, now int64, cfg SyncConfig) int64 {
	cfg = cfg.Normalized()
	p := ParamsOf(d)
	eff := algo.Take(p, b.State, now, b.Leases.Outstanding())
	if p.Kind.CalendarPeriods() {
		return algo.ResetAt(p, eff, now) - now + 2*cfg.EpochMs*1000
	}
	return max(2*p.WindowUs, algo.ResetAt(p, eff, now)-now+p.WindowUs, 2*cfg.EpochMs*1000)
}

// decayPenalty forgives a key that stayed calm for PenaltyMaxUs after its cooldown,
// and forgets the claimants of a key at level 0 PenaltyMaxUs after the last claim.
func decayPenalty(pen *Penalty, now int64, cfg SyncConfig) {
	if (pen.Level > 0 && now-pen.UntilUs >= cfg.PenaltyMaxUs) ||
		(pen.Level == 0 && pen.Nodes != "" && now-pen.LastUs >= cfg.PenaltyMaxUs) {
		pen.Level, pen.UntilUs, pen.LastUs, pen.Nodes = 0, 0, 0, ""
	}
	if pen.Owner != "" && now-pen.OwnUntilUs >= cfg.PenaltyMaxUs {
		pen.Owner, pen.OwnLevel, pen.OwnUntilUs, pen.OwnLastUs = "", 0, 0, 0
	}
}

// penaltyCooldown is base·2^(level-1) capped at max (0 at level 0).
func penaltyCooldown(level int64, cfg SyncConfig) int64 {
	if level <= 0 {
		return 0
	}
	c := cfg.PenaltyBaseUs
	for i := int64(1); i < level && c < cfg.PenaltyMaxUs; i++ {
		c *= 2
	}
	return min(c, cfg.PenaltyMaxUs)
}

// FlagNoLease, in a delta's flags, asks Sync for no grant. It is above every wire flag,
// so only the service sets it (for gateways on the previous protocol, which cannot hold a
// lease).
const FlagNoLease = 0x80

// leaseTag starts a bucket value that carries leases (algorithm states start with
// 0x10-0x15, or are empty); rateTag one that also carries rate leases.
const (
	leaseTag = 0x21
	rateTag  = 0x22
)

// AppendValue encodes b as the Redis string the Lua script writes: the algorithm state
// alone when no lease is outstanding and no demand counted; otherwise leaseTag, uvarint
// Epoch, Cur, Prev, DemandCur and DemandPrev, then the state; with rate leases out,
// rateTag and the same followed by RateCur, RatePrev, AccOff and AccFrac.
func (b *Bucket) AppendValue(dst []byte) []byte {
	l := &b.Leases
	if l.empty() {
		return append(dst, b.State...)
	}
	vals := [...]int64{l.Cur, l.Prev, l.DemandCur, l.DemandPrev, l.RateCur, l.RatePrev, l.AccOff, l.AccFrac}
	n := 4
	tag := byte(leaseTag)
	if !l.rateEmpty() {
		n, tag = 8, rateTag
	}
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(l.Epoch))
	for _, v := range vals[:n] {
		dst = binary.AppendUvarint(dst, uint64(max(v, 0)))
	}
	return append(dst, b.State...)
}

// ParseValue decodes a bucket value. A malformed lease header reads as no leases and a
// fresh state, as a malformed algorithm state does (a corrupt record costs at most one
// bucket's worth of permits, never an error).
func ParseValue(v []byte) Bucket {
	if len(v) == 0 || (v[0] != leaseTag && v[0] != rateTag) {
		return Bucket{State: algo.State(v)}
	}
	var b Bucket
	i := 1
	var vals [9]uint64
	n := 5
	if v[0] == rateTag {
		n = 9
	}
	for k := range vals[:n] {
		x, w := binary.Uvarint(v[i:])
		if w <= 0 || w > 8 || (k == 0 && x > 1<<32-1) || x > 1<<40 {
			return Bucket{}
		}
		vals[k] = x
		i += w
	}
	b.Leases = Leases{Epoch: uint32(vals[0]), Cur: int64(vals[1]), Prev: int64(vals[2]),
		DemandCur: int64(vals[3]), DemandPrev: int64(vals[4]),
		RateCur: int64(vals[5]), RatePrev: int64(vals[6]), AccOff: int64(vals[7]), AccFrac: int64(vals[8])}
	b.State = algo.State(v[i:])
	return b
}

// Fields encodes the penalty record as its hash fields (empty when level 0, no
// cooldown and no claimant: the script deletes the key then).
func (p *Penalty) Fields() map[string]string {
	if p.Level == 0 && p.UntilUs == 0 && p.Nodes == "" && p.Owner == "" {
		return map[string]string{}
	}
	f := map[string]string{
		"l": strconv.FormatInt(p.Level, 10),
		"u": strconv.FormatInt(p.UntilUs, 10),
		"t": strconv.FormatInt(p.LastUs, 10),
	}
	if p.Nodes != "" {
		f["n"] = p.Nodes
	}
	if p.Owner != "" {
		f["o"] = p.Owner
		f["ol"] = strconv.FormatInt(p.OwnLevel, 10)
		f["ou"] = strconv.FormatInt(p.OwnUntilUs, 10)
		f["ot"] = strconv.FormatInt(p.OwnLastUs, 10)
	}
	return f
}

// ParsePenalty decodes a penalty hash; missing fields are zero.
func ParsePenalty(fields map[string]string) Penalty {
	get := func(k string) int64 {
		n, _ := strconv.ParseInt(fields[k], 10, 64)
		return n
	}
	return Penalty{Level: get("l"), UntilUs: get("u"), LastUs: get("t"), Nodes: fields["n"],
		Owner: fields["o"], OwnLevel: get("ol"), OwnUntilUs: get("ou"), OwnLastUs: get("ot")}
}
