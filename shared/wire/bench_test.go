package wire

import "testing"

func BenchmarkBatch1000(b *testing.B) {
	batch := sampleBatch(1000)
	enc, err := AppendBatch(nil, batch)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(enc)))
		buf := make([]byte, 0, len(enc))
		for b.Loop() {
			var err error
			if buf, err = AppendBatch(buf[:0], batch); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(enc)))
		var out Batch
		for b.Loop() {
			if err := DecodeBatch(enc, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkReply1000(b *testing.B) {
	reply := sampleReply(1000)
	enc, err := AppendReply(nil, reply)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(enc)))
		buf := make([]byte, 0, len(enc))
		for b.Loop() {
			var err error
			if buf, err = AppendReply(buf[:0], reply); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(enc)))
		var out Reply
		for b.Loop() {
			if err := DecodeReply(enc, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
