package lease

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const (
	msUs  = int64(1_000)
	dayUs = 86_400_000_000
)

// TestRecordRoundTrip: a record decodes to what was encoded at the sizes a rule may
// have: windows up to algo.MaxWindowUs (reset and retry times a month away, and the
// 49 days the wire's uint32 milliseconds can say), leases and debts of algo.MaxBurst.
func TestRecordRoundTrip(t *testing.T) {
	const now = 1_700_000_000_000_000
	tb := algo.Params{Limit: algo.MaxLimit, WindowUs: algo.MaxWindowUs, Burst: algo.MaxBurst}
	tests := []struct {
		name string
		r    Record
	}{
		{"fresh", Record{}},
		{"used_only", Record{UsedUs: now}},
		{"month_window", Record{
			Local: algo.Take(tb, nil, now, algo.MaxBurst), LeaseLeft: algo.MaxBurst / 2, LeaseEpoch: 1<<32 - 1,
			LeaseUntilUs: now + 40*msUs, LowWater: algo.MaxBurst / 4, GlobalRemaining: -algo.MaxBurst,
			SyncedUs: now - 31*dayUs, ServerMs: 1<<32 - 1, ResetUs: now + algo.MaxWindowUs, RetryUs: now + algo.MaxWindowUs - msUs,
			PenaltyUntilUs: now + 60*1000*msUs, AnnouncedUs: now + 30*dayUs, UsedUs: now, PenaltyLevel: 62, CutSeq: 7,
			Pending: Pending{Leased: algo.MaxLimit, Over: algo.MaxLimit, Returned: algo.MaxBurst, Rejected: 1 << 34, Early: 3, Degraded: true},
			Urgent:  true,
		}},
		{"wire_maximum", Record{UsedUs: now, ResetUs: now + (1<<32-1)*msUs, RetryUs: now + (1<<32-1)*msUs, SyncedUs: now}},
		{"never_used", Record{SyncedUs: now, ResetUs: now + algo.MaxWindowUs, LeaseUntilUs: now + msUs}},
		{"decade", Record{UsedUs: now, AnnouncedUs: now + 10*365*dayUs, SyncedUs: now - 10*365*dayUs}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := AppendRecord(nil, &tt.r)
			if len(tt.r.Local) <= algo.MaxStateSize && len(b) > MaxRecordSize {
				t.Errorf("%d bytes, above MaxRecordSize %d", len(b), MaxRecordSize)
			}
			var got Record
			if err := DecodeRecord(b, &got); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if len(got.Local) == 0 && len(tt.r.Local) == 0 {
				got.Local = tt.r.Local
			}
			if !reflect.DeepEqual(got, tt.r) {
				t.Errorf("decoded\n%+v\nwant\n%+v", got, tt.r)
			}
		})
	}
}

// TestRecordTimesRounding: times between milliseconds round so that a deadline is never
// brought forward and a lease never looks longer; beyond ±2^39 ms they saturate.
func TestRecordTimesRounding(t *testing.T) {
	const base = 1_700_000_000_000_000
	far := int64(1<<39) * msUs
	tests := []struct {
		name             string
		in               Record
		reset, leaseTill int64
	}{
		{"round_up_and_down", Record{UsedUs: base, ResetUs: base + 1_500, LeaseUntilUs: base + 1_500}, base + 2_000, base + 1_000},
		{"before_base", Record{UsedUs: base, ResetUs: base - 1_500, LeaseUntilUs: base - 1_500}, base - 1_000, base - 2_000},
		// Rounded on the clock's milliseconds, not on the distance to a base between two.
		{"base_between_ms", Record{UsedUs: base + 250, ResetUs: base + 1_500, LeaseUntilUs: base + 1_500}, base + 2_000, base + 1_000},
		{"month_exact", Record{UsedUs: base, ResetUs: base + algo.MaxWindowUs + 1, LeaseUntilUs: base + algo.MaxWindowUs + 1}, base + algo.MaxWindowUs + msUs, base + algo.MaxWindowUs},
		{"saturated", Record{UsedUs: base, ResetUs: base + 2*far, LeaseUntilUs: base - 2*far}, base + far - msUs, base - far + msUs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Record
			if err := DecodeRecord(AppendRecord(nil, &tt.in), &got); err != nil {
				t.Fatal(err)
			}
			if got.ResetUs != tt.reset || got.LeaseUntilUs != tt.leaseTill {
				t.Errorf("reset %d, lease until %d; want %d, %d", got.ResetUs, got.LeaseUntilUs, tt.reset, tt.leaseTill)
			}
		})
	}
}

// TestRecordTimesStayPut: a time decoded and encoded again under a new base (every
// request moves the base to its own time) does not move, however often it is written.
func TestRecordTimesStayPut(t *testing.T) {
	const base = 1_700_000_000_000_000
	r := Record{UsedUs: base, ResetUs: base + 10_000_001, RetryUs: base + 3_000_499, LeaseUntilUs: base + 5_000_999}
	var first Record
	if err := DecodeRecord(AppendRecord(nil, &r), &first); err != nil {
		t.Fatal(err)
	}
	got := first
	for i := range 1_000 {
		got.UsedUs = base + int64(i)*333 // a request every 333 µs
		var next Record
		if err := DecodeRecord(AppendRecord(nil, &got), &next); err != nil {
			t.Fatal(err)
		}
		got = next
	}
	if got.ResetUs != first.ResetUs || got.RetryUs != first.RetryUs || got.LeaseUntilUs != first.LeaseUntilUs {
		t.Errorf("after 1,000 writes reset %d, retry %d, lease until %d; first written %d, %d, %d",
			got.ResetUs, got.RetryUs, got.LeaseUntilUs, first.ResetUs, first.RetryUs, first.LeaseUntilUs)
	}
}

// TestRecordMonthReplyKept: the service's answer for a month-long window (reset in 31
// days, retry in 30) survives the record's trip through shared data, so the headers and
// the gateway's refusals keep the real times instead of a saturated one.
func TestRecordMonthReplyKept(t *testing.T) {
	const now = 1_700_000_000_000_000
	st := wire.State{ResetInMs: uint32(algo.MaxWindowUs / msUs), RetryInMs: uint32(30 * dayUs / msUs), ServerMs: 5}
	r, _ := ApplyReply(Record{UsedUs: now}, &st, &wire.Delta{}, 0, now)
	var got Record
	if err := DecodeRecord(AppendRecord(nil, &r), &got); err != nil {
		t.Fatal(err)
	}
	if got.ResetUs != now+algo.MaxWindowUs || got.RetryUs != now+30*dayUs {
		t.Errorf("reset in %d µs, retry in %d µs after the round trip; want %d, %d", got.ResetUs-now, got.RetryUs-now, algo.MaxWindowUs, 30*dayUs)
	}
}

// appendRecordV3 writes r in version 3 of the layout (32-bit relative milliseconds), as
// gateways did before the 40-bit times.
func appendRecordV3(r *Record) []byte {
	b := appendRecordV4(r)
	h := make([]byte, headerSize3, headerSize3+len(b))
	h[0], h[1], h[2] = recordVersion3, b[1], b[2]
	copy(h[3:11], b[3:11])
	for i := range 6 {
		v := int64(int32(binary.LittleEndian.Uint32(b[11+i*relSize:]))) // the low 32 bits: small offsets only
		if getRel(b[11+i*relSize:], relSize, 0) == 0 {
			v = -1 << 31
		}
		binary.LittleEndian.PutUint32(h[11+i*4:], uint32(int32(v)))
	}
	copy(h[35:55], b[41:61])
	return append(h, b[headerSize4:]...)
}

// appendRecordV4 writes r in version 4 of the layout (no ParamsTag, no cold-start
// counts, no acquire in flight), as gateways did before either.
func appendRecordV4(r *Record) []byte {
	b := AppendRecord(nil, r)
	out := append([]byte(nil), b[:headerSize4]...)
	out[0] = recordVersion4
	i := headerSize
	for range 6 {
		_, k := binary.Uvarint(b[i:])
		out = append(out, b[i:i+k]...)
		i += k
	}
	for range 11 {
		_, k := binary.Uvarint(b[i:])
		i += k
	}
	return append(out, b[i:]...)
}

// appendRecordV5 encodes r as a version 5 record: without the rate lease fields.
func appendRecordV5(r *Record) []byte {
	b := AppendRecord(nil, r)
	out := append([]byte(nil), b[:headerSize]...)
	out[0] = recordVersion5
	i := headerSize
	for range 10 {
		_, k := binary.Uvarint(b[i:])
		out = append(out, b[i:i+k]...)
		i += k
	}
	for range 7 {
		_, k := binary.Uvarint(b[i:])
		i += k
	}
	return append(out, b[i:]...)
}

// TestRecordRateFieldsRoundTrip: a rate lease survives the shared-data encoding, and a
// version 5 record decodes with none (and every other field).
func TestRecordRateFieldsRoundTrip(t *testing.T) {
	const now = 1_700_000_000_000_000
	r := Record{UsedUs: now, SyncedUs: now - 5*msUs, LeaseUntilUs: now + 19_000*msUs, LeaseEpoch: 7, Cold: 1, Waiting: 2,
		Rate: 30_000, Stock: 4, RateAtUs: now - 123, RateBack: 5_000, RateEpoch: 6, RateFrac: 123_456_789, Pending: Pending{RateUsed: 17, Rejected: 3},
		Local: algo.Take(algo.Params{Kind: algo.GCRA, Limit: 30, WindowUs: 1_000_000}, nil, now, 1)}
	var got Record
	if err := DecodeRecord(AppendRecord(nil, &r), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, r)
	}
	v5 := r
	v5.Rate, v5.Stock, v5.RateAtUs, v5.RateBack, v5.RateEpoch, v5.Pending.RateUsed, v5.RateFrac = 0, 0, 0, 0, 0, 0, 0
	if err := DecodeRecord(appendRecordV5(&v5), &got); err != nil || !reflect.DeepEqual(got, v5) {
		t.Errorf("version 5: decoded\n%+v\nwant\n%+v (err %v)", got, v5, err)
	}
}

// TestRecordColdFieldsRoundTrip: the cold-start counts and the acquire in flight survive
// the shared-data encoding, and a version 4 record decodes without them.
func TestRecordColdFieldsRoundTrip(t *testing.T) {
	const now = 1_700_000_000_000_000
	r := Record{UsedUs: now, SyncedUs: now - 5*msUs, Cold: 3, ColdCut: 2, AcquireUntilUs: now + 250*msUs, Waiting: 7,
		Pending: Pending{Over: 5}, Local: algo.Take(algo.Params{Kind: algo.GCRA, Limit: 10, WindowUs: 1_000_000, Burst: 10}, nil, now, 1)}
	var got Record
	if err := DecodeRecord(AppendRecord(nil, &r), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, r)
	}
	// An acquire whose end is before the record's base is over: it reads as none.
	old := r
	old.AcquireUntilUs = now - 1*msUs
	if err := DecodeRecord(AppendRecord(nil, &old), &got); err != nil || got.AcquireUntilUs != 0 {
		t.Errorf("a past acquire decoded as %d (err %v)", got.AcquireUntilUs, err)
	}
	v4 := r
	v4.Cold, v4.ColdCut, v4.AcquireUntilUs, v4.Waiting = 0, 0, 0, 0
	if err := DecodeRecord(appendRecordV4(&v4), &got); err != nil || !reflect.DeepEqual(got, v4) {
		t.Errorf("version 4: decoded\n%+v\nwant\n%+v (err %v)", got, v4, err)
	}
}

// TestRecordVersion3Decodes: records written in version 3 decode with every field, so
// a gateway upgraded in place keeps its leases and unreported consumption.
func TestRecordVersion3Decodes(t *testing.T) {
	const now = 1_700_000_000_000_000
	r := Record{
		Local: algo.Take(algo.Params{Kind: algo.FixedWindow, Limit: 10, WindowUs: 1_000_000}, nil, now, 3), LeaseLeft: 12, LeaseEpoch: 9,
		LeaseUntilUs: now + 20_000*msUs, LowWater: 3, GlobalRemaining: -4, SyncedUs: now - 5*msUs, ServerMs: 77,
		ResetUs: now + 20*dayUs, RetryUs: now + 7*msUs, AnnouncedUs: now - 3*dayUs, UsedUs: now, PenaltyLevel: 2, CutSeq: 5,
		Pending: Pending{Leased: 4, Over: 2, Rejected: 1, Degraded: true}, Urgent: true,
	}
	v3 := appendRecordV3(&r)
	if len(v3) != len(appendRecordV4(&r))-(headerSize4-headerSize3) {
		t.Fatalf("version 3 record of %d bytes", len(v3))
	}
	var got Record
	if err := DecodeRecord(v3, &got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, r)
	}
	for _, bad := range [][]byte{nil, v3[:headerSize3-1], append([]byte{2}, v3[1:]...), append([]byte{recordVersion}, v3[1:headerSize3]...)} {
		if err := DecodeRecord(bad, &got); err == nil {
			t.Errorf("%x decoded", bad)
		}
	}
}

// TestRecordVersion4Decodes: records written in version 4 (no ParamsTag) decode with
// every other field and ParamsTag 0, which the first decision adopts without giving
// the lease back.
func TestRecordVersion4Decodes(t *testing.T) {
	const now = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.GCRA, Limit: 10, WindowUs: 1_000_000}
	r := Record{
		Local: algo.Take(p, nil, now, 3), LeaseLeft: 12, LeaseEpoch: 9, LeaseUntilUs: now + 20_000*msUs,
		LowWater: 3, SyncedUs: now - 5*msUs, ServerMs: 77, UsedUs: now, CutSeq: 5, ParamsTag: ParamsTag(p),
		Pending: Pending{Leased: 4, Rejected: 1},
	}
	v4 := appendRecordV4(&r)
	var got Record
	if err := DecodeRecord(v4, &got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := r
	want.ParamsTag = 0
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, want)
	}
	_, d := Decide(got, p, now+msUs, 1, Env{Sync: true, Healthy: true})
	if !d.Allowed || d.Returned != 0 {
		t.Errorf("first decision on a version 4 record: %+v, want admitted from the lease", d)
	}
}

// A lease used under one rule is given back at the first decision under changed
// parameters (a lowered limit may no longer back it): the request asks the service,
// which decides under the new rule. Unchanged parameters keep it.
func TestLeaseGivenBackWhenTheRuleChanges(t *testing.T) {
	const now = 1_700_000_000_000_000
	old := algo.Params{Kind: algo.FixedWindow, Limit: 1000, WindowUs: 3_600_000_000}
	env := Env{Sync: true, Healthy: true}
	r := Record{LeaseLeft: 50, LeaseEpoch: 3, LeaseUntilUs: now + 10_000*msUs, SyncedUs: now - msUs, GlobalRemaining: 100}
	r, d := Decide(r, old, now, 1, env)
	if !d.Allowed || r.LeaseLeft != 49 {
		t.Fatalf("under the old rule: %+v, lease %d", d, r.LeaseLeft)
	}
	for _, c := range []struct {
		name    string
		p       algo.Params
		keeps   bool
		acquire bool
	}{
		{"same rule", old, true, false},
		{"limit lowered", algo.Params{Kind: algo.FixedWindow, Limit: 600, WindowUs: 3_600_000_000}, false, true},
		{"window changed", algo.Params{Kind: algo.FixedWindow, Limit: 1000, WindowUs: 60_000_000}, false, true},
		{"algorithm changed", algo.Params{Kind: algo.GCRA, Limit: 1000, WindowUs: 3_600_000_000}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, d := Decide(r, c.p, now+msUs, 1, env)
			if c.keeps != (d.Returned == 0) || d.Acquire != c.acquire {
				t.Fatalf("decision %+v; want lease kept %v, acquire %v", d, c.keeps, c.acquire)
			}
			if !c.keeps && (got.LeaseLeft != 0 || got.Pending.Returned != 49 || !got.Urgent || got.ParamsTag != ParamsTag(c.p)) {
				t.Fatalf("record %+v: want the lease returned, urgent, the new tag", got)
			}
		})
	}
}
