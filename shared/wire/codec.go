package wire

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// Smallest encodings, used to reject counts the remaining bytes cannot hold before
// allocating for them.
const (
	minDeltaSize = 17 // 3 empty strings, 2 bytes, 8 uv, 1 byte, 3 uv
	minStateSize = 16 // 2 empty strings, 2 bytes, 1 sv, 8 uv, 1 byte, 1 uv, 1 empty string
)

// AppendBatch appends the encoding of b to dst. On error (a limit exceeded) it returns
// dst unchanged and an *Error naming the field.
func AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	if err := checkString("", 0, "node", b.Node); err != nil {
		return dst, err
	}
	if err := checkTag("", 0, "rules_tag", b.RulesTag); err != nil {
		return dst, err
	}
	if err := checkCount("deltas", len(b.Deltas)); err != nil {
		return dst, err
	}
	for i := range b.Deltas {
		d := &b.Deltas[i]
		for _, f := range [...]struct{ name, v string }{{"key", d.Key}, {"rule", d.Rule}, {"tier", d.Tier}} {
			if err := checkString("delta", i, f.name, f.v); err != nil {
				return dst, err
			}
		}
		if d.Flags&^deltaFlags != 0 {
			return dst, &Error{Field: "delta[" + strconv.Itoa(i) + "].flags", Reason: "unknown bits 0x" + strconv.FormatUint(uint64(d.Flags), 16), Kind: ErrMalformed}
		}
	}
	size := EncodedBatchSize(b)
	if size > MaxBatchSize {
		return dst, sizeError("batch", size)
	}
	dst = slices.Grow(dst, size)
	dst = append(dst, Version)
	dst = appendString(dst, b.Node)
	dst = binary.AppendUvarint(dst, b.Seq)
	dst = binary.AppendUvarint(dst, b.RulesVersion)
	dst = appendString(dst, b.RulesTag)
	dst = binary.AppendUvarint(dst, uint64(len(b.Deltas)))
	for i := range b.Deltas {
		dst = AppendDelta(dst, &b.Deltas[i])
	}
	return dst, nil
}

// AppendDelta appends one delta's encoding (as inside a Batch) to dst. The filter
// builds batches delta by delta with it; the caller checks the limits (see
// AppendBatch).
func AppendDelta(dst []byte, d *Delta) []byte {
	dst = appendString(dst, d.Key)
	dst = appendString(dst, d.Rule)
	dst = appendString(dst, d.Tier)
	dst = append(dst, d.Window, d.Flags)
	for _, v := range [...]uint32{d.Leased, d.Over, d.Returned, d.Held, d.Rejected, d.Early, d.Epoch, d.ElapsedMs} {
		dst = binary.AppendUvarint(dst, uint64(v))
	}
	dst = append(dst, d.Algo)
	dst = binary.AppendUvarint(dst, uint64(d.Limit))
	dst = binary.AppendUvarint(dst, uint64(d.WindowMs))
	dst = binary.AppendUvarint(dst, uint64(d.Burst))
	if d.Flags&FlagWant != 0 {
		dst = binary.AppendUvarint(dst, uint64(d.Want))
	}
	if d.Flags&FlagRate != 0 {
		dst = binary.AppendUvarint(dst, uint64(d.Rate))
		dst = binary.AppendUvarint(dst, uint64(d.RateUsed))
		dst = binary.AppendUvarint(dst, uint64(d.RateEpoch))
		dst = binary.AppendUvarint(dst, uint64(d.RateStock))
	}
	return dst
}

// AppendBatchHeader appends the part of a Batch before its deltas, for a batch of n
// deltas appended after it with AppendDelta.
func AppendBatchHeader(dst []byte, node string, seq, rulesVersion uint64, rulesTag string, n int) []byte {
	dst = append(dst, Version)
	dst = appendString(dst, node)
	dst = binary.AppendUvarint(dst, seq)
	dst = binary.AppendUvarint(dst, rulesVersion)
	dst = appendString(dst, rulesTag)
	return binary.AppendUvarint(dst, uint64(n))
}

// AppendReply appends the encoding of r to dst. On error (a limit exceeded) it returns
// dst unchanged and an *Error naming the field.
func AppendReply(dst []byte, r *Reply) ([]byte, error) {
	if err := checkTag("", 0, "rules_tag", r.RulesTag); err != nil {
		return dst, err
	}
	if err := checkCount("states", len(r.States)); err != nil {
		return dst, err
	}
	for i := range r.States {
		s := &r.States[i]
		for _, f := range [...]struct{ name, v string }{{"key", s.Key}, {"rule", s.Rule}} {
			if err := checkString("state", i, f.name, f.v); err != nil {
				return dst, err
			}
		}
		if err := checkTag("state", i, "reason", s.Reason); err != nil {
			return dst, err
		}
		if s.Flags&^stateFlags != 0 {
			return dst, &Error{Field: "state[" + strconv.Itoa(i) + "].flags", Reason: "unknown bits 0x" + strconv.FormatUint(uint64(s.Flags), 16), Kind: ErrMalformed}
		}
	}
	size := EncodedReplySize(r)
	if size > MaxBatchSize {
		return dst, sizeError("reply", size)
	}
	dst = slices.Grow(dst, size)
	dst = append(dst, Version)
	dst = binary.AppendUvarint(dst, r.RulesVersion)
	dst = appendString(dst, r.RulesTag)
	dst = binary.AppendVarint(dst, r.ServerTimeUs)
	dst = binary.AppendUvarint(dst, uint64(r.Nodes))
	dst = binary.AppendUvarint(dst, uint64(len(r.States)))
	for i := range r.States {
		s := &r.States[i]
		dst = appendString(dst, s.Key)
		dst = appendString(dst, s.Rule)
		dst = append(dst, s.Window, s.Flags)
		dst = binary.AppendVarint(dst, s.Remaining)
		for _, v := range [...]uint32{s.Lease, s.Held, s.Epoch, s.ValidMs, s.LowWater, s.ResetInMs, s.RetryInMs, s.PenaltyInMs} {
			dst = binary.AppendUvarint(dst, uint64(v))
		}
		dst = append(dst, s.PenaltyLevel)
		dst = binary.AppendUvarint(dst, s.ServerMs)
		dst = appendString(dst, s.Reason)
		if s.Flags&StateRate != 0 {
			dst = binary.AppendUvarint(dst, uint64(s.Rate))
			dst = binary.AppendUvarint(dst, uint64(s.Stock))
		}
	}
	return dst, nil
}

// DecodeBatch decodes data into b, reusing b.Deltas' capacity. On error b is unchanged.
// A message of another version fails with ErrVersion (see PeekVersion and v1.go).
//
// All strings of one decode share a single allocation (so decoding a batch costs two
// allocations at most, the Deltas slice and the strings): a caller that keeps one of
// them long after the batch should strings.Clone it so the rest can be collected.
func DecodeBatch(data []byte, b *Batch) error {
	if len(data) > MaxBatchSize {
		return sizeError("batch", len(data))
	}
	// First pass: validate everything and measure the strings, writing nothing.
	r := reader{data: data}
	if err := r.batch(nil); err != nil {
		return err
	}
	// Second pass: fill b; cannot fail since the first pass accepted the same bytes.
	fill := reader{data: data, fill: true}
	fill.arena.Grow(r.strBytes)
	return fill.batch(b)
}

// DecodeReply decodes data into rep, reusing rep.States' capacity. On error rep is
// unchanged. Strings share one allocation, as with DecodeBatch.
func DecodeReply(data []byte, rep *Reply) error {
	if len(data) > MaxBatchSize {
		return sizeError("reply", len(data))
	}
	r := reader{data: data}
	if err := r.reply(nil); err != nil {
		return err
	}
	fill := reader{data: data, fill: true}
	fill.arena.Grow(r.strBytes)
	return fill.reply(rep)
}

// reader walks an encoded message. Unless fill is set it only validates and sums the
// string lengths; with fill it returns strings that live in arena.
//
// Errors are sticky: the first failure is kept in err and every later read returns a
// zero value, so an element is decoded as one struct literal and err checked once.
type reader struct {
	data     []byte
	off      int
	err      error
	item     string // "delta" or "state" while inside an element, "" at top level
	idx      int
	fill     bool
	arena    strings.Builder // by value: a pointer field would make it escape
	strBytes int
}

func (r *reader) batch(b *Batch) error {
	r.version(Version)
	node := r.str("node")
	seq := r.uvarint("seq")
	rulesVersion := r.uvarint("rules_version")
	rulesTag := r.strMax("rules_tag", MaxTagLen)
	n := r.count("deltas", minDeltaSize)
	if r.err != nil {
		return r.err
	}
	var deltas []Delta
	if b != nil {
		deltas = resize(b.Deltas, n)
	}
	r.item = "delta"
	for i := 0; i < n; i++ {
		r.idx = i
		d := Delta{
			Key:       r.str("key"),
			Rule:      r.str("rule"),
			Tier:      r.str("tier"),
			Window:    r.byte("window"),
			Flags:     r.flags("flags", deltaFlags),
			Leased:    r.u32("leased"),
			Over:      r.u32("over"),
			Returned:  r.u32("returned"),
			Held:      r.u32("held"),
			Rejected:  r.u32("rejected"),
			Early:     r.u32("early"),
			Epoch:     r.u32("epoch"),
			ElapsedMs: r.u32("elapsed_ms"),
			Algo:      r.byte("algo"),
			Limit:     r.u32("limit"),
			WindowMs:  r.u32("window_ms"),
			Burst:     r.u32("burst"),
		}
		if d.Flags&FlagWant != 0 {
			d.Want = r.u32("want")
		}
		if d.Flags&FlagRate != 0 {
			d.Rate = r.u32("rate")
			d.RateUsed = r.u32("rate_used")
			d.RateEpoch = r.u32("rate_epoch")
			d.RateStock = r.u32("rate_stock")
		}
		if r.err != nil {
			return r.err
		}
		if b != nil {
			deltas[i] = d
		}
	}
	r.item = ""
	if err := r.end("batch"); err != nil {
		return err
	}
	if b != nil {
		*b = Batch{Node: node, Seq: seq, RulesVersion: rulesVersion, RulesTag: rulesTag, Deltas: deltas}
	}
	return nil
}

func (r *reader) reply(rep *Reply) error {
	r.version(Version)
	rulesVersion := r.uvarint("rules_version")
	rulesTag := r.strMax("rules_tag", MaxTagLen)
	serverTime := r.varint("server_time_us")
	nodes := r.u32("nodes")
	n := r.count("states", minStateSize)
	if r.err != nil {
		return r.err
	}
	var states []State
	if rep != nil {
		states = resize(rep.States, n)
	}
	r.item = "state"
	for i := 0; i < n; i++ {
		r.idx = i
		s := State{
			Key:          r.str("key"),
			Rule:         r.str("rule"),
			Window:       r.byte("window"),
			Flags:        r.flags("flags", stateFlags),
			Remaining:    r.varint("remaining"),
			Lease:        r.u32("lease"),
			Held:         r.u32("held"),
			Epoch:        r.u32("epoch"),
			ValidMs:      r.u32("valid_ms"),
			LowWater:     r.u32("low_water"),
			ResetInMs:    r.u32("reset_in_ms"),
			RetryInMs:    r.u32("retry_in_ms"),
			PenaltyInMs:  r.u32("penalty_in_ms"),
			PenaltyLevel: r.byte("penalty_level"),
			ServerMs:     r.uvarint("server_ms"),
			Reason:       r.strMax("reason", MaxTagLen),
		}
		if s.Flags&StateRate != 0 {
			s.Rate = r.u32("rate")
			s.Stock = r.u32("stock")
		}
		if r.err != nil {
			return r.err
		}
		if rep != nil {
			states[i] = s
		}
	}
	r.item = ""
	if err := r.end("reply"); err != nil {
		return err
	}
	if rep != nil {
		*rep = Reply{RulesVersion: rulesVersion, RulesTag: rulesTag, ServerTimeUs: serverTime, Nodes: nodes, States: states}
	}
	return nil
}

// flags reads a flag byte and refuses unknown bits.
func (r *reader) flags(field string, known uint8) uint8 {
	f := r.byte(field)
	if f&^known != 0 && r.err == nil {
		r.fail(field, "unknown bits 0x"+strconv.FormatUint(uint64(f), 16), ErrMalformed)
	}
	return f
}

func (r *reader) version(want byte) {
	if v := r.byte("version"); v != want && r.err == nil {
		r.fail("version", "got "+strconv.Itoa(int(v))+", want "+strconv.Itoa(int(want)), ErrVersion)
	}
}

// fail records the first error; field is qualified with the current element.
func (r *reader) fail(field, reason string, kind error) {
	if r.err != nil {
		return
	}
	if r.item != "" {
		field = r.item + "[" + strconv.Itoa(r.idx) + "]." + field
	}
	r.err = &Error{Field: field, Reason: reason, Kind: kind}
	r.off = len(r.data) // later reads see a truncated input and return zeros
}

func (r *reader) byte(field string) byte {
	if i := r.off; i < len(r.data) {
		r.off = i + 1
		return r.data[i]
	}
	return r.truncated(field)
}

func (r *reader) truncated(field string) byte {
	r.fail(field, "truncated", ErrMalformed)
	return 0
}

func (r *reader) uvarint(field string) uint64 {
	// Fast path: most counters and lengths fit in one byte.
	if i := r.off; i < len(r.data) {
		if b := r.data[i]; b < 0x80 {
			r.off = i + 1
			return uint64(b)
		}
	}
	return r.uvarintSlow(field)
}

func (r *reader) uvarintSlow(field string) uint64 {
	v, n := binary.Uvarint(r.data[r.off:])
	switch {
	case n == 0:
		r.fail(field, "truncated", ErrMalformed)
	case n < 0:
		r.fail(field, "varint overflows 64 bits", ErrMalformed)
	case r.data[r.off+n-1] == 0:
		// A multi-byte varint ending in a zero group has a shorter encoding.
		r.fail(field, "non-minimal varint", ErrMalformed)
	default:
		r.off += n
		return v
	}
	return 0
}

func (r *reader) varint(field string) int64 {
	ux := r.uvarint(field)
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

func (r *reader) u32(field string) uint32 {
	v := r.uvarint(field)
	if v > math.MaxUint32 {
		r.fail(field, "value "+strconv.FormatUint(v, 10)+" > 4294967295", ErrMalformed)
		return 0
	}
	return uint32(v)
}

// count reads an element count and checks it against MaxDeltas and against what the
// remaining bytes can hold at minSize bytes per element.
func (r *reader) count(field string, minSize int) int {
	v := r.uvarint(field)
	if v > MaxDeltas {
		r.fail(field, "count "+strconv.FormatUint(v, 10)+" > "+strconv.Itoa(MaxDeltas), ErrLimit)
		return 0
	}
	n := int(v)
	if left := len(r.data) - r.off; n*minSize > left {
		r.fail(field, "count "+strconv.Itoa(n)+" needs at least "+strconv.Itoa(n*minSize)+
			" bytes, "+strconv.Itoa(left)+" left", ErrMalformed)
		return 0
	}
	return n
}

func (r *reader) str(field string) string { return r.strMax(field, MaxStringLen) }

func (r *reader) strMax(field string, max int) string {
	v := r.uvarint(field)
	if v > uint64(max) {
		r.fail(field, "length "+strconv.FormatUint(v, 10)+" > "+strconv.Itoa(max), ErrLimit)
		return ""
	}
	n := int(v)
	if left := len(r.data) - r.off; n > left {
		r.fail(field, "length "+strconv.Itoa(n)+" exceeds the "+strconv.Itoa(left)+" bytes left", ErrMalformed)
		return ""
	}
	b := r.data[r.off : r.off+n]
	r.off += n
	if !r.fill {
		r.strBytes += n
		return ""
	}
	// The arena was grown to the exact total, so every Write lands in one backing
	// array; a Builder never mutates what an earlier String() returned.
	r.arena.Write(b)
	s := r.arena.String()
	return s[len(s)-n:]
}

func (r *reader) end(what string) error {
	if extra := len(r.data) - r.off; extra != 0 && r.err == nil {
		r.fail(what, strconv.Itoa(extra)+" trailing bytes", ErrMalformed)
	}
	return r.err
}

func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// checkString enforces MaxStringLen on encode; item is "" for top-level fields.
func checkString(item string, idx int, field, s string) error {
	if len(s) <= MaxStringLen {
		return nil
	}
	r := reader{item: item, idx: idx}
	r.fail(field, "length "+strconv.Itoa(len(s))+" > "+strconv.Itoa(MaxStringLen), ErrLimit)
	return r.err
}

// checkTag enforces MaxTagLen on encode.
func checkTag(item string, idx int, field, s string) error {
	if len(s) <= MaxTagLen {
		return nil
	}
	r := reader{item: item, idx: idx}
	r.fail(field, "length "+strconv.Itoa(len(s))+" > "+strconv.Itoa(MaxTagLen), ErrLimit)
	return r.err
}

func checkCount(field string, n int) error {
	if n <= MaxDeltas {
		return nil
	}
	return &Error{Field: field, Reason: "count " + strconv.Itoa(n) + " > " + strconv.Itoa(MaxDeltas), Kind: ErrLimit}
}

func sizeError(what string, n int) error {
	return &Error{Field: what, Reason: "size " + strconv.Itoa(n) + " > " + strconv.Itoa(MaxBatchSize), Kind: ErrLimit}
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// uvarintLen is the number of bytes binary.AppendUvarint writes for v.
func uvarintLen(v uint64) int {
	return (bits.Len64(v|1) + 6) / 7
}

func varintLen(v int64) int {
	return uvarintLen(uint64(v<<1) ^ uint64(v>>63))
}
