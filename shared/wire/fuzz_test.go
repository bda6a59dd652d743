package wire

import (
	"bytes"
	"testing"
)

func addSeeds(f *testing.F, dir string, valid ...[]byte) {
	for _, v := range valid {
		f.Add(v)
	}
	for _, path := range fixtures(f, dir) {
		data, _ := readFixture(f, path)
		f.Add(data)
	}
}

// FuzzDecodeBatch: decoding never panics, and anything it accepts re-encodes to the
// same bytes (the encoding is canonical) and decodes again to the same value.
func FuzzDecodeBatch(f *testing.F) {
	var seeds [][]byte
	for _, b := range []*Batch{{}, sampleBatch(1), sampleBatch(7)} {
		enc, err := AppendBatch(nil, b)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, enc)
	}
	addSeeds(f, "batch", seeds...)
	f.Fuzz(func(t *testing.T, data []byte) {
		var b Batch
		if err := DecodeBatch(data, &b); err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T is not *Error: %v", err, err)
			}
			return
		}
		enc, err := AppendBatch(nil, &b)
		if err != nil {
			t.Fatalf("decoded batch does not encode: %v", err)
		}
		if !bytes.Equal(enc, data) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", enc, data)
		}
		var again Batch
		if err := DecodeBatch(enc, &again); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if !equalBatch(&again, &b) {
			t.Fatalf("second decode differs:\n got %+v\nwant %+v", again, b)
		}
	})
}

// FuzzDecodeReply is FuzzDecodeBatch for replies.
func FuzzDecodeReply(f *testing.F) {
	var seeds [][]byte
	for _, r := range []*Reply{{}, sampleReply(1), sampleReply(7)} {
		enc, err := AppendReply(nil, r)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, enc)
	}
	addSeeds(f, "reply", seeds...)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Reply
		if err := DecodeReply(data, &r); err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T is not *Error: %v", err, err)
			}
			return
		}
		enc, err := AppendReply(nil, &r)
		if err != nil {
			t.Fatalf("decoded reply does not encode: %v", err)
		}
		if !bytes.Equal(enc, data) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", enc, data)
		}
		var again Reply
		if err := DecodeReply(enc, &again); err != nil {
			t.Fatalf("re-encoded reply does not decode: %v", err)
		}
		if !equalReply(&again, &r) {
			t.Fatalf("second decode differs:\n got %+v\nwant %+v", again, r)
		}
	})
}
