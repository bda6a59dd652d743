package lease

import (
	"encoding/binary"
	"errors"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// Encoding: a fixed 65-byte header, six uvarints (LowWater and the pending counts), then
// the algorithm state (13 or 17 bytes for every algorithm but the sliding window log):
//
//	0      version (5)
//	1      flags (bit 0 synced, 1 used, 3 urgent, 4 pending degraded)
//	2      penalty level
//	3..11  base (int64 µs): UsedUs, or the earliest time set when never used; the
//	       times below are relative to it
//	11..41 SyncedUs, ResetUs, RetryUs, PenaltyUntilUs, AnnouncedUs, LeaseUntilUs:
//	       40-bit signed milliseconds relative to base's millisecond (±17 years). Each
//	       time is rounded to a whole millisecond of the clock, not of its distance to
//	       base, so a time decoded and written again under a later base stays put:
//	       rounded up, so a deadline is never brought forward (SyncedUs and
//	       LeaseUntilUs rounded down: a lease never looks younger or longer). The service's reset and retry times
//	       reach the wire's uint32 milliseconds (49 days), beyond a month's window; a
//	       local token bucket's (up to algo.MaxRefillUs, 17.8 years) saturate at 17 years.
//	41..45 LeaseLeft, 45..49 GlobalRemaining (int32, saturated; a bucket holds at most
//	       algo.MaxBurst, below 2^31)
//	49..53 ServerMs, 53..57 LeaseEpoch, 57..61 CutSeq, 61..65 ParamsTag (uint32)
//	65..   uvarints LowWater, Pending.Leased, Over, Returned, Rejected, Early, Cold,
//	       ColdCut, AcquireUntilUs as whole milliseconds after base's millisecond plus
//	       one (0: none, or already past base), Waiting; then the algorithm state (the
//	       rest of the value)
//
// Version 6 adds uvarints after Waiting: Pending.RateUsed, Rate, Stock, RateBack,
// RateEpoch, RateAtUs (absolute µs) and RateFrac; version 5 records decode with no rate
// lease.
// Versions 4 (no ParamsTag, a 61-byte header, and only the first six uvarints) and 3
// (also with 32-bit relative times, ±24 days, and a 55-byte header) still decode, with
// ParamsTag 0 and the cold-start fields 0, so records written before an upgrade keep
// their leases and pending counts.
const (
	recordVersion = 6
	headerSize    = 65
	relSize       = 5 // bytes of one relative time
	flagSynced    = 1
	flagUsed      = 2
	flagUrgent    = 8
	flagDegraded  = 16

	recordVersion5 = 5
	recordVersion4 = 4
	headerSize4    = 61
	recordVersion3 = 3
	headerSize3    = 55
)

// recordLayout is where a version's header keeps the fields after base.
type recordLayout struct {
	header, relSize, rel, leaseLeft, global, serverMs, leaseEpoch, cutSeq int
	paramsTag                                                             int // -1: none
}

var (
	layout5 = recordLayout{header: headerSize, relSize: relSize, rel: 11, leaseLeft: 41, global: 45, serverMs: 49, leaseEpoch: 53, cutSeq: 57, paramsTag: 61}
	layout4 = recordLayout{header: headerSize4, relSize: relSize, rel: 11, leaseLeft: 41, global: 45, serverMs: 49, leaseEpoch: 53, cutSeq: 57, paramsTag: -1}
	layout3 = recordLayout{header: headerSize3, relSize: 4, rel: 11, leaseLeft: 35, global: 39, serverMs: 43, leaseEpoch: 47, cutSeq: 51, paramsTag: -1}
)

// MaxRecordSize bounds the encoded size for the fixed-size algorithms (counts below
// 2^35, so five bytes a uvarint, and RateAtUs, a time in µs, ten at most).
const MaxRecordSize = headerSize + 16*5 + 10 + algo.MaxStateSize

// ErrRecord reports an undecodable record.
var ErrRecord = errors.New("lease: malformed record")

// AppendRecord encodes r after dst.
func AppendRecord(dst []byte, r *Record) []byte {
	var h [headerSize]byte
	h[0] = recordVersion
	base := r.UsedUs
	if base == 0 {
		for _, t := range [...]int64{r.SyncedUs, r.ResetUs, r.RetryUs, r.PenaltyUntilUs, r.AnnouncedUs, r.LeaseUntilUs} {
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
	if r.Urgent {
		h[1] |= flagUrgent
	}
	if r.Pending.Degraded {
		h[1] |= flagDegraded
	}
	h[2] = r.PenaltyLevel
	binary.LittleEndian.PutUint64(h[3:], uint64(base))
	l := &layout5
	for i, rel := range [...]struct {
		t  int64
		up bool
	}{{r.SyncedUs, false}, {r.ResetUs, true}, {r.RetryUs, true}, {r.PenaltyUntilUs, true}, {r.AnnouncedUs, true}, {r.LeaseUntilUs, false}} {
		putRel(h[l.rel+i*relSize:], rel.t, base, rel.up)
	}
	putI32(h[l.leaseLeft:], r.LeaseLeft)
	putI32(h[l.global:], r.GlobalRemaining)
	binary.LittleEndian.PutUint32(h[l.serverMs:], r.ServerMs)
	binary.LittleEndian.PutUint32(h[l.leaseEpoch:], r.LeaseEpoch)
	binary.LittleEndian.PutUint32(h[l.cutSeq:], r.CutSeq)
	binary.LittleEndian.PutUint32(h[l.paramsTag:], r.ParamsTag)
	dst = append(dst, h[:]...)
	var acq int64
	if r.AcquireUntilUs != 0 {
		acq = max(ceilDiv(r.AcquireUntilUs, 1000)-floorDiv(base, 1000)+1, 0)
	}
	for _, v := range [...]int64{r.LowWater, r.Pending.Leased, r.Pending.Over, r.Pending.Returned, r.Pending.Rejected, r.Pending.Early, r.Cold, r.ColdCut, acq, r.Waiting,
		r.Pending.RateUsed, r.Rate, r.Stock, r.RateBack, int64(r.RateEpoch), r.RateAtUs, r.RateFrac} {
		dst = binary.AppendUvarint(dst, uint64(max(v, 0)))
	}
	return append(dst, r.Local...)
}

// DecodeRecord decodes data into r, reusing r.Local's capacity.
func DecodeRecord(data []byte, r *Record) error {
	var l *recordLayout
	nvals := 17
	switch {
	case len(data) >= headerSize && data[0] == recordVersion:
		l = &layout5
	case len(data) >= headerSize && data[0] == recordVersion5:
		l, nvals = &layout5, 10
	case len(data) >= headerSize4 && data[0] == recordVersion4:
		l, nvals = &layout4, 6
	case len(data) >= headerSize3 && data[0] == recordVersion3:
		l, nvals = &layout3, 6
	default:
		return ErrRecord
	}
	var vals [17]int64
	i := l.header
	for n := range vals[:nvals] {
		v, k := binary.Uvarint(data[i:])
		if k <= 0 || v > 1<<62 {
			return ErrRecord
		}
		vals[n] = int64(v)
		i += k
	}
	base := int64(binary.LittleEndian.Uint64(data[3:]))
	f := data[1]
	r.UsedUs = 0
	if f&flagUsed != 0 {
		r.UsedUs = base
	}
	r.PenaltyLevel = data[2]
	rel := func(i int) int64 { return getRel(data[l.rel+i*l.relSize:], l.relSize, base) }
	r.SyncedUs = 0
	if f&flagSynced != 0 {
		r.SyncedUs = rel(0)
	}
	r.ResetUs = rel(1)
	r.RetryUs = rel(2)
	r.PenaltyUntilUs = rel(3)
	r.AnnouncedUs = rel(4)
	r.LeaseUntilUs = rel(5)
	r.LeaseLeft = getI32(data[l.leaseLeft:])
	r.GlobalRemaining = getI32(data[l.global:])
	r.ServerMs = binary.LittleEndian.Uint32(data[l.serverMs:])
	r.LeaseEpoch = binary.LittleEndian.Uint32(data[l.leaseEpoch:])
	r.CutSeq = binary.LittleEndian.Uint32(data[l.cutSeq:])
	r.ParamsTag = 0
	if l.paramsTag >= 0 {
		r.ParamsTag = binary.LittleEndian.Uint32(data[l.paramsTag:])
	}
	r.Urgent = f&flagUrgent != 0
	r.LowWater = vals[0]
	r.Pending = Pending{Leased: vals[1], Over: vals[2], Returned: vals[3], Rejected: vals[4], Early: vals[5], Degraded: f&flagDegraded != 0}
	r.Cold, r.ColdCut, r.Waiting = vals[6], vals[7], vals[9]
	r.Pending.RateUsed, r.Rate, r.Stock, r.RateBack, r.RateEpoch, r.RateAtUs = vals[10], vals[11], vals[12], vals[13], uint32(vals[14]), vals[15]
	r.RateFrac = vals[16]
	r.AcquireUntilUs = 0
	if vals[8] > 0 {
		r.AcquireUntilUs = (floorDiv(base, 1000) + vals[8] - 1) * 1000
	}
	r.Local = append(r.Local[:0], data[i:]...)
	return nil
}

// relMin and relMax bound a 40-bit relative time; relMin itself marks a zero (unset)
// time.
const (
	relMin = -1 << 39
	relMax = 1<<39 - 1
)

func putRel(b []byte, t, base int64, up bool) {
	v := int64(relMin)
	if t != 0 {
		// Rounded to whole milliseconds of absolute time, not of the distance to base:
		// base moves with every request, and rounding the distance would move a time
		// that is re-encoded unchanged a little further each time.
		if up {
			v = ceilDiv(t, 1000) - floorDiv(base, 1000)
		} else {
			v = floorDiv(t, 1000) - floorDiv(base, 1000)
		}
		v = min(max(v, relMin+1), relMax)
	}
	// Written out rather than looped (five bytes, little-endian).
	u := uint64(v)
	_ = b[relSize-1]
	b[0], b[1], b[2], b[3], b[4] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24), byte(u>>32)
}

// getRel reads a relative time of size bytes (5, or 4 in version 3 records).
func getRel(b []byte, size int, base int64) int64 {
	// Written out rather than looped, as in putRel (4 or 5 bytes).
	_ = b[size-1]
	u := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24
	if size == 5 {
		u |= uint64(b[4]) << 32
	}
	shift := 64 - 8*size
	v := int64(u<<shift) >> shift // sign-extend
	if v == -1<<(8*size-1) {
		return 0
	}
	return (floorDiv(base, 1000) + v) * 1000
}

func putI32(b []byte, v int64) { binary.LittleEndian.PutUint32(b, uint32(int32(clampI32(v)))) }
func getI32(b []byte) int64    { return int64(int32(binary.LittleEndian.Uint32(b))) }

func clampI32(v int64) int64 {
	const lo, hi = -1 << 31, 1<<31 - 1
	return min(max(v, lo), hi)
}
