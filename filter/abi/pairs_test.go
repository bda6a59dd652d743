package abi

import (
	"errors"
	"slices"
	"testing"
)

// spec example from the v0.2.1 "Serialization" section: {"a": "1"}, {"b": "22"}.
var specExample = []byte{
	2, 0, 0, 0,
	1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
	'a', 0, '1', 0, 'b', 0, '2', '2', 0,
}

func TestDecodePairs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		want    [][2]string
		wantErr bool
	}{
		{name: "spec example", in: specExample, want: [][2]string{{"a", "1"}, {"b", "22"}}},
		{name: "empty as zero bytes", in: nil, want: nil},
		{name: "empty as one NUL", in: []byte{0}, want: nil},
		{name: "empty as zero count", in: []byte{0, 0, 0, 0}, want: nil},
		{name: "empty key and value", in: []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, want: [][2]string{{"", ""}}},
		{name: "short count", in: []byte{1, 0}, wantErr: true},
		{name: "count past end", in: []byte{9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 0}, wantErr: true},
		{name: "huge count", in: []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, wantErr: true},
		{name: "key length past end", in: []byte{1, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 0}, wantErr: true},
		{name: "value length past end", in: []byte{1, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 'a', 0, '1', 0}, wantErr: true},
		{name: "missing NUL after key", in: []byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 'x', '1', 0}, wantErr: true},
		{name: "missing NUL after value", in: []byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 'x'}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodePairs(nil, tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecodePairsAppends(t *testing.T) {
	dst := [][2]string{{"keep", "me"}}
	got, err := DecodePairs(dst, specExample)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"keep", "me"}, {"a", "1"}, {"b", "22"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The decoder's only allocation is the result slice, and none when dst has room.
func TestDecodePairsAllocations(t *testing.T) {
	fresh := testing.AllocsPerRun(100, func() { _, _ = DecodePairs(nil, specExample) })
	if fresh != 1 {
		t.Errorf("decoding into nil allocates %v times, want 1 (the result slice)", fresh)
	}
	dst := make([][2]string, 0, 8)
	reused := testing.AllocsPerRun(100, func() { _, _ = DecodePairs(dst[:0], specExample) })
	if reused != 0 {
		t.Errorf("decoding into a slice with room allocates %v times, want 0", reused)
	}
}

func TestAppendPairs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pairs [][2]string
		want  []byte
	}{
		{name: "spec example", pairs: [][2]string{{"a", "1"}, {"b", "22"}}, want: specExample},
		// Always the 4-byte count: the SDK's emulator panics on a zero-length map.
		{name: "empty map keeps the count", pairs: nil, want: []byte{0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := AppendPairs(nil, tc.pairs)
			if !ok || !slices.Equal(got, tc.want) {
				t.Errorf("got %v (ok %v), want %v", got, ok, tc.want)
			}
			if len(got) != PairsLen(tc.pairs) {
				t.Errorf("PairsLen = %d, encoded %d bytes", PairsLen(tc.pairs), len(got))
			}
		})
	}
}

func TestAppendPropertyPath(t *testing.T) {
	for _, tc := range []struct {
		path []string
		want string
	}{
		{nil, ""},
		{[]string{"node"}, "node"},
		{[]string{"node", "metadata", "NAME"}, "node\x00metadata\x00NAME"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := string(AppendPropertyPath(nil, tc.path)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStatusErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   uint32
		want     error
		wrapped  bool // returned as a *CallError rather than bare
		wantText string
	}{
		{"ok", statusOK, nil, false, ""},
		{"not found is bare", statusNotFound, ErrNotFound, false, "proxy-wasm: not found"},
		{"cas mismatch is bare", statusCasMismatch, ErrCasMismatch, false, "proxy-wasm: cas mismatch"},
		{"empty is bare", statusEmpty, ErrEmpty, false, "proxy-wasm: empty"},
		{"bad argument names the call", statusBadArgument, ErrBadArgument, true, `proxy_http_call "svc": proxy-wasm: bad argument`},
		{"internal failure", statusInternalFailure, ErrInternal, true, `proxy_http_call "svc": proxy-wasm: internal failure`},
		{"unimplemented", statusUnimplemented, ErrUnimplemented, true, `proxy_http_call "svc": proxy-wasm: unimplemented`},
		{"unknown status", 99, StatusError(99), true, `proxy_http_call "svc": proxy-wasm: status 99`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := statusErr(tc.status, "proxy_http_call", "svc")
			if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Fatalf("statusErr(%d) = %v, want %v", tc.status, err, tc.want)
			}
			if err == nil {
				return
			}
			var ce *CallError
			if got := errors.As(err, &ce); got != tc.wrapped {
				t.Errorf("wrapped in CallError = %v, want %v", got, tc.wrapped)
			}
			if err.Error() != tc.wantText {
				t.Errorf("text %q, want %q", err.Error(), tc.wantText)
			}
		})
	}
}

// FuzzDecodePairs: any input decodes or errors without panicking, and whatever decodes
// re-encodes to an equivalent map. Seeds in testdata/fuzz/FuzzDecodePairs are named
// after the malformation they carry.
func FuzzDecodePairs(f *testing.F) {
	f.Add(specExample)
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := DecodePairs(nil, in)
		if err != nil {
			return
		}
		enc, ok := AppendPairs(nil, got)
		if !ok {
			t.Fatal("re-encoding failed")
		}
		again, err := DecodePairs(nil, enc)
		if err != nil {
			t.Fatalf("re-decoding own encoding: %v", err)
		}
		if !slices.Equal(got, again) {
			t.Fatalf("round trip changed %q to %q", got, again)
		}
	})
}

func BenchmarkDecodePairs(b *testing.B) {
	// A typical request: 12 headers of browser-ish sizes.
	var pairs [][2]string
	for i := 0; i < 12; i++ {
		pairs = append(pairs, [2]string{"x-header-name-" + string(rune('a'+i)), "some-header-value-of-moderate-length"})
	}
	buf, _ := AppendPairs(nil, pairs)
	dst := make([][2]string, 0, 16)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		dst, _ = DecodePairs(dst[:0], buf)
	}
}
