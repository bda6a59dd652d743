package wasmbuild

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
)

// A packed module's memory, once its entry has run, is the memory the original data
// section gave it, byte for byte, for images DEFLATE codes with every block type
// (stored, fixed and dynamic codes, overlapping copies, streams of many blocks), at
// every compression level; the module's own entry runs after the decoding, and memory
// grows when the decoder's scratch space does not fit.
func TestPackRestoresMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return b
	}
	words := strings.Fields("rate limit token bucket window lease epoch gateway redis sync")
	text := func(n int) []byte {
		var b []byte
		for len(b) < n {
			b = append(b, words[rng.IntN(len(words))]...)
			b = append(b, " ,.\n"[rng.IntN(4)])
		}
		return b[:n]
	}
	runs := func(n int) []byte { // runs of one byte, and of short patterns, between zeros
		var b []byte
		for len(b) < n {
			switch rng.IntN(3) {
			case 0:
				b = append(b, bytes.Repeat([]byte{byte(1 + rng.IntN(255))}, 1+rng.IntN(400))...)
			case 1:
				b = append(b, bytes.Repeat(random(1+rng.IntN(7)), 1+rng.IntN(60))...)
			default:
				b = append(b, make([]byte, rng.IntN(100))...)
			}
		}
		b = b[:n]
		b[0], b[n-1] = 1, 1 // the image is what lies between its first and last non-zero byte
		return b
	}
	images := []struct {
		name  string
		image []byte
		at    int
	}{
		{"one byte", []byte{0x7F}, 4096},
		{"short text", []byte("packed, packed, packed module"), 1000},
		{"random", random(3000), 70000},
		{"text", text(50000), 4096},
		{"runs", runs(200000), 4096},
		{"mixed", slices.Concat(text(300000), make([]byte, 5000), random(100000), runs(300000), text(100)), 123457},
	}
	levels := []int{flate.NoCompression, flate.BestSpeed, flate.DefaultCompression, flate.BestCompression, flate.HuffmanOnly}
	firstBlock := map[byte]bool{}
	for _, im := range images {
		for _, level := range levels {
			pages := (im.at + len(im.image) + pageBytes - 1) / pageBytes
			mod := dataModule(im.image, im.at, pages)
			packed, st, err := pack(mod, level, false)
			if err != nil {
				t.Fatalf("%s, level %d: %v", im.name, level, err)
			}
			if st.Image != len(im.image) || st.Segments == 0 || st.LineTables != 0 {
				t.Errorf("%s, level %d: stats %+v", im.name, level, st)
			}
			z := packedSegment(t, packed)
			if len(z) != st.Packed {
				t.Errorf("%s, level %d: segment of %d bytes, stats say %d", im.name, level, len(z), st.Packed)
			}
			firstBlock[z[0]>>1&3] = true
			want := make([]byte, pages*pageBytes)
			copy(want[im.at:], im.image)
			want[len(want)-1] = sentinel
			got, err := runEntry(packed)
			if err != nil {
				t.Fatalf("%s, level %d: %v", im.name, level, err)
			}
			if len(got) < len(want) || !bytes.Equal(got[:len(want)], want) || len(bytes.Trim(got[len(want):], "\x00")) > 0 {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Fatalf("%s, level %d: memory differs from byte %d (memory %d bytes, want %d)", im.name, level, i, len(got), len(want))
			}
		}
	}
	for typ := range byte(3) {
		if !firstBlock[typ] {
			t.Errorf("no stream started with a block of type %d: the cases do not cover it", typ)
		}
	}
}

// A stream that does not decode (a reserved block type, a stored block whose length
// check fails) stops the module's start with a trap instead of running on bad data.
func TestPackedModuleRefusesABadStream(t *testing.T) {
	for _, c := range []struct {
		name  string
		level int
		patch func(z []byte)
	}{
		{"reserved block type", flate.BestCompression, func(z []byte) { z[0] |= 0b110 }},
		{"stored length check", flate.NoCompression, func(z []byte) { z[3] ^= 0xFF }},
	} {
		packed, _, err := pack(dataModule([]byte("some data, some data"), 4096, 1), c.level, false)
		if err != nil {
			t.Fatal(err)
		}
		c.patch(packedSegment(t, packed))
		if _, err := runEntry(packed); err == nil || !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("%s: start returned %v, want the unreachable trap", c.name, err)
		}
	}
}

func TestPackRefuses(t *testing.T) {
	plain := dataModule([]byte("data"), 4096, 1)
	packed, _, err := Pack(plain)
	if err != nil {
		t.Fatal(err)
	}
	withStart := append(slices.Clone(plain), 8, 1, 0) // start section: function 0
	noData := dataModule(nil, 0, 1)
	for _, c := range []struct {
		name, want string
		mod        []byte
	}{
		{"packed twice", "passive", packed},
		{"start function", "start function", withStart},
		{"no data", "all zero", noData},
		{"not wasm", "not a WebAssembly", []byte("\x00asm")},
	} {
		if _, _, err := Pack(c.mod); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Pack returned %v, want an error mentioning %q", c.name, err, c.want)
		}
	}
}

const sentinel = 0x5A

// dataModule is a module with one memory of pages pages, image at address at in active
// segments split at runs of zeros as Go's linker splits them, and an _initialize that
// writes sentinel to the memory's last byte.
func dataModule(image []byte, at, pages int) []byte {
	uv := func(v int) []byte { return binary.AppendUvarint(nil, uint64(v)) }
	name := func(s string) []byte { return append(uv(len(s)), s...) }
	body := []byte{0}
	body = appendSleb(append(body, 0x41), int64(int32(pages*pageBytes-1)))
	body = appendSleb(append(body, 0x41), sentinel)
	body = append(body, 0x3A, 0, 0, 0x0B) // i32.store8
	var segs [][]byte
	for i := 0; i < len(image); {
		if image[i] == 0 {
			i++
			continue
		}
		j := i
		for j < len(image) && !bytes.Equal(image[j:min(j+8, len(image))], make([]byte, min(8, len(image)-j))) {
			j++
		}
		seg := appendSleb([]byte{0, 0x41}, int64(int32(at+i)))
		seg = append(append(seg, 0x0B), uv(j-i)...)
		segs = append(segs, append(seg, image[i:j]...))
		i = j
	}
	return joinSections([]section{
		{secType, writeVec([][]byte{{0x60, 0, 0}})},
		{secFunction, writeVec([][]byte{{0}})},
		{secMemory, slices.Concat([]byte{1, 0}, uv(pages))},
		{secExport, writeVec([][]byte{slices.Concat(name("_initialize"), []byte{0, 0}), slices.Concat(name("memory"), []byte{2, 0})})},
		{secCode, writeVec(sized([][]byte{body}))},
		{secData, writeVec(segs)},
	})
}

// packedSegment returns the bytes of a packed module's one data segment, in place.
func packedSegment(t *testing.T, wasm []byte) []byte {
	t.Helper()
	secs, err := splitSections(wasm)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secs {
		if s.id == secData {
			r := reader{b: s.body}
			if r.u32() != 1 || r.byte() != 1 {
				t.Fatal("data section is not one passive segment")
			}
			return r.bytes(int(r.u32()))
		}
	}
	t.Fatal("no data section")
	return nil
}

// runEntry instantiates wasm, runs its _initialize and returns its memory.
func runEntry(wasm []byte) ([]byte, error) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStartFunctions())
	if err != nil {
		return nil, err
	}
	if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
		return nil, err
	}
	mem, _ := mod.Memory().Read(0, mod.Memory().Size())
	return bytes.Clone(mem), nil
}
