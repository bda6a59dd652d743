package wasmbuild

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

//go:generate wat2wasm shim.wat -o shim.wasm

// shimWasm is shim.wat compiled: the functions Link puts in place of WASI imports.
//
//go:embed shim.wasm
var shimWasm []byte

// WASIModule is the import module name of WASI preview 1.
const WASIModule = "wasi_snapshot_preview1"

// Section ids of the binary format.
const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secMemory   = 5
	secExport   = 7
	secStart    = 8
	secElement  = 9
	secCode     = 10
)

type section struct {
	id   byte
	body []byte
}

// Link returns wasm with every WASI function the shim defines (Shimmed) resolved inside
// the module: the import is removed, the shim's function is appended to the module's
// functions and every call, export, table entry and function name is renumbered. The
// module's other imports and its behaviour otherwise are unchanged. A module that
// imports none of them is returned re-encoded but equivalent.
func Link(wasm []byte) ([]byte, error) {
	shim, err := parseShim()
	if err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, err
	}
	find := func(id byte) []byte {
		for _, s := range secs {
			if s.id == id {
				return s.body
			}
		}
		return nil
	}

	// Types: the module's, then whatever the shim needs that the module lacks.
	types, err := readVec(find(secType), readFuncType)
	if err != nil {
		return nil, fmt.Errorf("type section: %w", err)
	}
	shimType := make([]uint32, len(shim.types))
	for i, t := range shim.types {
		j := slices.IndexFunc(types, func(u []byte) bool { return bytes.Equal(u, t) })
		if j < 0 {
			j = len(types)
			types = append(types, t)
		}
		shimType[i] = uint32(j)
	}

	// Imports: drop each WASI function the shim defines, after checking its signature.
	imports, err := readVec(find(secImport), readImport)
	if err != nil {
		return nil, fmt.Errorf("import section: %w", err)
	}
	var (
		keptImports [][]byte
		nFuncImport uint32
		removed     = map[uint32]int{} // old function index -> shim function
	)
	for _, raw := range imports {
		imp := parseImport(raw)
		if imp.kind == 2 {
			return nil, errors.New("module imports its memory; the shim needs the module's own memory 0")
		}
		if imp.kind != 0 {
			keptImports = append(keptImports, raw)
			continue
		}
		idx := nFuncImport
		nFuncImport++
		if s, ok := shim.exports[imp.name]; ok && imp.module == WASIModule {
			if int(imp.typ) >= len(types) || !bytes.Equal(types[imp.typ], shim.types[shim.funcs[s]]) {
				return nil, fmt.Errorf("%s.%s: the module's signature differs from the shim's", imp.module, imp.name)
			}
			removed[idx] = s
			continue
		}
		keptImports = append(keptImports, raw)
	}
	if memories, err := readVec(find(secMemory), readLimitsEntry); err != nil || len(memories) != 1 {
		return nil, fmt.Errorf("module must define exactly one memory (err %v)", err)
	}

	funcs, err := readVec(find(secFunction), readU32Entry)
	if err != nil {
		return nil, fmt.Errorf("function section: %w", err)
	}
	nDefined := uint32(len(funcs))

	// New function indices: kept imports, the module's functions, then the shim's.
	var appended []int // shim functions, in the order they are appended
	shimIndex := map[int]uint32{}
	newIndex := make([]uint32, nFuncImport+nDefined)
	kept := uint32(0)
	for i := uint32(0); i < nFuncImport; i++ {
		if _, gone := removed[i]; !gone {
			newIndex[i] = kept
			kept++
		}
	}
	base := kept + nDefined
	for i := uint32(0); i < nFuncImport; i++ {
		s, gone := removed[i]
		if !gone {
			continue
		}
		if _, ok := shimIndex[s]; !ok {
			shimIndex[s] = base + uint32(len(appended))
			appended = append(appended, s)
		}
		newIndex[i] = shimIndex[s]
	}
	for i := uint32(0); i < nDefined; i++ {
		newIndex[nFuncImport+i] = kept + i
	}
	mapFunc := func(i uint32) (uint32, error) {
		if int(i) >= len(newIndex) {
			return 0, fmt.Errorf("function index %d out of range", i)
		}
		return newIndex[i], nil
	}
	sameType := func(i uint32) (uint32, error) { return i, nil }
	mapShimType := func(i uint32) (uint32, error) {
		if int(i) >= len(shimType) {
			return 0, fmt.Errorf("shim type %d out of range", i)
		}
		return shimType[i], nil
	}
	noCalls := func(uint32) (uint32, error) { return 0, errors.New("shim functions may not call functions") }

	var out []section
	for _, s := range secs {
		var body []byte
		var err error
		switch s.id {
		case secType:
			body = writeVec(types)
		case secImport:
			body = writeVec(keptImports)
		case secFunction:
			for _, sf := range appended {
				funcs = append(funcs, binary.AppendUvarint(nil, uint64(shimType[shim.funcs[sf]])))
			}
			body = writeVec(funcs)
		case secExport:
			body, err = rewriteExports(s.body, mapFunc)
		case secStart:
			var r reader = reader{b: s.body}
			idx := r.u32()
			if r.err != nil {
				return nil, fmt.Errorf("start section: %w", r.err)
			}
			n, err2 := mapFunc(idx)
			body, err = binary.AppendUvarint(nil, uint64(n)), err2
		case secElement:
			body, err = rewriteElements(s.body, mapFunc)
		case secCode:
			var bodies [][]byte
			bodies, err = readVec(s.body, readSized)
			if err != nil {
				break
			}
			for i, b := range bodies {
				if bodies[i], err = rewriteBody(b, mapFunc, sameType); err != nil {
					err = fmt.Errorf("function %d: %w", nFuncImport+uint32(i), err)
					break
				}
			}
			if err != nil {
				break
			}
			for _, sf := range appended {
				b, err2 := rewriteBody(shim.bodies[sf], noCalls, mapShimType)
				if err2 != nil {
					return nil, fmt.Errorf("shim function %d: %w", sf, err2)
				}
				bodies = append(bodies, b)
			}
			body = writeVec(sized(bodies))
		case secCustom:
			body, err = rewriteCustom(s.body, newIndex, removed, appended, shim)
		default:
			body = s.body
		}
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, err)
		}
		if body != nil {
			out = append(out, section{s.id, body})
		}
	}
	return joinSections(out), nil
}

// helperModule is a hand-written helper module (shim.wasm), decoded: its
// functions are merged into the module Link rewrites, so it may import only
// the memory, which becomes theirs.
type helperModule struct {
	types   [][]byte       // raw function types
	funcs   []uint32       // type of each function
	bodies  [][]byte       // code of each function
	exports map[string]int // export name -> function
	names   []string       // export name of each function ("" if none)
}

func parseHelper(wasm []byte) (*helperModule, error) {
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, err
	}
	m := &helperModule{exports: map[string]int{}}
	for _, s := range secs {
		switch s.id {
		case secType:
			m.types, err = readVec(s.body, readFuncType)
		case secImport:
			var imps [][]byte
			imps, err = readVec(s.body, readImport)
			if err == nil && (len(imps) != 1 || parseImport(imps[0]).kind != 2) {
				err = errors.New("a helper module must import exactly one memory and nothing else")
			}
		case secFunction:
			var fs [][]byte
			fs, err = readVec(s.body, readU32Entry)
			for _, f := range fs {
				v, _ := binary.Uvarint(f)
				m.funcs = append(m.funcs, uint32(v))
			}
		case secCode:
			m.bodies, err = readVec(s.body, readSized)
		case secExport:
			var exps [][]byte
			exps, err = readVec(s.body, readExport)
			m.names = make([]string, len(m.funcs))
			for _, e := range exps {
				r := reader{b: e}
				name := r.name()
				kind := r.byte()
				idx := r.u32()
				if kind == 0 && int(idx) < len(m.funcs) {
					m.exports[name] = int(idx)
					m.names[idx] = name
				}
			}
		case secCustom:
		default:
			err = fmt.Errorf("unexpected section %d", s.id)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(m.bodies) != len(m.funcs) {
		return nil, errors.New("every function needs a body")
	}
	return m, nil
}

func parseShim() (*helperModule, error) {
	m, err := parseHelper(shimWasm)
	if err == nil && len(m.exports) != len(m.funcs) {
		err = errors.New("every shim function needs an export")
	}
	return m, err
}

// Shimmed lists the WASI functions Link resolves inside the module.
func Shimmed() []string {
	m, err := parseShim()
	if err != nil {
		return nil
	}
	return slices.Clone(m.names)
}

func splitSections(wasm []byte) ([]section, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:8], []byte{0, 'a', 's', 'm', 1, 0, 0, 0}) {
		return nil, errors.New("not a WebAssembly 1.0 binary")
	}
	r := reader{b: wasm, p: 8}
	var secs []section
	for !r.done() {
		id := r.byte()
		n := r.u32()
		body := r.bytes(int(n))
		if r.err != nil {
			return nil, fmt.Errorf("section %d: %w", id, r.err)
		}
		secs = append(secs, section{id, body})
	}
	return secs, r.err
}

func joinSections(secs []section) []byte {
	out := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	for _, s := range secs {
		out = append(out, s.id)
		out = binary.AppendUvarint(out, uint64(len(s.body)))
		out = append(out, s.body...)
	}
	return out
}

// readVec splits a vector into its raw entries; entry reads one.
func readVec(b []byte, entry func(*reader)) ([][]byte, error) {
	if b == nil {
		return nil, nil
	}
	r := reader{b: b}
	n := r.u32()
	var items [][]byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		start := r.p
		entry(&r)
		items = append(items, r.b[start:r.p])
	}
	if r.err == nil && r.p != len(b) {
		r.err = fmt.Errorf("%d bytes after the last entry", len(b)-r.p)
	}
	return items, r.err
}

func writeVec(items [][]byte) []byte {
	out := binary.AppendUvarint(nil, uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func readFuncType(r *reader) {
	if r.byte() != 0x60 {
		r.fail(errors.New("not a function type"))
		return
	}
	for k := 0; k < 2; k++ {
		r.skip(int(r.u32()))
	}
}

func readImport(r *reader) {
	r.name()
	r.name()
	switch r.byte() {
	case 0: // function: type index
		r.u32()
	case 1: // table: reftype, limits
		r.byte()
		readLimits(r)
	case 2: // memory: limits
		readLimits(r)
	case 3: // global: valtype, mutability
		r.byte()
		r.byte()
	default:
		r.fail(errors.New("unknown import kind"))
	}
}

type importEntry struct {
	module, name string
	kind         byte
	typ          uint32
}

func parseImport(raw []byte) importEntry {
	r := reader{b: raw}
	e := importEntry{module: r.name(), name: r.name(), kind: r.byte()}
	if e.kind == 0 {
		e.typ = r.u32()
	}
	return e
}

func readLimits(r *reader) {
	if r.byte()&1 != 0 {
		r.u32()
	}
	r.u32()
}

func readLimitsEntry(r *reader) { readLimits(r) }

func readU32Entry(r *reader) { r.u32() }

func readExport(r *reader) {
	r.name()
	r.byte()
	r.u32()
}

// readSized reads a size-prefixed entry (a function body); the entry keeps its prefix.
func readSized(r *reader) { r.skip(int(r.u32())) }

// sized turns unprefixed bodies back into size-prefixed entries.
func sized(bodies [][]byte) [][]byte {
	out := make([][]byte, len(bodies))
	for i, b := range bodies {
		out[i] = append(binary.AppendUvarint(nil, uint64(len(b))), b...)
	}
	return out
}

// rewriteBody takes a size-prefixed function body and returns it unprefixed, with its
// function and type indices mapped.
func rewriteBody(entry []byte, fn, typ func(uint32) (uint32, error)) ([]byte, error) {
	r := reader{b: entry}
	n := r.u32()
	body := r.bytes(int(n))
	if r.err != nil {
		return nil, r.err
	}
	at, err := codeStart(body)
	if err != nil {
		return nil, err
	}
	expr, err := rewriteExpr(body[at:], fn, typ)
	if err != nil {
		return nil, err
	}
	return append(slices.Clip(body[:at]), expr...), nil
}

func rewriteExports(b []byte, fn func(uint32) (uint32, error)) ([]byte, error) {
	exps, err := readVec(b, readExport)
	if err != nil {
		return nil, err
	}
	for i, e := range exps {
		r := reader{b: e}
		name := r.name()
		kind := r.byte()
		idx := r.u32()
		if kind != 0 {
			continue
		}
		n, err := fn(idx)
		if err != nil {
			return nil, fmt.Errorf("export %q: %w", name, err)
		}
		out := append(binary.AppendUvarint(nil, uint64(len(name))), name...)
		out = append(out, kind)
		exps[i] = binary.AppendUvarint(out, uint64(n))
	}
	return writeVec(exps), nil
}

// rewriteElements maps the function indices of active element segments of the form
// Go emits (flags 0: table 0, an offset expression, a vector of function indices).
func rewriteElements(b []byte, fn func(uint32) (uint32, error)) ([]byte, error) {
	r := reader{b: b}
	n := r.u32()
	out := binary.AppendUvarint(nil, uint64(n))
	for i := uint32(0); i < n && r.err == nil; i++ {
		if flags := r.u32(); flags != 0 {
			return nil, fmt.Errorf("element segment %d has flags %d; only 0 is supported", i, flags)
		}
		start := r.p
		for r.err == nil && r.byte() != 0x0B { // the offset: i32.const k end
			if r.b[r.p-1] == 0x41 {
				r.s33()
			} else {
				r.fail(errors.New("element offset is not i32.const"))
			}
		}
		out = append(out, 0)
		out = append(out, b[start:r.p]...)
		cnt := r.u32()
		out = binary.AppendUvarint(out, uint64(cnt))
		for j := uint32(0); j < cnt && r.err == nil; j++ {
			v, err := fn(r.u32())
			if err != nil {
				return nil, err
			}
			out = binary.AppendUvarint(out, uint64(v))
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// rewriteCustom renumbers the function names of the "name" section (subsection 1),
// naming the shim's functions "wasi_shim.<name>", and drops its other subsections that
// carry function indices (Go emits none). Other custom sections are kept as they are.
func rewriteCustom(b []byte, newIndex []uint32, removed map[uint32]int, appended []int, shim *helperModule) ([]byte, error) {
	r := reader{b: b}
	name := r.name()
	if r.err != nil {
		return nil, r.err
	}
	if name != "name" {
		return b, nil
	}
	out := append(binary.AppendUvarint(nil, uint64(len(name))), name...)
	for !r.done() {
		id := r.byte()
		sub := r.bytes(int(r.u32()))
		if r.err != nil {
			return nil, r.err
		}
		switch id {
		case 0: // module name
			out = append(out, id)
			out = binary.AppendUvarint(out, uint64(len(sub)))
			out = append(out, sub...)
		case 1:
			sr := reader{b: sub}
			cnt := sr.u32()
			var entries []byte
			kept := 0
			for i := uint32(0); i < cnt && sr.err == nil; i++ {
				idx := sr.u32()
				fname := sr.name()
				if _, gone := removed[idx]; gone || int(idx) >= len(newIndex) {
					continue
				}
				entries = binary.AppendUvarint(entries, uint64(newIndex[idx]))
				entries = binary.AppendUvarint(entries, uint64(len(fname)))
				entries = append(entries, fname...)
				kept++
			}
			if sr.err != nil {
				return nil, fmt.Errorf("function names: %w", sr.err)
			}
			// Appended functions have the highest indices, so the map stays sorted.
			first := uint32(len(newIndex) - len(removed))
			for k, sf := range appended {
				fname := "wasi_shim." + shim.names[sf]
				entries = binary.AppendUvarint(entries, uint64(first+uint32(k)))
				entries = binary.AppendUvarint(entries, uint64(len(fname)))
				entries = append(entries, fname...)
				kept++
			}
			payload := append(binary.AppendUvarint(nil, uint64(kept)), entries...)
			out = append(out, id)
			out = binary.AppendUvarint(out, uint64(len(payload)))
			out = append(out, payload...)
		}
	}
	return out, nil
}
