package lease

// This file is the Go twin of the sync service's lease script
// (ratelimit/store/scripts/lease.lua). The service runs the Lua inside Redis; this code
// exists so the protocol can be reasoned about, property-tested and simulated natively,
// and the service tests check that both produce the same outputs and the same stored
// fields, step by step, on random delta sequences (RATIONALE.md §2).
//
// Arithmetic is integer-only and every intermediate value stays below 2^53, so Lua's
// doubles compute exactly what Go's int64 computes:
//
//   - Demand is an EWMA in integer milli-permits per second. With tau = min(horizon, 1 s)
//     and e = µs since the node's previous sync,
//     d' = floor((d·tau + count·10^9) / (tau + e)),
//     which is the time-weighted EWMA of the sample count/e (count·10^9/e milli-permits/s)
//     without ever dividing by e, so a sync 0 µs after the previous one is harmless.
//     count is clamped to 2^22 per delta and d to 2^31 (2 million permits/s per node per
//     bucket), which keeps d·tau + count·10^9 < 6.4·10^15 < 2^53. A node's first sample
//     is count over one sync interval (horizon/2).
//   - The fair share floor(pool·d_n/Σd) scales d_n and Σd down by a common factor until
//     Σd ≤ 2^20 and caps pool at 2^32, so the product stays below 2^52.
//   - Floor division of non-negative integers: Go's / here, an exact corrected
//     floor(a/b) in Lua (a double quotient alone can round up across an integer).

import (
	"sort"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// SyncConfig holds the service-side lease settings (flags of tollgate-ratelimit).
type SyncConfig struct {
	// LeaseTTLUs: a node that has not synced a bucket for this long loses its lease to
	// the pool (lease_ttl_service, default 3 s; must exceed the node's lease TTL plus the
	// worst callout latency).
	LeaseTTLUs int64
	// HorizonMs: leases aim at this much of a node's demand (two sync intervals,
	// default 200 ms). Whole milliseconds keep d·horizon exact.
	HorizonMs int64
	// PenaltyBaseUs is the first progressive-penalty cooldown; each further early
	// request (at most one step per PenaltyBaseUs) doubles it up to PenaltyMaxUs. A key
	// that stays calm for PenaltyMaxUs after its cooldown ends starts over at level 0.
	PenaltyBaseUs int64
	PenaltyMaxUs  int64
}

// DefaultSyncConfig is the service's default configuration.
var DefaultSyncConfig = SyncConfig{LeaseTTLUs: 3_000_000, HorizonMs: 200, PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 60_000_000}

// Normalized returns c with out-of-range values replaced so the integer bounds above hold.
func (c SyncConfig) Normalized() SyncConfig {
	if c.LeaseTTLUs <= 0 {
		c.LeaseTTLUs = DefaultSyncConfig.LeaseTTLUs
	}
	if c.HorizonMs <= 0 {
		c.HorizonMs = DefaultSyncConfig.HorizonMs
	}
	c.HorizonMs = min(c.HorizonMs, MaxHorizonMs)
	if c.PenaltyBaseUs <= 0 {
		c.PenaltyBaseUs = DefaultSyncConfig.PenaltyBaseUs
	}
	if c.PenaltyMaxUs < c.PenaltyBaseUs {
		c.PenaltyMaxUs = c.PenaltyBaseUs
	}
	return c
}

// Bounds of the integer arithmetic (see the file comment).
const (
	MaxHorizonMs  = 60_000
	maxCount      = 1 << 22
	maxDemand     = 1 << 31
	maxShareDen   = 1 << 20
	maxPool       = 1 << 32
	maxHeld       = 1<<32 - 1 // LeaseHeld is a uint32 on the wire
	maxElapsedUs  = 60_000_000
	maxTauUs      = 1_000_000
	milliPerSecUs = 1_000_000_000 // count·10^9/µs = milli-permits per second
	maxPenaltyLvl = 62
)

// NodeLease is one gateway's share of a bucket (fields o:, d:, s:).
type NodeLease struct {
	Outstanding int64 // o: lease reserved for the node, not yet reported consumed
	Demand      int64 // d: EWMA of what it asked for, milli-permits per second
	LastSyncUs  int64 // s: server time of its last sync of this bucket
}

// Applied records the last batch a (node, worker) applied to a bucket (fields q:, g:).
// Grant is the lease that batch granted, or for a FlagStrict delta (which never gets a
// lease) 1 when its Over was allowed and 0 when refused, so a replay answers the same.
type Applied struct {
	Seq   uint64
	Grant int64
}

// WorkerID names a node's worker in Bucket.Applied.
type WorkerID struct {
	Node   string
	Worker uint32
}

// Bucket is the global record of one (caller key, rule, window): the Redis hash
// rl:{key}:rule:window.
type Bucket struct {
	// Params are those of the last delta applied ("p"); a change of algorithm discards
	// State, whose encoding is the algorithm's own.
	Params  algo.Params
	State   algo.State // "st"
	Nodes   map[string]*NodeLease
	Applied map[WorkerID]Applied
	// SweepUs ("sw") is the earliest time any node's lease can have expired: the
	// smallest LastSyncUs + LeaseTTLUs when the nodes were last swept (syncs since only
	// move LastSyncUs forward). Sync looks at every node only when now passes it, which
	// reclaims exactly what checking every node on every call would.
	SweepUs int64
}

// Penalty is a caller key's progressive-penalty record (the hash rl:{key}:penalty).
type Penalty struct {
	Level   int64 // "l"
	UntilUs int64 // "u": cooldown end
	LastUs  int64 // "t": when the level last grew
}

// SyncResult is what the script returns for one delta. Durations are from now.
type SyncResult struct {
	Replay    bool // seq not newer than the last applied: nothing was changed
	Allowed   bool // FlagStrict: Over was taken; otherwise true
	Remaining int64
	Grant     int64 // lease granted by this (or, on replay, the original) delta
	Held      int64 // node's outstanding lease after the delta
	ResetUs   int64
	RetryUs   int64
	PenaltyUs int64
	Level     int64
	// Overshoot is the part of this delta's unconditional charge that exceeded what the
	// bucket held: admitted while the bucket was (or went) into debt.
	Overshoot int64
	// Reclaimed is lease taken back from expired nodes by this call.
	Reclaimed int64
}

// Fill writes r into the wire State a gateway receives. Durations round up to
// milliseconds so gateways reset late rather than early (RATIONALE.md §4).
func (r *SyncResult) Fill(st *wire.State) {
	st.Allowed = r.Allowed
	st.Remaining = r.Remaining
	st.Lease = clampU32(r.Grant)
	st.LeaseHeld = clampU32(r.Held)
	st.ResetInMs = clampU32(ceilMs(r.ResetUs))
	st.RetryInMs = clampU32(ceilMs(r.RetryUs))
	st.PenaltyInMs = clampU32(ceilMs(r.PenaltyUs))
	st.PenaltyLevel = uint8(min(max(r.Level, 0), 255))
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

// Sync applies delta d, sent by (node, worker) in batch seq, to bucket b and the key's
// penalty record pen at server time now (µs), following RATIONALE.md §2 steps 1-7. b and
// pen are updated in place (a nil map is created). It is the reference the Lua script is
// tested against.
func Sync(b *Bucket, pen *Penalty, node string, worker uint32, seq uint64, d *wire.Delta, now int64, cfg SyncConfig) SyncResult {
	cfg = cfg.Normalized()
	p := ParamsOf(d)
	strict := d.Flags&wire.FlagStrict != 0
	wid := WorkerID{node, worker}
	st := b.State
	if b.Params.WindowUs != 0 && b.Params.Kind != p.Kind {
		st = nil
	}

	if a, ok := b.Applied[wid]; ok && seq <= a.Seq {
		// Replay: answer from the current state without writing anything, with the grant
		// (or strict verdict) the original gave.
		var r SyncResult
		r.Replay = true
		r.Allowed = true
		if strict {
			r.Allowed = a.Grant == 1
		} else {
			r.Grant = a.Grant
		}
		if n := b.Nodes[node]; n != nil {
			r.Held = n.Outstanding
		}
		pv := *pen
		decayPenalty(&pv, now, cfg)
		finish(&r, p, st, now, &pv, strict && !r.Allowed, int64(d.Over))
		return r
	}

	if b.Nodes == nil {
		b.Nodes = map[string]*NodeLease{}
	}
	if b.Applied == nil {
		b.Applied = map[WorkerID]Applied{}
	}
	var r SyncResult

	// 2. Reclaim expired leases (one refund of the sum: algorithms cap refunds, so
	// refunding node by node could depend on map order).
	swept := now > b.SweepUs
	if swept {
		for m, nl := range b.Nodes {
			if now-nl.LastSyncUs > cfg.LeaseTTLUs {
				r.Reclaimed += nl.Outstanding
				delete(b.Nodes, m)
				for w := range b.Applied {
					if w.Node == m {
						delete(b.Applied, w)
					}
				}
			}
		}
	}
	if r.Reclaimed > 0 {
		st = algo.Refund(p, st, now, r.Reclaimed)
	}

	nl := b.Nodes[node]
	isNew := nl == nil
	if isNew {
		nl = &NodeLease{}
		b.Nodes[node] = nl
	}
	leased, over, returned := int64(d.Leased), int64(d.Over), int64(d.Returned)

	// Penalty before the grant: a key that ignores Retry-After gets no new lease.
	decayPenalty(pen, now, cfg)
	if d.Early > 0 && (pen.Level == 0 || now-pen.LastUs >= cfg.PenaltyBaseUs) {
		if penaltyCooldown(pen.Level, cfg) < cfg.PenaltyMaxUs && pen.Level < maxPenaltyLvl {
			pen.Level++
		}
		pen.UntilUs = max(pen.UntilUs, now+penaltyCooldown(pen.Level, cfg))
		pen.LastUs = now
	}
	penalized := pen.UntilUs > now

	// 3. Consumption: what the lease covers was reserved already; the rest is charged
	// unconditionally (debt is over-admission that really happened).
	covered := min(leased, nl.Outstanding)
	nl.Outstanding -= covered
	charge := leased - covered
	if !strict {
		charge += over
	}
	if charge > 0 {
		avail := algo.Available(p, st, now)
		r.Overshoot = max(0, charge-max(avail, 0))
		if d.Flags&wire.FlagDegraded != 0 {
			charge -= r.Overshoot // forgive what the outage admitted beyond the bucket
		}
		if charge > 0 {
			st = algo.Take(p, st, now, charge)
		}
	}
	r.Allowed = true
	if strict && over > 0 {
		if penalized {
			r.Allowed = false
		} else {
			res := algo.Decide(p, st, now, over)
			r.Allowed = res.Allowed
			st = res.State
		}
	}

	// 4. Returned lease goes back to the pool.
	if ret := min(returned, nl.Outstanding); ret > 0 {
		nl.Outstanding -= ret
		st = algo.Refund(p, st, now, ret)
	}

	// 5. Demand.
	count := min(int64(d.Leased)+int64(d.Over)+int64(d.Rejected), maxCount)
	if isNew {
		nl.Demand = count * milliPerSecUs / max(cfg.HorizonMs*500, 1)
	} else {
		tau := min(cfg.HorizonMs*1000, maxTauUs)
		e := min(max(now-nl.LastSyncUs, 0), maxElapsedUs)
		nl.Demand = (nl.Demand*tau + count*milliPerSecUs) / (tau + e)
	}
	nl.Demand = min(nl.Demand, maxDemand)
	nl.LastSyncUs = now
	if swept {
		first := now
		for m, l := range b.Nodes {
			if m != node && l.LastSyncUs < first {
				first = l.LastSyncUs
			}
		}
		b.SweepUs = first + cfg.LeaseTTLUs
	}

	// 6. Grant.
	if !strict && !penalized {
		var pool, sum int64
		for _, m := range b.Nodes {
			pool += m.Outstanding
			sum += m.Demand
		}
		avail := algo.Available(p, st, now)
		pool += avail
		need := (nl.Demand*cfg.HorizonMs + 999_999) / 1_000_000
		var share int64
		if pool > 0 && sum > 0 {
			dn, den := nl.Demand, sum
			if den > maxShareDen {
				k := (den + maxShareDen - 1) / maxShareDen
				dn, den = dn/k, den/k
			}
			share = min(pool, maxPool) * dn / den
		}
		target := min(need, share)
		if nl.Demand > 0 && pool >= 1 && target < 1 {
			target = 1
		}
		grant := min(max(target-nl.Outstanding, 0), max(avail, 0), maxHeld-nl.Outstanding)
		if grant > 0 {
			st = algo.Take(p, st, now, grant)
			nl.Outstanding += grant
			r.Grant = grant
		}
	}
	r.Held = nl.Outstanding

	g := r.Grant
	if strict {
		g = 0
		if r.Allowed {
			g = 1
		}
	}
	b.Applied[wid] = Applied{Seq: seq, Grant: g}
	b.Params = p
	b.State = st

	// 7. Reply.
	finish(&r, p, st, now, pen, strict && !r.Allowed, over)
	return r
}

// finish fills the reply fields derived from the state at now.
func finish(r *SyncResult, p algo.Params, st algo.State, now int64, pen *Penalty, refused bool, over int64) {
	r.Remaining = algo.Available(p, st, now)
	r.ResetUs = max(algo.ResetAt(p, st, now)-now, 0)
	cost := int64(1)
	if refused && over > 1 {
		cost = over
	}
	r.RetryUs = max(algo.RetryAfter(p, st, now, cost), 0)
	r.PenaltyUs = max(pen.UntilUs-now, 0)
	r.Level = pen.Level
}

// decayPenalty forgives a key that stayed calm for PenaltyMaxUs after its cooldown.
func decayPenalty(pen *Penalty, now int64, cfg SyncConfig) {
	if pen.Level > 0 && now-pen.UntilUs >= cfg.PenaltyMaxUs {
		*pen = Penalty{}
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

// Outstanding is Σ o over all nodes.
func (b *Bucket) Outstanding() int64 {
	var s int64
	for _, n := range b.Nodes {
		s += n.Outstanding
	}
	return s
}

// Hash field names of a Bucket (the Redis layout, RATIONALE.md §5).
const (
	FieldState  = "st"
	FieldParams = "p"
	// FieldTotalOut and FieldTotalDemand are Σ o and Σ d over all nodes, and
	// FieldSweep the next expiry sweep (see Bucket.SweepUs): with them the script reads
	// its own node's fields and its own worker record, not the whole fleet's.
	FieldTotalOut    = "to"
	FieldTotalDemand = "td"
	FieldSweep       = "sw"
)

// Fields encodes b as the Redis hash fields the Lua script writes (decimal integers;
// params as "kind:limit:window_us:burst"; the node index).
func (b *Bucket) Fields() map[string]string {
	m := make(map[string]string, 3+3*len(b.Nodes)+2*len(b.Applied))
	if b.Params.WindowUs != 0 {
		m[FieldParams] = FormatParams(b.Params)
		m[FieldState] = string(b.State)
	}
	if b.Params.WindowUs != 0 {
		var to, td int64
		for _, l := range b.Nodes {
			to += l.Outstanding
			td += l.Demand
		}
		m[FieldTotalOut] = strconv.FormatInt(to, 10)
		m[FieldTotalDemand] = strconv.FormatInt(td, 10)
		m[FieldSweep] = strconv.FormatInt(b.SweepUs, 10)
	}
	for n, l := range b.Nodes {
		m["o:"+n] = strconv.FormatInt(l.Outstanding, 10)
		m["d:"+n] = strconv.FormatInt(l.Demand, 10)
		m["s:"+n] = strconv.FormatInt(l.LastSyncUs, 10)
	}
	for w, a := range b.Applied {
		suffix := w.Node + ":" + strconv.FormatUint(uint64(w.Worker), 10)
		m["q:"+suffix] = strconv.FormatUint(a.Seq, 10)
		m["g:"+suffix] = strconv.FormatInt(a.Grant, 10)
	}
	return m
}

// FormatParams is the "p" field.
func FormatParams(p algo.Params) string {
	return strconv.Itoa(int(p.Kind)) + ":" + strconv.FormatInt(p.Limit, 10) + ":" +
		strconv.FormatInt(p.WindowUs, 10) + ":" + strconv.FormatInt(p.Burst, 10)
}

// ParseParams decodes the "p" field.
func ParseParams(s string) (algo.Params, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return algo.Params{}, false
	}
	var v [4]int64
	for i, x := range parts {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil || n < 0 {
			return algo.Params{}, false
		}
		v[i] = n
	}
	if v[0] > 255 {
		return algo.Params{}, false
	}
	return algo.Params{Kind: algo.Kind(v[0]), Limit: v[1], WindowUs: v[2], Burst: v[3]}, true
}

// ParseBucket decodes the fields of a bucket hash (as HGETALL returns them). Unknown or
// malformed fields are skipped and counted in ignored, so callers can notice them.
func ParseBucket(fields map[string]string) (b Bucket, ignored int) {
	b.Nodes = map[string]*NodeLease{}
	b.Applied = map[WorkerID]Applied{}
	node := func(n string) *NodeLease {
		l := b.Nodes[n]
		if l == nil {
			l = &NodeLease{}
			b.Nodes[n] = l
		}
		return l
	}
	// Deterministic order so "ignored" does not depend on map iteration.
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := fields[k]
		switch {
		case k == FieldState:
			b.State = algo.State(v)
		case k == FieldTotalOut || k == FieldTotalDemand:
			// Derived from the node fields; Fields recomputes them.
		case k == FieldSweep:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				ignored++
				continue
			}
			b.SweepUs = n
		case k == FieldParams:
			p, ok := ParseParams(v)
			if !ok {
				ignored++
				continue
			}
			b.Params = p
		case len(k) > 2 && k[1] == ':' && strings.IndexByte("ods", k[0]) >= 0:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				ignored++
				continue
			}
			l := node(k[2:])
			switch k[0] {
			case 'o':
				l.Outstanding = n
			case 'd':
				l.Demand = n
			case 's':
				l.LastSyncUs = n
			}
		case len(k) > 2 && k[1] == ':' && (k[0] == 'q' || k[0] == 'g'):
			i := strings.LastIndexByte(k, ':')
			w, err := strconv.ParseUint(k[i+1:], 10, 32)
			if i <= 2 || err != nil {
				ignored++
				continue
			}
			id := WorkerID{Node: k[2:i], Worker: uint32(w)}
			a := b.Applied[id]
			if k[0] == 'q' {
				a.Seq, err = strconv.ParseUint(v, 10, 64)
			} else {
				a.Grant, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil {
				ignored++
				continue
			}
			b.Applied[id] = a
		default:
			ignored++
		}
	}
	return b, ignored
}

// Fields encodes the penalty record as its hash fields (empty when level 0 and no
// cooldown: the script deletes the key then).
func (p *Penalty) Fields() map[string]string {
	if p.Level == 0 && p.UntilUs == 0 {
		return map[string]string{}
	}
	return map[string]string{
		"l": strconv.FormatInt(p.Level, 10),
		"u": strconv.FormatInt(p.UntilUs, 10),
		"t": strconv.FormatInt(p.LastUs, 10),
	}
}

// ParsePenalty decodes a penalty hash; missing fields are zero.
func ParsePenalty(fields map[string]string) Penalty {
	get := func(k string) int64 {
		n, _ := strconv.ParseInt(fields[k], 10, 64)
		return n
	}
	return Penalty{Level: get("l"), UntilUs: get("u"), LastUs: get("t")}
}
