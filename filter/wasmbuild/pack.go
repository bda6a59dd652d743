package wasmbuild

import (
	"bytes"
	"compress/flate"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

//go:generate wat2wasm inflate.wat -o inflate.wasm

// inflateWasm is inflate.wat compiled: the DEFLATE decoder Pack puts in the module.
//
//go:embed inflate.wasm
var inflateWasm []byte

// WorkBytes is the scratch memory inflate.wat's decoder needs for its trees and tables.
const WorkBytes = 3344

const (
	secDataCount = 12
	pageBytes    = 65536
)

// PackStats says what Pack did to a module.
type PackStats struct {
	Image      int // bytes of linear memory the data section initialises, lowest to highest
	Segments   int // the data segments it replaced
	LineTables int // bytes of the runtime's file and line tables dropped (dropLineTables)
	Packed     int // the compressed segment that replaces them
}

// Pack returns wasm with its data section, the Go runtime's tables and the program's
// data (about a third of the filter's module, in tens of thousands of segments), as one
// DEFLATE-compressed passive segment, and with the runtime's file and line tables
// dropped (dropLineTables). Its entry (_initialize, or _start for a command) first
// copies the segment into memory above the image, decodes it into place
// (inflate.wat), clears what it used and drops the segment, then runs the module's own
// entry: the memory Go's runtime starts with is the same, byte for byte, and nothing
// runs before it is. The decoder uses only bulk-memory instructions Go's wasm backend
// already emits (memory.init, data.drop besides memory.copy and memory.fill), so it asks
// nothing new of the host's Wasm runtime. The only other cost is decoding once per VM
// at start (BENCHMARKS.md §1 measures it).
func Pack(wasm []byte) ([]byte, PackStats, error) { return pack(wasm, flate.BestCompression, false) }

func pack(wasm []byte, level int, keepLines bool) ([]byte, PackStats, error) {
	var st PackStats
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, st, err
	}
	find := func(id byte) int {
		return slices.IndexFunc(secs, func(s section) bool { return s.id == id })
	}
	for _, id := range []byte{secType, secFunction, secMemory, secExport, secCode} {
		if find(id) < 0 {
			return nil, st, fmt.Errorf("module has no section %d", id)
		}
	}
	if find(secStart) >= 0 {
		return nil, st, errors.New("module has a start function, which would run before its data is unpacked")
	}
	di := find(secData)
	if di < 0 {
		return nil, st, errors.New("module has no data section")
	}
	z, lo, hi, err := compressData(secs[di].body, level, keepLines, &st)
	if err != nil {
		return nil, st, err
	}

	// Above the image: the compressed stream, then the decoder's work area.
	src := align8(hi)
	work := align8(src + len(z))
	end := work + WorkBytes
	memSec, err := growMemory(secs[find(secMemory)].body, end)
	if err != nil {
		return nil, st, err
	}
	secs[find(secMemory)].body = memSec

	// The decoder's functions go after the module's, then the new entry.
	dec, decoder, err := parseInflate()
	if err != nil {
		return nil, st, fmt.Errorf("inflate.wasm: %w", err)
	}
	types, err := readVec(secs[find(secType)].body, readFuncType)
	if err != nil {
		return nil, st, fmt.Errorf("type section: %w", err)
	}
	typeOf := func(t []byte) uint32 {
		j := slices.IndexFunc(types, func(u []byte) bool { return bytes.Equal(u, t) })
		if j < 0 {
			j = len(types)
			types = append(types, t)
		}
		return uint32(j)
	}
	decType := make([]uint32, len(dec.types))
	for i, t := range dec.types {
		decType[i] = typeOf(t)
	}
	funcs, err := readVec(secs[find(secFunction)].body, readU32Entry)
	if err != nil {
		return nil, st, fmt.Errorf("function section: %w", err)
	}
	nImported, err := importedFuncs(secs)
	if err != nil {
		return nil, st, err
	}
	first := nImported + uint32(len(funcs))
	bodies, err := readVec(secs[find(secCode)].body, readSized)
	if err != nil {
		return nil, st, fmt.Errorf("code section: %w", err)
	}
	for i, b := range dec.bodies {
		body, err := rewriteBody(b,
			func(f uint32) (uint32, error) { return first + f, nil },
			func(t uint32) (uint32, error) { return decType[t], nil })
		if err != nil {
			return nil, st, fmt.Errorf("decoder function %d: %w", i, err)
		}
		funcs = append(funcs, binary.AppendUvarint(nil, uint64(decType[dec.funcs[i]])))
		bodies = append(bodies, sized([][]byte{body})[0])
	}
	entry := first + uint32(len(dec.bodies))
	voidType := typeOf([]byte{0x60, 0, 0})
	exports, name, orig, err := redirectEntry(secs[find(secExport)].body, entry)
	if err != nil {
		return nil, st, err
	}
	if orig < nImported || orig >= first {
		return nil, st, fmt.Errorf("export %q: function %d is not defined in the module", name, orig)
	}
	if t, _ := binary.Uvarint(funcs[orig-nImported]); t >= uint64(len(types)) || !bytes.Equal(types[t], []byte{0x60, 0, 0}) {
		return nil, st, fmt.Errorf("export %q: entry takes or returns values", name)
	}
	funcs = append(funcs, binary.AppendUvarint(nil, uint64(voidType)))
	bodies = append(bodies, sized([][]byte{entryBody(src, len(z), lo, hi, work, end, first+decoder, orig)})[0])

	secs[find(secType)].body = writeVec(types)
	secs[find(secFunction)].body = writeVec(funcs)
	secs[find(secExport)].body = exports
	secs[find(secCode)].body = writeVec(bodies)
	data := binary.AppendUvarint([]byte{1, 1}, uint64(len(z))) // one segment, passive
	secs[di].body = append(data, z...)
	count := section{secDataCount, []byte{1}}
	if ci := find(secDataCount); ci >= 0 {
		secs[ci] = count
	} else { // memory.init needs it, before the code section
		secs = slices.Insert(secs, find(secCode), count)
	}
	return joinSections(secs), st, nil
}

// compressData reads a data section's memory image, drops the runtime's line tables
// from it (when the module is Go's) and returns the image's non-zero span [lo, hi)
// compressed.
func compressData(sec []byte, level int, keepLines bool, st *PackStats) (z []byte, lo, hi int, err error) {
	mem, nseg, err := loadData(sec)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("data section: %w", err)
	}
	if mem.passive > 0 {
		return nil, 0, 0, errors.New("module has passive data segments (packed already?)")
	}
	st.Segments = nseg
	if !keepLines {
		if st.LineTables, err = dropLineTables(mem.b); err != nil && !errors.Is(err, errNoPclntab) {
			return nil, 0, 0, fmt.Errorf("dropping line tables: %w", err)
		}
	}
	lo = slices.IndexFunc(mem.b, func(b byte) bool { return b != 0 })
	if lo < 0 {
		return nil, 0, 0, errors.New("module's data is all zero: nothing to pack")
	}
	hi = len(bytes.TrimRight(mem.b, "\x00"))
	st.Image = hi - lo
	var buf bytes.Buffer
	fw, err := flate.NewWriter(&buf, level)
	if err != nil {
		return nil, 0, 0, err
	}
	if _, err := fw.Write(mem.b[lo:hi]); err != nil {
		return nil, 0, 0, err
	}
	if err := fw.Close(); err != nil {
		return nil, 0, 0, err
	}
	st.Packed = buf.Len()
	return buf.Bytes(), lo, hi, nil
}

// entryBody is the packed module's entry: unpack, then run the module's own entry.
func entryBody(src, n, lo, hi, work, end int, inflate, orig uint32) []byte {
	i32 := func(b []byte, v int) []byte { return appendSleb(append(b, 0x41), int64(int32(v))) }
	b := []byte{0} // no locals
	b = i32(i32(i32(b, src), 0), n)
	b = append(b, 0xFC, 8, 0, 0) // memory.init 0: the segment to src
	b = append(b, 0xFC, 9, 0)    // data.drop 0
	b = i32(i32(i32(b, src), lo), work)
	b = binary.AppendUvarint(append(b, 0x10), uint64(inflate))
	b = i32(b, hi)
	b = append(b, 0x47, 0x04, 0x40, 0x00, 0x0B) // i32.ne; if: unreachable (a stream that did not decode to the image)
	b = i32(i32(i32(b, src), 0), end-src)
	b = append(b, 0xFC, 11, 0) // memory.fill: the memory above the image is zero again
	b = binary.AppendUvarint(append(b, 0x10), uint64(orig))
	return append(b, 0x0B)
}

// redirectEntry points the module's entry export (_initialize for a reactor, else
// _start) at fn and returns the section, the export's name and the function it had.
func redirectEntry(sec []byte, fn uint32) ([]byte, string, uint32, error) {
	exps, err := readVec(sec, readExport)
	if err != nil {
		return nil, "", 0, fmt.Errorf("export section: %w", err)
	}
	for _, name := range []string{"_initialize", "_start"} {
		for i, e := range exps {
			r := reader{b: e}
			if r.name() != name || r.byte() != 0 {
				continue
			}
			orig := r.u32()
			out := append(binary.AppendUvarint(nil, uint64(len(name))), name...)
			exps[i] = binary.AppendUvarint(append(out, 0), uint64(fn))
			return writeVec(exps), name, orig, r.err
		}
	}
	return nil, "", 0, errors.New("module exports neither _initialize nor _start")
}

// growMemory returns the memory section with room for end bytes from the start.
func growMemory(sec []byte, end int) ([]byte, error) {
	r := reader{b: sec}
	if r.u32() != 1 {
		return nil, errors.New("module must define exactly one memory")
	}
	flags := r.byte()
	min := r.u32()
	var max uint32
	if flags == 1 {
		max = r.u32()
	} else if flags != 0 {
		return nil, fmt.Errorf("memory limits flags %d", flags)
	}
	if r.err != nil || r.p != len(sec) {
		return nil, errors.New("memory section malformed")
	}
	need := uint32((end + pageBytes - 1) / pageBytes)
	if need <= min {
		return sec, nil
	}
	if flags == 1 && need > max {
		return nil, fmt.Errorf("unpacking needs %d pages, the memory's maximum is %d", need, max)
	}
	out := binary.AppendUvarint([]byte{1, flags}, uint64(need))
	if flags == 1 {
		out = binary.AppendUvarint(out, uint64(max))
	}
	return out, nil
}

// importedFuncs counts the functions the module imports: they come first in the index
// space.
func importedFuncs(secs []section) (uint32, error) {
	i := slices.IndexFunc(secs, func(s section) bool { return s.id == secImport })
	if i < 0 {
		return 0, nil
	}
	imps, err := readVec(secs[i].body, readImport)
	if err != nil {
		return 0, fmt.Errorf("import section: %w", err)
	}
	n := uint32(0)
	for _, raw := range imps {
		if parseImport(raw).kind == 0 {
			n++
		}
	}
	return n, nil
}

func align8(n int) int { return (n + 7) &^ 7 }

// parseInflate decodes inflate.wasm and returns it with the index of its decoder.
func parseInflate() (*helperModule, uint32, error) {
	m, err := parseHelper(inflateWasm)
	if err != nil {
		return nil, 0, err
	}
	f, ok := m.exports["inflate"]
	if !ok {
		return nil, 0, errors.New("inflate.wasm exports no inflate")
	}
	return m, uint32(f), nil
}
