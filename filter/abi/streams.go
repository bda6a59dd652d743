package abi

// streamTable maps the context ids of live streams to their handlers. Every request
// inserts, looks up (four times) and deletes one entry, so this is hand-written rather
// than a Go map: compiled to wasm, a map operation hashes the key with the runtime's
// portable fallback hash and probes a swiss table without SIMD, several times the cost
// of the few loads below.
//
// It is open addressing with linear probing on the id's low bits. Hosts number contexts
// sequentially, so the ids of live streams fall into consecutive slots and a lookup
// usually touches one slot; a long-lived stream only lengthens the probe of the ids that
// land on it. Deletion shifts the following entries back (no tombstones), so probes stay
// short however many requests pass. The table doubles when half full and never shrinks:
// its size follows the most streams ever open at once.
type streamTable struct {
	slots []streamSlot // length 0 or a power of two; a nil Stream marks a free slot
	n     int
}

type streamSlot struct {
	id uint32
	s  Stream
}

// get returns the handler of stream id, or nil.
func (t *streamTable) get(id uint32) Stream {
	mask := uint32(len(t.slots) - 1)
	for i := id & mask; len(t.slots) > 0; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.s == nil || e.id == id {
			return e.s
		}
	}
	return nil
}

// put adds or replaces the handler of stream id; s must not be nil.
func (t *streamTable) put(id uint32, s Stream) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	mask := uint32(len(t.slots) - 1)
	for i := id & mask; ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.s == nil {
			*e = streamSlot{id: id, s: s}
			t.n++
			return
		}
		if e.id == id {
			e.s = s
			return
		}
	}
}

// remove forgets stream id and returns its handler, or nil if it was not there.
func (t *streamTable) remove(id uint32) Stream {
	mask := uint32(len(t.slots) - 1)
	i := id & mask
	for ; len(t.slots) > 0; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.s == nil {
			return nil
		}
		if e.id == id {
			break
		}
	}
	if len(t.slots) == 0 {
		return nil
	}
	removed := t.slots[i].s
	// Shift back every following entry of the run whose home slot is not in (i, j]:
	// it was placed past i only because i was taken.
	for j := (i + 1) & mask; t.slots[j].s != nil; j = (j + 1) & mask {
		home := t.slots[j].id & mask
		if (j-home)&mask < (j-i)&mask {
			continue // its home lies between i and j: it stays reachable
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = streamSlot{}
	t.n--
	return removed
}

func (t *streamTable) grow() {
	old := t.slots
	t.slots = make([]streamSlot, max(16, 2*len(old)))
	t.n = 0
	for _, e := range old {
		if e.s != nil {
			t.put(e.id, e.s)
		}
	}
}
