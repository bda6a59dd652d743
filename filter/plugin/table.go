package plugin

import (
	"encoding/binary"
	"math"
	"strconv"
	"unsafe"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// table maps bucket ids onto a fixed number of Envoy shared-data keys.
//
// proxy-wasm ABI 0.2.1 has no way to delete a shared-data key, so a key per caller would
// grow without bound. Instead buckets live in `slots` keys ("tg:s:<n>"), addressed by a hash
// of the bucket id with `probes` linear probes; a slot held by another bucket that has gone
// idle (no lease, nothing recent) is taken over, and when every probe is busy the least
// recently synced one is evicted (counted in tollgate_bucket_evictions). Memory is therefore
// bounded by slots × (id + 64 bytes) whatever the number of callers.
type table struct {
	host   Host
	slots  uint64
	probes int
	idleUs int64
	// m counts the slots this worker creates (nil in tests of the table alone).
	m *metrics
	// fence is the CAS value slots are created with (see fenceCas); 0 until known.
	fence uint32
	// scratch buffers: a wasm VM is single threaded, so one set per worker suffices.
	keyBuf []byte
	keyN   uint64 // the slot whose key keyBuf holds (when not empty)
	valBuf []byte
	other  lease.Record
}

// defaultProbes: a bucket in use is evicted only when every other slot it may occupy was
// used more recently. Without a sync service the evicted caller starts afresh, so that
// chance is what a table flooded by more callers than slots costs in over-admission:
// with 200,000 one-off callers through 65,536 slots, 4 probes let 3 of 1,000 callers
// active every 6,000 requests start afresh (filter TestHostFullTableKeepsLimiting), 8
// none. A new bucket on a full table reads all of them; a known one stops at its own.
const (
	defaultSlots  = 1 << 16
	defaultProbes = 8
	slotPrefix    = "tg:s:"
	fenceKey      = "tg:fence"
)

// slot is one loaded bucket.
type slot struct {
	n     uint64 // slot number (shared-data key slotKey(n))
	cas   uint32
	found bool // the key existed (then cas is meaningful)
	mine  bool // it holds this bucket (else it is empty or being taken over)
	rec   lease.Record
	// buf holds the decoded local state (rec.Local) across loads, so loading allocates
	// nothing once it has grown.
	buf algo.State
}

// load finds the slot of bucket id, or the slot it should take: an empty one, else an
// undecodable one, else an idle one, else the least recently used of its probes (so a
// full table keeps limiting new callers by evicting the oldest, never by refusing to
// record them).
func (t *table) load(id string, now int64, s *slot) error {
	h := hashID(id)
	var cand slot
	candScore := int64(math.MinInt64) // higher is a better takeover candidate
	for p := 0; p < t.probes; p++ {
		n := (h + uint64(p)) % t.slots
		val, cas, found, err := t.host.SharedGet(t.slotKey(n))
		if err != nil {
			return err
		}
		if !found {
			if candScore < 1<<62 {
				cand = slot{n: n}
				candScore = 1 << 62
			}
			continue
		}
		recBytes, mine, ok := splitSlot(val, id)
		if mine {
			s.n, s.cas, s.found, s.mine = n, cas, true, true
			s.rec.Local = s.buf[:0]
			if lease.DecodeRecord(recBytes, &s.rec) != nil {
				s.rec = lease.Record{Local: s.buf[:0]}
			}
			s.buf = s.rec.Local[:0]
			return nil
		}
		if candScore == 1<<62 {
			continue // an empty slot beats any takeover
		}
		score := int64(1 << 61) // undecodable: take it
		if ok && lease.DecodeRecord(recBytes, &t.other) == nil {
			if t.other.Idle(now, t.idleUs) {
				score = 1 << 60
			} else {
				score = -t.other.LastSeen() // evict the least recently active
			}
		}
		if score > candScore {
			cand = slot{n: n, cas: cas, found: true}
			candScore = score
		}
	}
	buf := s.buf
	*s = cand
	s.buf = buf
	s.rec = lease.Record{Local: buf[:0]}
	return nil
}

// store writes s back with CAS; ok is false when another worker changed it first.
func (t *table) store(id string, s *slot) (bool, error) {
	t.valBuf = appendSlot(t.valBuf[:0], id, &s.rec)
	cas := s.cas
	if !s.found {
		cas = t.fenceCas()
	}
	ok, err := t.host.SharedSet(t.slotKey(s.n), t.valBuf, cas)
	if ok && !s.found && t.m != nil {
		// This worker created the slot: a slot another worker created meanwhile fails
		// the fence's CAS, so each slot is counted once.
		t.m.add(t.m.slotsUsed, 1)
	}
	return ok, err
}

// fenceCas is the CAS value a missing slot is created with. Envoy ignores the CAS of a set
// on a missing key, refuses a non-zero CAS that differs from an existing key's, and stamps
// every successful set with the next value of one store-wide counter
// (proxy-wasm-cpp-host SharedData::nextCas). So a value the counter already handed out —
// the fence key's — never matches a key created later: a worker that found a slot missing
// cannot overwrite a bucket another worker created meanwhile (it gets a CAS mismatch and
// decides again). An unconditional create (CAS 0) would silently drop every update the
// other worker made in between. Only after the 32-bit counter wraps could a new key get
// the fence's value again. 0 (unconditional) while the fence cannot be read.
func (t *table) fenceCas() uint32 {
	if t.fence != 0 {
		return t.fence
	}
	_, cas, found, err := t.host.SharedGet(fenceKey)
	if err == nil && !found {
		// Several workers may write it at once; any one of the values stays a valid fence.
		if ok, serr := t.host.SharedSet(fenceKey, []byte{1}, 0); serr == nil && ok {
			_, cas, found, err = t.host.SharedGet(fenceKey)
		}
	}
	if err == nil && found {
		t.fence = cas
	}
	return t.fence
}

// slotKey returns the shared-data key of slot n. It aliases a buffer the next call for
// another slot overwrites: pass it straight to a host call (which copies it) and keep n
// instead. A request loads and stores the same slot, so the key is formatted once.
func (t *table) slotKey(n uint64) string {
	if len(t.keyBuf) == 0 || t.keyN != n {
		t.keyBuf = strconv.AppendUint(append(t.keyBuf[:0], slotPrefix...), n, 10)
		t.keyN = n
	}
	return unsafe.String(unsafe.SliceData(t.keyBuf), len(t.keyBuf))
}

// Slot value: uvarint id length, id, encoded lease.Record.
func appendSlot(dst []byte, id string, r *lease.Record) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(id)))
	dst = append(dst, id...)
	return lease.AppendRecord(dst, r)
}

// splitSlotID returns the bucket id and the record bytes of a slot value.
func splitSlotID(v []byte) (id, rec []byte, ok bool) {
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return nil, nil, false
	}
	end := k + int(n)
	return v[k:end], v[end:], true
}

// splitSlot returns the record bytes of a slot value and whether it belongs to id.
func splitSlot(v []byte, id string) (rec []byte, mine, ok bool) {
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)-k) {
		return nil, false, false
	}
	end := k + int(n)
	return v[end:], string(v[k:end]) == id, true
}

// hashID is FNV-1a: tiny, allocation-free and stable across VMs (every worker must find
// the same slot).
func hashID(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// PeekRecord reads the record of bucket (key, rule, tier, window) from a table of
// slots slots through get (a shared-data read), probing as load does. It is for
// diagnostics outside the request path (the fleet simulation's account of why it held
// or refused a request); ok is false when the bucket has no slot.
func PeekRecord(get func(key string) ([]byte, bool), slots uint64, key, rule, tier string, window int) (r lease.Record, ok bool) {
	if slots == 0 {
		slots = defaultSlots
	}
	id := string(appendBucketID(nil, key, rule, tier, window))
	h := hashID(id)
	for p := 0; p < defaultProbes; p++ {
		val, found := get(slotPrefix + strconv.FormatUint((h+uint64(p))%slots, 10))
		if !found {
			continue
		}
		if rec, mine, _ := splitSlot(val, id); mine {
			return r, lease.DecodeRecord(rec, &r) == nil
		}
	}
	return r, false
}
