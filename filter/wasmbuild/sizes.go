package wasmbuild

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Sizes says where a Go wasip1 module's bytes go: per section, and per Go package the
// function bodies of the code section plus the package's share of the runtime's
// function table (pclntab: names, line and stack tables, the per-function records),
// which lives in the data section. The function names come from the pclntab itself,
// so a module built with -ldflags=-s (no name section) is measured the same way.
// Data outside the pclntab (type descriptors, strings, tables such as unicode's,
// initialised variables) carries no names in the module and is reported as one sum.
//
// Function bodies are matched to names by index, which holds for the Go linker's
// output with or without Link; wasm-opt reorders functions, so on its output only the
// pclntab figures and the packages present are meaningful.
type Sizes struct {
	Total    int
	Sections []SectionSize
	Packages []PackageSize // largest first
	Funcs    []FuncSize    // largest first
	Data     DataSizes
}

// SectionSize is one section's size, header included.
type SectionSize struct {
	Name  string // "code", "data", "custom:name", ...
	Bytes int
}

// PackageSize is what one Go package's functions cost.
type PackageSize struct {
	Package string // import path; "type:" for compiler-generated equality and hash functions
	Funcs   int
	Code    int // function bodies in the code section, each with its size
	Pclntab int // name, pc tables and function record in the data section
}

// FuncSize is one function's cost.
type FuncSize struct {
	Name    string
	Index   int // among the module's defined functions (imports not counted)
	Code    int
	Pclntab int
}

// DataSizes splits the data section.
type DataSizes struct {
	Bytes    int // the whole section
	Segments int
	Overhead int // segment headers (offset expression and length): what the zero runs between segments cost
	Pclntab  int // the runtime's function table, attributed to packages above
	Other    int // everything else the segments hold
}

const secData = 11

// Section names by id.
var sectionNames = [...]string{"custom", "type", "import", "function", "table", "memory",
	"global", "export", "start", "element", "code", "data", "datacount"}

// MeasureSizes reads a module built by the Go toolchain (before or after Link).
func MeasureSizes(wasm []byte) (*Sizes, error) {
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, err
	}
	s := &Sizes{Total: len(wasm)}
	var code, data []byte
	for _, sec := range secs {
		name := "unknown"
		if int(sec.id) < len(sectionNames) {
			name = sectionNames[sec.id]
		}
		if sec.id == secCustom {
			r := reader{b: sec.body}
			name = "custom:" + r.name()
		}
		s.Sections = append(s.Sections, SectionSize{name, 1 + uvarintLen(len(sec.body)) + len(sec.body)})
		switch sec.id {
		case secCode:
			code = sec.body
		case secData:
			data = sec.body
		}
	}
	mem, nseg, err := loadData(data)
	if err != nil {
		return nil, fmt.Errorf("data section: %w", err)
	}
	s.Data = DataSizes{Bytes: len(data), Segments: nseg, Overhead: len(data) - uvarintLen(nseg) - mem.payload}
	tab, err := readPclntab(mem.b)
	if err != nil {
		return nil, fmt.Errorf("pclntab: %w", err)
	}
	s.Data.Pclntab = tab.size
	s.Data.Other = mem.payload - tab.size

	bodies, err := readVec(code, readSized)
	if err != nil {
		return nil, fmt.Errorf("code section: %w", err)
	}
	pkgs := map[string]*PackageSize{}
	pkg := func(name string) *PackageSize {
		p := packageOf(name)
		if pkgs[p] == nil {
			pkgs[p] = &PackageSize{Package: p}
		}
		return pkgs[p]
	}
	named := make([]bool, len(bodies))
	for _, f := range tab.funcs {
		p := pkg(f.name)
		p.Pclntab += f.pcln
		if i := f.index; i >= 0 && i < len(bodies) && !named[i] {
			named[i] = true
			p.Funcs++
			p.Code += len(bodies[i])
			s.Funcs = append(s.Funcs, FuncSize{f.name, i, len(bodies[i]), f.pcln})
		}
	}
	for i, b := range bodies { // functions the pclntab does not list: Link's shim, the wasm entry points
		if !named[i] {
			p := pkg("(not in pclntab)")
			p.Funcs++
			p.Code += len(b)
		}
	}
	for _, p := range pkgs {
		s.Packages = append(s.Packages, *p)
	}
	slices.SortFunc(s.Packages, func(a, b PackageSize) int {
		return cmp.Or(cmp.Compare(b.Code+b.Pclntab, a.Code+a.Pclntab), cmp.Compare(a.Package, b.Package))
	})
	slices.SortFunc(s.Funcs, func(a, b FuncSize) int {
		return cmp.Or(cmp.Compare(b.Code+b.Pclntab, a.Code+a.Pclntab), cmp.Compare(a.Name, b.Name))
	})
	return s, nil
}

// packageOf returns the import path of a Go symbol name such as
// "github.com/tidwall/gjson.(*Result).Get" or "slices.Sort[go.shape.int]".
func packageOf(sym string) string {
	if strings.HasPrefix(sym, "type:") {
		return "type:"
	}
	if i := strings.IndexByte(sym, '['); i >= 0 {
		sym = sym[:i]
	}
	slash := strings.LastIndexByte(sym, '/') + 1
	if dot := strings.IndexByte(sym[slash:], '.'); dot >= 0 {
		return sym[:slash+dot]
	}
	return sym
}

// Table prints the sizes: sections, then the top packages (0: all) and the rest summed,
// then the largest functions (0: none).
func (s *Sizes) Table(w io.Writer, top, topFuncs int) {
	fmt.Fprintf(w, "module: %d bytes\n\nsection                bytes\n", s.Total)
	for _, sec := range s.Sections {
		fmt.Fprintf(w, "%-18s %9d\n", sec.Name, sec.Bytes)
	}
	d := s.Data
	fmt.Fprintf(w, "\ndata: %d segments, %d bytes of segment headers, pclntab %d, other data %d\n",
		d.Segments, d.Overhead, d.Pclntab, d.Other)
	fmt.Fprintf(w, "\n%-48s %6s %9s %9s %9s\n", "package", "funcs", "code", "pclntab", "sum")
	var rest PackageSize
	for i, p := range s.Packages {
		if top > 0 && i >= top {
			rest.Funcs += p.Funcs
			rest.Code += p.Code
			rest.Pclntab += p.Pclntab
			rest.Package = fmt.Sprintf("(%d more packages)", len(s.Packages)-top)
			continue
		}
		fmt.Fprintf(w, "%-48s %6d %9d %9d %9d\n", p.Package, p.Funcs, p.Code, p.Pclntab, p.Code+p.Pclntab)
	}
	if rest.Package != "" {
		fmt.Fprintf(w, "%-48s %6d %9d %9d %9d\n", rest.Package, rest.Funcs, rest.Code, rest.Pclntab, rest.Code+rest.Pclntab)
	}
	if topFuncs > 0 {
		fmt.Fprintf(w, "\n%-72s %9s %9s\n", "function", "code", "pclntab")
		for _, f := range s.Funcs[:min(topFuncs, len(s.Funcs))] {
			fmt.Fprintf(w, "%-72s %9d %9d\n", f.Name, f.Code, f.Pclntab)
		}
	}
}

// memory is linear memory as the data section initialises it.
type memory struct {
	b       []byte
	payload int // bytes the segments carry
	passive int // segments not placed in memory
}

const maxMemory = 1 << 28 // a bound on what a data section may initialise

func loadData(sec []byte) (memory, int, error) {
	var m memory
	if sec == nil {
		return m, 0, nil
	}
	r := reader{b: sec}
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		flags := r.u32()
		if flags == 1 { // passive: not placed in memory
			m.payload += len(r.bytes(int(r.u32())))
			m.passive++
			continue
		}
		if flags == 2 {
			r.u32() // memory index
		} else if flags != 0 {
			return m, 0, fmt.Errorf("segment %d: flags %d", i, flags)
		}
		if r.byte() != 0x41 {
			return m, 0, fmt.Errorf("segment %d: offset is not i32.const", i)
		}
		off := int(uint32(r.s33()))
		if r.byte() != 0x0B {
			return m, 0, fmt.Errorf("segment %d: offset expression too long", i)
		}
		b := r.bytes(int(r.u32()))
		if r.err != nil {
			break
		}
		if off+len(b) > maxMemory {
			return m, 0, fmt.Errorf("segment %d ends at %d", i, off+len(b))
		}
		if off+len(b) > len(m.b) {
			m.b = append(m.b, make([]byte, off+len(b)-len(m.b))...)
		}
		copy(m.b[off:], b)
		m.payload += len(b)
	}
	if r.err == nil && r.p != len(sec) {
		r.err = errors.New("bytes after the last segment")
	}
	return m, int(n), r.err
}

// pclntab is the runtime's function table (runtime/symtab.go: pcHeader, _func).
type pclntab struct {
	size  int
	funcs []pclnFunc
}

type pclnFunc struct {
	name  string
	index int // in the code section
	pcln  int // bytes of the table this function accounts for
}

const (
	pclnMagic       = 0xFFFFFFF1 // Go 1.20 and later
	funcValueOffset = 0x1000     // an entry is funcValueOffset + the index of a defined function (cmd/link/internal/wasm)
	funcRecordSize  = 44         // _func without its pcdata and funcdata offsets
)

func readPclntab(mem []byte) (pclntab, error) {
	var t pclntab
	le := binary.LittleEndian
	base, err := findPclntab(mem)
	if err != nil {
		return t, err
	}
	word := func(i int) int { return int(le.Uint64(mem[base+8+8*i:])) }
	nfunc, nameOff, pctabOff, pclnOff := word(0), word(3), word(6), word(7)
	at := func(off, n int) ([]byte, error) {
		if off < 0 || n < 0 || base+off+n > len(mem) {
			return nil, fmt.Errorf("offset %d+%d outside memory", off, n)
		}
		return mem[base+off : base+off+n], nil
	}
	ftab, err := at(pclnOff, 8*(nfunc+1))
	if err != nil {
		return t, fmt.Errorf("functab: %w", err)
	}
	end := pclnOff + len(ftab)
	type ref struct{ off, fn int }
	var tables []ref
	for i := 0; i < nfunc; i++ {
		entry, fo := int(le.Uint32(ftab[8*i:])), int(le.Uint32(ftab[8*i+4:]))
		rec, err := at(pclnOff+fo, funcRecordSize)
		if err != nil {
			return t, fmt.Errorf("function %d: %w", i, err)
		}
		npcdata, nfuncdata := int(le.Uint32(rec[28:])), int(rec[43])
		size := funcRecordSize + 4*(npcdata+nfuncdata)
		extra, err := at(pclnOff+fo+funcRecordSize, 4*npcdata)
		if err != nil {
			return t, fmt.Errorf("function %d: %w", i, err)
		}
		end = max(end, pclnOff+fo+size)
		no := nameOff + int(int32(le.Uint32(rec[4:])))
		nameEnd := no
		for nameEnd < pctabOff && base+nameEnd < len(mem) && mem[base+nameEnd] != 0 {
			nameEnd++
		}
		name, _ := at(no, nameEnd-no)
		t.funcs = append(t.funcs, pclnFunc{
			name:  string(name),
			index: entry - funcValueOffset,
			pcln:  size + 8 + len(name) + 1, // record, functab entry, name and its NUL
		})
		for _, o := range []int{int(le.Uint32(rec[16:])), int(le.Uint32(rec[20:])), int(le.Uint32(rec[24:]))} {
			tables = append(tables, ref{o, i})
		}
		for k := 0; k < npcdata; k++ {
			tables = append(tables, ref{int(le.Uint32(extra[4*k:])), i})
		}
	}
	// The pc tables follow each other in pctab; each costs up to the next one's start.
	// A table shared by several functions is charged to the first.
	slices.SortFunc(tables, func(a, b ref) int { return cmp.Or(cmp.Compare(a.off, b.off), cmp.Compare(a.fn, b.fn)) })
	tables = slices.CompactFunc(tables, func(a, b ref) bool { return a.off == b.off })
	pctabLen := pclnOff - pctabOff
	for k, tb := range tables {
		if tb.off == 0 { // no table
			continue
		}
		next := pctabLen
		if k+1 < len(tables) {
			next = tables[k+1].off
		}
		t.funcs[tb.fn].pcln += next - tb.off
	}
	t.size = end
	return t, nil
}

var errNoPclntab = errors.New("no pclntab header (not a Go 1.20+ wasm module?)")

// findPclntab returns where the runtime's function table starts in mem, after checking
// its header is there once and whole.
func findPclntab(mem []byte) (int, error) {
	// The header: magic, two zero pads, minLC 1 and pointer size 8 on wasm.
	hdr := []byte{0xF1, 0xFF, 0xFF, 0xFF, 0, 0, 1, 8}
	base := -1
	for off := 0; ; {
		i := strings.Index(string(mem[off:]), string(hdr))
		if i < 0 {
			break
		}
		if base >= 0 {
			return 0, errors.New("more than one pclntab header")
		}
		base = off + i
		off = base + 1
	}
	if base < 0 {
		return 0, errNoPclntab
	}
	if base+72 > len(mem) {
		return 0, errors.New("header truncated")
	}
	return base, nil
}

func uvarintLen(n int) int { return len(binary.AppendUvarint(nil, uint64(n))) }
