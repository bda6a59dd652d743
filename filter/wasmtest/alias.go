package wasmtest

import (
	"bytes"
	"errors"
	"fmt"
)

// WithStartAlias returns a copy of wasm whose export section also exports _initialize's
// function as _start. proxytest.NewWasmVMContext runs only _start, so a Go reactor
// fails there with "call _initialize first"; the alias lets tests load the module
// unchanged otherwise. The shipped module is never rewritten.
func WithStartAlias(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, errors.New("not a wasm binary")
	}
	off := 8
	for off < len(wasm) {
		id := wasm[off]
		size, n, err := readU32(wasm[off+1:])
		if err != nil {
			return nil, fmt.Errorf("section at %d: %w", off, err)
		}
		start := off + 1 + n
		end := start + int(size)
		if end > len(wasm) || end < start {
			return nil, fmt.Errorf("section at %d: size %d past the end", off, size)
		}
		if id != 7 { // export section
			off = end
			continue
		}
		content, err := addStartExport(wasm[start:end])
		if err != nil {
			return nil, err
		}
		out := make([]byte, 0, len(wasm)+16)
		out = append(out, wasm[:off]...)
		out = append(out, 7)
		out = appendU32(out, uint32(len(content)))
		out = append(out, content...)
		out = append(out, wasm[end:]...)
		return out, nil
	}
	return nil, errors.New("module has no export section")
}

// addStartExport parses an export section's content (a vector of name, kind, index)
// and returns it with a "_start" function export pointing at _initialize's index.
func addStartExport(sec []byte) ([]byte, error) {
	count, countLen, err := readU32(sec)
	if err != nil {
		return nil, fmt.Errorf("export count: %w", err)
	}
	p := countLen
	initIdx, found := uint32(0), false
	for i := uint32(0); i < count; i++ {
		nameLen, n, err := readU32(sec[p:])
		if err != nil {
			return nil, fmt.Errorf("export %d name: %w", i, err)
		}
		p += n
		if p+int(nameLen)+1 > len(sec) {
			return nil, fmt.Errorf("export %d: name past the end", i)
		}
		name := string(sec[p : p+int(nameLen)])
		p += int(nameLen)
		kind := sec[p]
		p++
		idx, n, err := readU32(sec[p:])
		if err != nil {
			return nil, fmt.Errorf("export %q index: %w", name, err)
		}
		p += n
		switch {
		case name == "_start":
			return nil, errors.New("module already exports _start")
		case name == "_initialize" && kind == 0:
			initIdx, found = idx, true
		}
	}
	if p != len(sec) {
		return nil, fmt.Errorf("export section: %d trailing bytes", len(sec)-p)
	}
	if !found {
		return nil, errors.New("module does not export _initialize")
	}
	out := appendU32(nil, count+1)
	out = append(out, sec[countLen:]...)
	out = appendU32(out, uint32(len("_start")))
	out = append(out, "_start"...)
	out = append(out, 0) // function
	out = appendU32(out, initIdx)
	return out, nil
}

// readU32 decodes an unsigned LEB128 value of at most 5 bytes.
func readU32(b []byte) (v uint32, n int, err error) {
	var shift uint
	for n < len(b) && n < 5 {
		c := b[n]
		n++
		if n == 5 && c > 0x0f {
			return 0, 0, errors.New("LEB128 overflows u32")
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, n, nil
		}
		shift += 7
	}
	return 0, 0, errors.New("truncated LEB128")
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
