package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sampleBatch(n int) *Batch {
	b := &Batch{Node: "gw-eu-1", Seq: 1 << 40, RulesVersion: 17, RulesTag: "sha256:ab12"}
	for i := 0; i < n; i++ {
		b.Deltas = append(b.Deltas, Delta{
			Key: "sk_live_" + strings.Repeat("x", i%24), Rule: "search", Tier: "pro", Window: uint8(i % 3),
			Flags: FlagDegraded, Leased: uint32(i), Over: uint32(i * 7), Returned: 3, Held: uint32(i % 11), Rejected: uint32(i % 5),
			Early: uint32(i % 2), Epoch: 85_000_000 + uint32(i), ElapsedMs: 100, Algo: 1, Limit: 100, WindowMs: 60000, Burst: 120,
		})
	}
	return b
}

func sampleReply(n int) *Reply {
	r := &Reply{RulesVersion: 17, RulesTag: "sha256:ab12", ServerTimeUs: 1_700_000_000_000_000, Nodes: 4}
	for i := 0; i < n; i++ {
		r.States = append(r.States, State{
			Key: "sk_live_" + strings.Repeat("y", i%24), Rule: "search", Window: uint8(i % 3),
			Flags: uint8(i % 2), Remaining: int64(50 - i), Lease: uint32(i % 9), Held: uint32(i % 13),
			Epoch: 85_000_000, ValidMs: 20_000, LowWater: uint32(i % 3),
			ResetInMs: 59_000, RetryInMs: uint32(i * 10), PenaltyInMs: uint32(i % 4 * 1000), PenaltyLevel: uint8(i % 4),
			ServerMs: 1_700_000_000_000 + uint64(i),
		})
	}
	return r
}

// equalBatch treats a nil and an empty Deltas slice as equal.
func equalBatch(a, b *Batch) bool {
	if len(a.Deltas) == 0 && len(b.Deltas) == 0 {
		x, y := *a, *b
		x.Deltas, y.Deltas = nil, nil
		return reflect.DeepEqual(x, y)
	}
	return reflect.DeepEqual(a, b)
}

func equalReply(a, b *Reply) bool {
	if len(a.States) == 0 && len(b.States) == 0 {
		x, y := *a, *b
		x.States, y.States = nil, nil
		return reflect.DeepEqual(x, y)
	}
	return reflect.DeepEqual(a, b)
}

func TestBatchRoundTrip(t *testing.T) {
	long := strings.Repeat("k", MaxStringLen)
	tests := []struct {
		name string
		b    *Batch
	}{
		{"empty", &Batch{}},
		{"no deltas", &Batch{Node: "n", Seq: 2, RulesVersion: 3, RulesTag: "t"}},
		{"one delta", sampleBatch(1)},
		{"many deltas", sampleBatch(200)},
		{"max strings", &Batch{Node: long, RulesTag: long[:MaxTagLen], Deltas: []Delta{{Key: long, Rule: long, Tier: long}}}},
		{"binary strings", &Batch{Node: "\x00\xff", Deltas: []Delta{{Key: "\n\r\"", Rule: "é"}}}},
		{"max values", &Batch{
			Node: "n", Seq: math.MaxUint64, RulesVersion: math.MaxUint64,
			Deltas: []Delta{{
				Window: 255, Flags: deltaFlags, Leased: math.MaxUint32, Over: math.MaxUint32, Returned: math.MaxUint32,
				Held: math.MaxUint32, Rejected: math.MaxUint32, Early: math.MaxUint32, Epoch: math.MaxUint32,
				ElapsedMs: math.MaxUint32, Algo: 255, Limit: math.MaxUint32,
				WindowMs: math.MaxUint32, Burst: math.MaxUint32, Want: math.MaxUint32,
				Rate: math.MaxUint32, RateUsed: math.MaxUint32, RateEpoch: math.MaxUint32, RateStock: math.MaxUint32,
			}},
		}},
		{"max deltas", sampleBatch(MaxDeltas)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc, err := AppendBatch(nil, tt.b)
			if err != nil {
				t.Fatalf("AppendBatch: %v", err)
			}
			if got, want := len(enc), EncodedBatchSize(tt.b); got != want {
				t.Errorf("len(encoding) = %d, EncodedBatchSize = %d", got, want)
			}
			var got Batch
			if err := DecodeBatch(enc, &got); err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if !equalBatch(&got, tt.b) {
				t.Errorf("round trip mismatch:\n got %+v\nwant %+v", got, *tt.b)
			}
		})
	}
}

func TestReplyRoundTrip(t *testing.T) {
	long := strings.Repeat("k", MaxStringLen)
	tests := []struct {
		name string
		r    *Reply
	}{
		{"empty", &Reply{}},
		{"one state", sampleReply(1)},
		{"many states", sampleReply(300)},
		{"negative time and debt", &Reply{ServerTimeUs: -1, States: []State{{Remaining: -12345}}}},
		{"extremes", &Reply{
			RulesVersion: math.MaxUint64, RulesTag: long[:MaxTagLen], ServerTimeUs: math.MinInt64, Nodes: math.MaxUint32,
			States: []State{
				{Key: long, Rule: long, Window: 255, Flags: stateFlags, Remaining: math.MaxInt64,
					Lease: math.MaxUint32, Held: math.MaxUint32, Epoch: math.MaxUint32, ValidMs: math.MaxUint32,
					LowWater: math.MaxUint32, ResetInMs: math.MaxUint32,
					RetryInMs: math.MaxUint32, PenaltyInMs: math.MaxUint32, PenaltyLevel: 255,
					ServerMs: math.MaxUint64, Reason: long[:MaxTagLen], Rate: math.MaxUint32, Stock: math.MaxUint32},
				{Remaining: math.MinInt64},
			},
		}},
		{"max states", sampleReply(MaxDeltas)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc, err := AppendReply(nil, tt.r)
			if err != nil {
				t.Fatalf("AppendReply: %v", err)
			}
			if got, want := len(enc), EncodedReplySize(tt.r); got != want {
				t.Errorf("len(encoding) = %d, EncodedReplySize = %d", got, want)
			}
			var got Reply
			if err := DecodeReply(enc, &got); err != nil {
				t.Fatalf("DecodeReply: %v", err)
			}
			if !equalReply(&got, tt.r) {
				t.Errorf("round trip mismatch:\n got %+v\nwant %+v", got, *tt.r)
			}
		})
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	prefix := []byte("prefix")
	enc, err := AppendBatch(bytes.Clone(prefix), sampleBatch(2))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(enc, prefix) {
		t.Fatalf("prefix lost: %q", enc[:6])
	}
	var b Batch
	if err := DecodeBatch(enc[len(prefix):], &b); err != nil {
		t.Fatal(err)
	}
}

func TestEncodeLimits(t *testing.T) {
	long := strings.Repeat("x", 300)
	withKey := sampleBatch(5)
	withKey.Deltas[3].Key = long
	withRule := sampleBatch(5)
	withRule.Deltas[1].Rule = strings.Repeat("r", MaxStringLen+1)
	// 4000 deltas with 256-byte keys encode to 1,092,007 bytes, over MaxBatchSize.
	huge := &Batch{}
	for i := 0; i < 4000; i++ {
		huge.Deltas = append(huge.Deltas, Delta{Key: strings.Repeat("k", MaxStringLen), Rule: "r"})
	}
	hugeReply := &Reply{}
	for i := 0; i < 4000; i++ {
		hugeReply.States = append(hugeReply.States, State{Key: strings.Repeat("k", MaxStringLen)})
	}
	stateKey := sampleReply(4)
	stateKey.States[2].Key = long

	batchTests := []struct {
		name string
		b    *Batch
		want string
	}{
		{"delta key too long", withKey, "wire: delta[3].key: length 300 > 256"},
		{"delta rule too long", withRule, "wire: delta[1].rule: length 257 > 256"},
		{"node too long", &Batch{Node: long}, "wire: node: length 300 > 256"},
		{"too many deltas", sampleBatch(MaxDeltas + 1), "wire: deltas: count 4097 > 4096"},
		{"batch too large", huge, "wire: batch: size 1100007 > 1048576"},
	}
	for _, tt := range batchTests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("keep")
			got, err := AppendBatch(dst, tt.b)
			checkErr(t, err, tt.want, ErrLimit)
			if string(got) != "keep" {
				t.Errorf("dst changed on error: %q", got)
			}
		})
	}
	replyTests := []struct {
		name string
		r    *Reply
		want string
	}{
		{"state key too long", stateKey, "wire: state[2].key: length 300 > 256"},
		{"too many states", sampleReply(MaxDeltas + 1), "wire: states: count 4097 > 4096"},
		{"reply too large", hugeReply, "wire: reply: size"},
	}
	for _, tt := range replyTests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AppendReply(nil, tt.r)
			checkErr(t, err, tt.want, ErrLimit)
			if len(got) != 0 {
				t.Errorf("dst changed on error: %d bytes", len(got))
			}
		})
	}
}

func checkErr(t *testing.T, err error, want string, kind error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %q", want)
	}
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %q, want prefix %q", err, want)
	}
	if !errors.Is(err, kind) {
		t.Errorf("errors.Is(%v, %v) = false", err, kind)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("error %T is not *Error", err)
	}
}

// readFixture loads testdata/<dir>/<name>.hex: '#' lines are comments, the one
// starting "# want: " gives the expected error ("ok" for valid input).
func readFixture(t testing.TB, path string) (data []byte, want string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var h strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		if w, ok := strings.CutPrefix(line, "# want: "); ok {
			want = w
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		h.WriteString(strings.TrimSpace(line))
	}
	data, err = hex.DecodeString(h.String())
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if want == "" {
		t.Fatalf("%s: no '# want:' line", path)
	}
	return data, want
}

func fixtures(t testing.TB, dir string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", dir, "*.hex"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures in testdata/%s: %v", dir, err)
	}
	return paths
}

func TestDecodeFixtures(t *testing.T) {
	decoders := map[string]func([]byte) error{
		"batch": func(d []byte) error { var b Batch; return DecodeBatch(d, &b) },
		"reply": func(d []byte) error { var r Reply; return DecodeReply(d, &r) },
	}
	for dir, decode := range decoders {
		for _, path := range fixtures(t, dir) {
			t.Run(dir+"/"+strings.TrimSuffix(filepath.Base(path), ".hex"), func(t *testing.T) {
				data, want := readFixture(t, path)
				err := decode(data)
				if want == "ok" {
					if err != nil {
						t.Fatalf("decode: %v", err)
					}
					return
				}
				if err == nil || err.Error() != want {
					t.Fatalf("error = %v, want %q", err, want)
				}
			})
		}
	}
}

func TestDecodeMalformed(t *testing.T) {
	valid, err := AppendBatch(nil, sampleBatch(3))
	if err != nil {
		t.Fatal(err)
	}
	validReply, err := AppendReply(nil, sampleReply(3))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		data  []byte
		reply bool
		want  string
		kind  error
	}{
		{"batch over size limit", make([]byte, MaxBatchSize+1), false, "wire: batch: size 1048577 > 1048576", ErrLimit},
		{"reply over size limit", make([]byte, MaxBatchSize+1), true, "wire: reply: size 1048577 > 1048576", ErrLimit},
		{"nil input", nil, false, "wire: version: truncated", ErrMalformed},
		{"only version", []byte{Version}, false, "wire: node: truncated", ErrMalformed},
		{"varint runs off the end", []byte{Version, 0x80}, false, "wire: node: truncated", ErrMalformed},
		{"trailing byte", append(bytes.Clone(valid), 0), false, "wire: batch: 1 trailing bytes", ErrMalformed},
		{"reply trailing byte", append(bytes.Clone(validReply), 7), true, "wire: reply: 1 trailing bytes", ErrMalformed},
		{"reply nodes over uint32", []byte{Version, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0}, true,
			"wire: nodes: value 4294967296 > 4294967295", ErrMalformed},
		{"reply server time non-minimal", []byte{Version, 0, 0, 0x80, 0x80, 0x00, 0, 0}, true,
			"wire: server_time_us: non-minimal varint", ErrMalformed},
		{"version 1 batch", []byte{VersionV1, 0}, false, "wire: version: got 1, want 2", ErrVersion},
		{"unknown delta flag", func() []byte {
			b := sampleBatch(1)
			enc, _ := AppendBatch(nil, b)
			// flags follow key, rule, tier and window
			i := 1 + 1 + len(b.Node) + uvarintLen(b.Seq) + 1 + 1 + len(b.RulesTag) + 1 +
				1 + len(b.Deltas[0].Key) + 1 + len(b.Deltas[0].Rule) + 1 + len(b.Deltas[0].Tier) + 1
			enc[i] = 0x80
			return enc
		}(), false, "wire: delta[0].flags: unknown bits 0x80", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.reply {
				var r Reply
				err = DecodeReply(tt.data, &r)
			} else {
				var b Batch
				err = DecodeBatch(tt.data, &b)
			}
			checkErr(t, err, tt.want, tt.kind)
		})
	}
}

// Every proper prefix of a valid encoding is truncated and must be refused.
func TestDecodeEveryTruncation(t *testing.T) {
	batch, err := AppendBatch(nil, sampleBatch(4))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := AppendReply(nil, sampleReply(4))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(batch) {
		var b Batch
		if err := DecodeBatch(batch[:n], &b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("batch cut at %d/%d: err = %v, want ErrMalformed", n, len(batch), err)
		}
	}
	for n := range len(reply) {
		var r Reply
		if err := DecodeReply(reply[:n], &r); !errors.Is(err, ErrMalformed) {
			t.Fatalf("reply cut at %d/%d: err = %v, want ErrMalformed", n, len(reply), err)
		}
	}
}

func TestDecodeErrorLeavesTargetUnchanged(t *testing.T) {
	before := sampleBatch(2)
	b := sampleBatch(2)
	enc, err := AppendBatch(nil, sampleBatch(5))
	if err != nil {
		t.Fatal(err)
	}
	if err := DecodeBatch(enc[:len(enc)-1], b); err == nil {
		t.Fatal("truncated batch decoded")
	}
	if !equalBatch(b, before) {
		t.Errorf("batch changed by a failed decode: %+v", b)
	}
	r := sampleReply(2)
	encR, err := AppendReply(nil, sampleReply(5))
	if err != nil {
		t.Fatal(err)
	}
	if err := DecodeReply(append(encR, 0), r); err == nil {
		t.Fatal("reply with trailing byte decoded")
	}
	if !equalReply(r, sampleReply(2)) {
		t.Errorf("reply changed by a failed decode: %+v", r)
	}
}

func TestDecodeReusesCapacity(t *testing.T) {
	big, err := AppendBatch(nil, sampleBatch(100))
	if err != nil {
		t.Fatal(err)
	}
	small, err := AppendBatch(nil, sampleBatch(10))
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	if err := DecodeBatch(big, &b); err != nil {
		t.Fatal(err)
	}
	backing := &b.Deltas[:1][0]
	if err := DecodeBatch(small, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Deltas) != 10 || &b.Deltas[0] != backing {
		t.Errorf("Deltas not reused: len %d, same backing %v", len(b.Deltas), &b.Deltas[0] == backing)
	}
	// With capacity in place, a decode allocates only the shared string arena.
	allocs := testing.AllocsPerRun(20, func() {
		if err := DecodeBatch(small, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("DecodeBatch into a reused Batch: %v allocations, want <= 1", allocs)
	}
	encR, err := AppendReply(nil, sampleReply(50))
	if err != nil {
		t.Fatal(err)
	}
	var r Reply
	if err := DecodeReply(encR, &r); err != nil {
		t.Fatal(err)
	}
	allocs = testing.AllocsPerRun(20, func() {
		if err := DecodeReply(encR, &r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("DecodeReply into a reused Reply: %v allocations, want <= 1", allocs)
	}
}

func TestSplitDeltas(t *testing.T) {
	long := strings.Repeat("k", MaxStringLen)
	bigDeltas := make([]Delta, MaxDeltas)
	for i := range bigDeltas {
		bigDeltas[i] = Delta{Key: long, Rule: long, Tier: long, Leased: math.MaxUint32, Limit: math.MaxUint32}
	}
	tests := []struct {
		name      string
		deltas    []Delta
		maxDeltas int
		maxBytes  int
		wantHead  int // -1: only check the bounds
	}{
		{"empty", nil, 0, 0, 0},
		{"fits whole", sampleBatch(10).Deltas, 0, 0, 10},
		{"count cap", sampleBatch(10).Deltas, 4, 0, 4},
		{"count cap above hard limit", sampleBatch(MaxDeltas + 5).Deltas, MaxDeltas * 2, 0, MaxDeltas},
		{"byte cap", sampleBatch(100).Deltas, 0, 1000, -1},
		{"default byte cap with maximal deltas", bigDeltas, 0, 0, -1},
		{"first delta too big", bigDeltas[:1], 0, 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head, tail := SplitDeltas("gw-1", tt.deltas, tt.maxDeltas, tt.maxBytes)
			if len(head)+len(tail) != len(tt.deltas) {
				t.Fatalf("head %d + tail %d != %d", len(head), len(tail), len(tt.deltas))
			}
			if tt.wantHead >= 0 && len(head) != tt.wantHead {
				t.Errorf("len(head) = %d, want %d", len(head), tt.wantHead)
			}
			if len(tt.deltas) > 0 && tt.wantHead != 0 && len(head) == 0 {
				t.Fatal("no progress")
			}
			maxBytes := tt.maxBytes
			if maxBytes <= 0 {
				maxBytes = MaxBatchSize
			}
			b := &Batch{Node: "gw-1", Seq: math.MaxUint64, RulesVersion: math.MaxUint64, RulesTag: strings.Repeat("t", MaxTagLen), Deltas: head}
			enc, err := AppendBatch(nil, b)
			if err != nil {
				t.Fatalf("AppendBatch(head): %v", err)
			}
			if len(enc) > maxBytes {
				t.Errorf("batch of head is %d bytes > %d", len(enc), maxBytes)
			}
			// The worst reply to this batch must fit too.
			rep := &Reply{RulesVersion: math.MaxUint64, RulesTag: strings.Repeat("t", MaxTagLen), ServerTimeUs: math.MinInt64, Nodes: math.MaxUint32}
			for _, d := range head {
				rep.States = append(rep.States, State{Key: d.Key, Rule: d.Rule, Remaining: math.MinInt64,
					Lease: math.MaxUint32, Held: math.MaxUint32, Epoch: math.MaxUint32, ValidMs: math.MaxUint32,
					LowWater: math.MaxUint32, ResetInMs: math.MaxUint32, RetryInMs: math.MaxUint32,
					PenaltyInMs: math.MaxUint32, ServerMs: math.MaxUint64, Reason: strings.Repeat("r", MaxTagLen),
					Flags: StateRate, Rate: math.MaxUint32, Stock: math.MaxUint32})
			}
			if size := EncodedReplySize(rep); size > maxBytes {
				t.Errorf("worst reply to head is %d bytes > %d", size, maxBytes)
			}
			// Maximality: one more delta would break a bound.
			if len(tail) > 0 && len(head) > 0 && (tt.maxDeltas <= 0 || len(head) < tt.maxDeltas) && len(head) < MaxDeltas {
				b.Deltas = tt.deltas[:len(head)+1]
				rep.States = append(rep.States, State{Key: tail[0].Key, Rule: tail[0].Rule, Remaining: math.MinInt64,
					Lease: math.MaxUint32, Held: math.MaxUint32, Epoch: math.MaxUint32, ValidMs: math.MaxUint32,
					LowWater: math.MaxUint32, ResetInMs: math.MaxUint32, RetryInMs: math.MaxUint32,
					PenaltyInMs: math.MaxUint32, ServerMs: math.MaxUint64, Reason: strings.Repeat("r", MaxTagLen),
					Flags: StateRate, Rate: math.MaxUint32, Stock: math.MaxUint32})
				if EncodedBatchSize(b) <= maxBytes && EncodedReplySize(rep) <= maxBytes {
					t.Errorf("head of %d is not maximal: %d more fits", len(head), len(head)+1)
				}
			}
			// Appending to head must not overwrite tail.
			if len(tail) > 0 {
				first := tail[0]
				_ = append(head, Delta{Key: "clobber"})
				if tail[0] != first {
					t.Error("append(head) overwrote tail")
				}
			}
		})
	}
}

func TestErrorKinds(t *testing.T) {
	e := &Error{Field: "delta[3].key", Reason: "length 300 > 256", Kind: ErrLimit}
	if got, want := e.Error(), "wire: delta[3].key: length 300 > 256"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, ErrLimit) || errors.Is(e, ErrMalformed) {
		t.Error("kind not reported through errors.Is")
	}
}
