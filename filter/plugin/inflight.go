package plugin

import (
	"encoding/binary"
	"strconv"
	"unsafe"

	"github.com/tollgate-rl/tollgate/shared/refusal"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// inflight counts the requests in flight of rules with max_in_flight (RATIONALE.md
// "Concurrency limits"), per rule and caller key, in Envoy shared data so that every
// worker VM of the gateway sees one count.
//
// A record lives in one of inflightSlots keys ("tg:f:<n>"), addressed like the bucket
// table (a hash of the id, linear probes): shared-data keys cannot be deleted, so a key
// per caller would grow without bound. The record holds one count per holder — the
// worker VM instance that took the slots — not one total: a VM that dies (Envoy
// restarts a VM that trapped, or a reload replaces it) never gives its slots back, and
// its count must be told from the others' to be dropped. Each VM beats a liveness entry
// in liveKey (on its tick, and before it takes a slot when the beat is due); a holder
// whose beat is older than holderStaleUs is dead, and its count is dropped the next
// time any worker takes a slot in that record.
type inflight struct {
	host Host
	// self is this VM instance's holder id: random per VM, so a restarted VM is a new
	// holder and the old one's counts are reclaimed.
	self   uint64
	fence  func() uint32 // the bucket table's fence CAS, for creating keys safely
	beatUs int64         // when this VM last wrote its beat (0: never)
	// live is the liveness table as last read; a beat only grows, so an entry fresh
	// here is fresh in shared data too, and a stale or missing one is read again before
	// a holder is declared dead unless the copy is newer than the record (liveGets ==
	// gets: no record was read since it).
	live     []liveEntry
	gets     uint64 // records read
	liveGets uint64 // gets when live was read
	holders  []holder
	keyBuf   []byte
	keyN     uint64
	valBuf   []byte
	liveBuf  []byte
	// pending holds releases that could not be written (shared data failing, CAS
	// contention beyond maxCASAttempts), retried on the tick.
	pending []pendingRelease
}

type pendingRelease struct {
	id string
	n  uint64
}

type holder struct {
	id uint64
	n  uint64
}

type liveEntry struct {
	id     uint64
	beatUs int64
}

const (
	inflightPrefix = "tg:f:"
	inflightSlots  = 1 << 14
	inflightProbes = 8
	liveKey        = "tg:live"
	// beatEveryUs is how often a VM refreshes its liveness entry; holderStaleUs is how
	// old a beat is when its VM counts as dead. A VM that dies stops beating, so its
	// slots block others at most holderStaleUs after its death; a live VM beats ten
	// times within it (a tick late or a slow host call does not make it dead).
	beatEveryUs   = 1_000_000
	holderStaleUs = 10_000_000
	// maxHolders bounds the holders a record is read with (a gateway has one per worker
	// VM alive in the last holderStaleUs); a longer record is not one this code wrote.
	maxHolders = 1024
	// maxPendingReleases bounds the releases kept for retry; beyond it a release is
	// lost (counted in inflight_failures) and its slot stays taken until this VM dies.
	maxPendingReleases = 4096
	// inflightRetryUs is the Retry-After of a concurrency refusal (before jitter): a slot
	// frees when any of the caller's requests ends, which no one can predict, so a
	// small value; the jitter spreads the retries.
	inflightRetryUs = 1_000_000
)

// takeResult is the outcome of taking a slot.
type takeResult uint8

const (
	taken  takeResult = iota
	full              // the key has limit slots in flight
	failed            // shared data failed, the table is full or CAS retries ran out
)

func (f *inflight) slotKey(n uint64) string {
	if len(f.keyBuf) == 0 || f.keyN != n {
		f.keyBuf = strconv.AppendUint(append(f.keyBuf[:0], inflightPrefix...), n, 10)
		f.keyN = n
	}
	return unsafe.String(unsafe.SliceData(f.keyBuf), len(f.keyBuf))
}

// appendInflightID appends the record id of a rule's key: distinct from bucket ids
// (which end in a window number) by its first byte.
func appendInflightID(dst []byte, key, ruleID string) []byte {
	dst = append(dst, 'f')
	dst = binary.AppendUvarint(dst, uint64(len(ruleID)))
	dst = append(dst, ruleID...)
	return append(dst, key...)
}

// Record value: uvarint id length, id, uvarint holder count, then per holder its 8-byte
// id (little endian) and uvarint count.

// recordID returns the id of a record value.
func recordID(v []byte) (id, rest []byte, ok bool) {
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return nil, nil, false
	}
	end := k + int(n)
	return v[k:end], v[end:], true
}

// readHolders decodes a record's holders into f.holders (no count is 0).
func (f *inflight) readHolders(rest []byte) bool {
	f.holders = f.holders[:0]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > maxHolders {
		return false
	}
	rest = rest[k:]
	for range n {
		if len(rest) < 8 {
			return false
		}
		id := binary.LittleEndian.Uint64(rest)
		c, k := binary.Uvarint(rest[8:])
		if k <= 0 {
			return false
		}
		rest = rest[8+k:]
		if c > 0 {
			f.holders = append(f.holders, holder{id: id, n: c})
		}
	}
	return len(rest) == 0
}

func (f *inflight) appendRecord(dst []byte, id string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(id)))
	dst = append(dst, id...)
	var n uint64
	for _, h := range f.holders {
		if h.n > 0 {
			n++
		}
	}
	dst = binary.AppendUvarint(dst, n)
	for _, h := range f.holders {
		if h.n > 0 {
			dst = binary.LittleEndian.AppendUint64(dst, h.id)
			dst = binary.AppendUvarint(dst, h.n)
		}
	}
	return dst
}

// dropDead removes the holders that are dead at now; it returns the slots they held
// and the total of the others.
func (f *inflight) dropDead(now int64) (dropped, total uint64) {
	k := 0
	for _, h := range f.holders {
		if !f.alive(h.id, now) {
			dropped += h.n
			continue
		}
		total += h.n
		f.holders[k] = h
		k++
	}
	f.holders = f.holders[:k]
	return dropped, total
}

// take takes a slot of record id if fewer than limit are in flight; it returns the
// record's slot number (for the release) and how it went; reclaimed is the count of
// dead holders it dropped.
func (f *inflight) take(id string, limit int64, now int64) (n uint64, res takeResult, reclaimed uint64) {
	if now-f.beatUs >= beatEveryUs && !f.beat(now) {
		// A VM that cannot register must not hold slots others would take for dead.
		return 0, failed, 0
	}
	h := hashID(id)
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		var (
			cand     uint64
			candCas  uint32
			haveCand bool
			candNew  bool // the candidate key does not exist yet
			mine     bool
			cas      uint32
			candDead uint64 // dead holders' slots in the candidate (reclaimed if taken)
		)
		for p := 0; p < inflightProbes; p++ {
			slot := (h + uint64(p)) % inflightSlots
			val, c, found, err := f.host.SharedGet(f.slotKey(slot))
			if err != nil {
				return 0, failed, reclaimed
			}
			f.gets++
			if !found {
				// Keys are never deleted: the record is not beyond a missing one.
				if !haveCand {
					cand, candCas, haveCand, candNew = slot, 0, true, true
				}
				break
			}
			rid, rest, ok := recordID(val)
			if ok && string(rid) == id {
				if !f.readHolders(rest) {
					f.holders = f.holders[:0] // unreadable: start it afresh
				}
				n, cas, mine = slot, c, true
				break
			}
			if haveCand {
				continue
			}
			// Another record: taken over when nothing is in flight in it (alive).
			if !ok || !f.readHolders(rest) {
				cand, candCas, haveCand = slot, c, true
				continue
			}
			if d, total := f.dropDead(now); total == 0 {
				cand, candCas, haveCand, candDead = slot, c, true, d
			}
		}
		switch {
		case mine:
			d, total := f.dropDead(now)
			if total >= uint64(limit) {
				if d > 0 {
					// Keep the reclaim: one attempt, a later take drops them again.
					f.valBuf = f.appendRecord(f.valBuf[:0], id)
					if ok, err := f.host.SharedSet(f.slotKey(n), f.valBuf, cas); err == nil && ok {
						reclaimed += d
					}
				}
				return n, full, reclaimed
			}
			f.add(1)
			f.valBuf = f.appendRecord(f.valBuf[:0], id)
			ok, err := f.host.SharedSet(f.slotKey(n), f.valBuf, cas)
			if err != nil {
				return 0, failed, reclaimed
			}
			if ok {
				return n, taken, reclaimed + d
			}
		case haveCand:
			f.holders = append(f.holders[:0], holder{id: f.self, n: 1})
			f.valBuf = f.appendRecord(f.valBuf[:0], id)
			if candNew {
				candCas = f.fence()
			}
			ok, err := f.host.SharedSet(f.slotKey(cand), f.valBuf, candCas)
			if err != nil {
				return 0, failed, reclaimed
			}
			if ok {
				return cand, taken, reclaimed + candDead
			}
		default:
			return 0, failed, reclaimed // every probe holds slots in flight
		}
	}
	return 0, failed, reclaimed
}

// add adds d to this VM's count in f.holders (d < 0 only down to 0).
func (f *inflight) add(d int64) {
	for i := range f.holders {
		if f.holders[i].id == f.self {
			f.holders[i].n = uint64(max(0, int64(f.holders[i].n)+d))
			return
		}
	}
	if d > 0 {
		f.holders = append(f.holders, holder{id: f.self, n: uint64(d)})
	}
}

// release gives back one slot of record id in slot n; false when it could not be
// written (the caller keeps it for a retry).
func (f *inflight) release(id string, n uint64) bool {
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		val, cas, found, err := f.host.SharedGet(f.slotKey(n))
		if err != nil {
			return false
		}
		f.gets++
		if !found {
			return true
		}
		rid, rest, ok := recordID(val)
		if !ok || string(rid) != id || !f.readHolders(rest) {
			// The record was taken over: this VM's count in it was dropped (it was
			// taken for dead), so there is nothing left to give back.
			return true
		}
		mine := false
		for _, h := range f.holders {
			mine = mine || h.id == f.self
		}
		if !mine {
			return true
		}
		f.add(-1)
		f.valBuf = f.appendRecord(f.valBuf[:0], id)
		ok, err = f.host.SharedSet(f.slotKey(n), f.valBuf, cas)
		if err != nil {
			return false
		}
		if ok {
			return true
		}
	}
	return false
}

// deferRelease keeps a release that failed for retryPending (copying the id: this
// allocates, on a failure path only).
func (f *inflight) deferRelease(id []byte, n uint64) bool {
	if len(f.pending) >= maxPendingReleases {
		return false
	}
	f.pending = append(f.pending, pendingRelease{id: string(id), n: n})
	return true
}

// retryPending retries the releases that failed; it returns how many are left.
func (f *inflight) retryPending() int {
	k := 0
	for _, r := range f.pending {
		if !f.release(r.id, r.n) {
			f.pending[k] = r
			k++
		}
	}
	clear(f.pending[k:])
	f.pending = f.pending[:k]
	return k
}

// beat writes this VM's liveness entry (dropping the stale entries of others) and
// keeps the table it wrote as f.live.
func (f *inflight) beat(now int64) bool {
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		val, cas, found, err := f.host.SharedGet(liveKey)
		if err != nil {
			return false
		}
		f.readLive(val, found)
		b := f.liveBuf[:0]
		for _, e := range f.live {
			if e.id != f.self && now-e.beatUs < holderStaleUs {
				b = binary.LittleEndian.AppendUint64(b, e.id)
				b = binary.LittleEndian.AppendUint64(b, uint64(e.beatUs))
			}
		}
		b = binary.LittleEndian.AppendUint64(b, f.self)
		b = binary.LittleEndian.AppendUint64(b, uint64(now))
		f.liveBuf = b
		if !found {
			cas = f.fence() // two VMs registering at once must not drop each other
		}
		ok, err := f.host.SharedSet(liveKey, b, cas)
		if err != nil {
			return false
		}
		if ok {
			f.readLive(b, true)
			f.beatUs, f.liveGets = now, f.gets
			return true
		}
	}
	return false
}

// readLive decodes a liveness table into f.live.
func (f *inflight) readLive(v []byte, found bool) {
	f.live = f.live[:0]
	if !found {
		return
	}
	for ; len(v) >= 16; v = v[16:] {
		f.live = append(f.live, liveEntry{id: binary.LittleEndian.Uint64(v), beatUs: int64(binary.LittleEndian.Uint64(v[8:]))})
	}
}

// alive reports whether holder id beat less than holderStaleUs before now. A holder that looks
// dead in this VM's copy of the table is looked up again in shared data (unless the
// copy was read after the record) before it is declared dead: every VM beats before it
// takes its first slot, so a holder of a record read before the table is in the table
// unless it was dropped as stale.
func (f *inflight) alive(id uint64, now int64) bool {
	if id == f.self || f.fresh(id, now) {
		return true
	}
	if f.liveGets == f.gets {
		return false
	}
	val, _, found, err := f.host.SharedGet(liveKey)
	if err != nil {
		return true // not known to be dead
	}
	f.readLive(val, found)
	f.liveGets = f.gets
	return f.fresh(id, now)
}

func (f *inflight) fresh(id uint64, now int64) bool {
	for _, e := range f.live {
		if e.id == id {
			return now-e.beatUs < holderStaleUs
		}
	}
	return false
}

// heldSlot is a slot a stream holds: its record's slot number and id (in the stream's
// heldIDs).
type heldSlot struct {
	n        uint64
	off, end int
}

// takeSlots takes a slot for every applied rule with max_in_flight; done is set when
// the request was answered (refused for concurrency, or 503 for a fail-closed rule
// whose slot could not be recorded), with every slot it took given back.
func (s *Stream) takeSlots(now int64, applied []rule.Applied) (act Action, done bool) {
	p := s.p
	for i := range applied {
		a := &applied[i]
		if a.Rule.MaxInFlight == 0 || a.Key == "" {
			continue
		}
		limit := p.inflightShare(now, a.Rule.MaxInFlight)
		off := len(s.heldIDs)
		s.heldIDs = appendInflightID(s.heldIDs, a.Key, a.Rule.ID)
		id := unsafe.String(&s.heldIDs[off], len(s.heldIDs)-off)
		n, res, reclaimed := p.inflight.take(id, limit, now)
		if reclaimed > 0 {
			p.m.add(p.m.inflightReclaimed, int64(reclaimed))
		}
		switch res {
		case taken:
			s.held = append(s.held, heldSlot{n: n, off: off, end: len(s.heldIDs)})
			continue
		case full:
			s.heldIDs = s.heldIDs[:off]
			if p.cfg.Shadowed(a) {
				p.m.inc(p.m.shadowRejected)
				p.countRule(a, statShadowLimited)
				s.inflightShadow = a.Rule.ID
				continue
			}
			s.releaseSlots()
			return s.refuseInFlight(a, limit), true
		case failed:
			s.heldIDs = s.heldIDs[:off]
			p.m.inc(p.m.inflightFailed)
			if a.Rule.Fail == rule.FailClosed && !p.cfg.Shadowed(a) {
				s.releaseSlots()
				return s.inflightUnavailable(a), true
			}
		}
	}
	return Continue, false
}

// inflightShare is the requests in flight per key this gateway admits under a rule's
// max_in_flight: all of them without a sync service, else ceil(max_in_flight / n), n
// the larger of sync.expected_nodes and the fleet size of the last sync reply. The
// larger, because a service's count lags a fleet that is starting (the first gateway's
// first reply counts one) while the operator's expected_nodes does not; a fleet larger
// than expected is counted by the service.
func (p *Plugin) inflightShare(now int64, maxInFlight int64) int64 {
	if !p.cfg.syncEnabled() {
		return maxInFlight
	}
	p.sync.refresh(now, healthRefreshUs)
	n := max(int64(p.sync.state.Nodes), p.cfg.Sync.ExpectedNodes, 1)
	return (maxInFlight + n - 1) / n
}

// refuseInFlight answers 429: the caller has limit requests in flight under rule a.
func (s *Stream) refuseInFlight(a *rule.Applied, limit int64) Action {
	p := s.p
	p.m.inc(p.m.rejected)
	p.m.inc(p.m.inflightRejected)
	p.countRule(a, statLimited)
	s.setDecision(decLimited, a, 0, limit, false)
	secs := p.retryAfter(inflightRetryUs)
	s.hb.Reset()
	s.hb.Refused(nil, false, secs, a.Rule.ID)
	s.hb.ConcurrencyLimit(limit)
	if s.grpc {
		p.body = refusal.AppendGRPCMessage(p.body[:0], "concurrency limited by rule ", a.Rule.ID, secs)
		s.replyGRPC(429, "tollgate_concurrency_limited", refusal.GRPCResourceExhausted, p.body)
		return Pause
	}
	p.body = refusal.AppendBodyConcurrency(p.body[:0], limit, secs, a.Rule.ID)
	s.reply(429, "tollgate_concurrency_limited", p.body)
	return Pause
}

// inflightUnavailable answers 503 for a fail-closed rule whose slot could not be
// recorded (shared data failing, or the table full of requests in flight).
func (s *Stream) inflightUnavailable(a *rule.Applied) Action {
	p := s.p
	p.m.inc(p.m.failClosed)
	p.countRule(a, statDegraded)
	s.setDecision(decUnavailable, a, 0, -1, true)
	secs := p.retryAfter(inflightRetryUs)
	s.hb.Reset()
	s.hb.Refused(nil, true, secs, a.Rule.ID)
	if s.grpc {
		s.replyGRPC(503, "tollgate_unavailable", refusal.GRPCUnavailable, p.grpcUnavailable(a.Rule.ID, secs))
		return Pause
	}
	s.reply(503, "tollgate_unavailable", p.body503(a.Rule.ID, secs))
	return Pause
}

// releaseSlots gives back every slot the stream holds; a release that cannot be
// written now is retried on the tick.
func (s *Stream) releaseSlots() {
	p := s.p
	for _, h := range s.held {
		id := s.heldIDs[h.off:h.end]
		if !p.inflight.release(unsafe.String(unsafe.SliceData(id), len(id)), h.n) && !p.inflight.deferRelease(id, h.n) {
			p.m.inc(p.m.inflightFailed)
		}
	}
	s.held, s.heldIDs = s.held[:0], s.heldIDs[:0]
}

// inflightTick keeps this VM's beat fresh once it has taken a slot, and retries the
// releases that failed.
func (p *Plugin) inflightTick(now int64) {
	f := &p.inflight
	if f.beatUs != 0 && now-f.beatUs >= beatEveryUs {
		f.beat(now)
	}
	f.retryPending()
}
