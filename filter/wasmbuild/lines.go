package wasmbuild

import (
	"encoding/binary"
	"fmt"
)

// dropLineTables removes the Go runtime's file and line tables from mem, the memory
// image of a Go wasm module. Every function record's pcfile and pcln offsets become 0,
// which the runtime reads as "no table" (runtime.pcvalue): a traceback still names every
// frame's function, inlined ones included (the inlining tables stay), and prints "?:0"
// for its file and line. The bytes only those tables used, and the file-name tables
// (cutab, filetab), are zeroed, so Pack's compression makes them cost next to nothing.
// The stack-size tables (pcsp) and the stack maps (pcdata, funcdata) the garbage
// collector walks stay as they are. It returns how many bytes it cleared.
func dropLineTables(mem []byte) (int, error) {
	base, err := findPclntab(mem)
	if err != nil {
		return 0, err
	}
	le := binary.LittleEndian
	word := func(i int) int { return int(le.Uint64(mem[base+8+8*i:])) }
	nfunc, nameOff, cuOff, pctabOff, pclnOff := word(0), word(3), word(4), word(6), word(7)
	if !(0 < nameOff && nameOff <= cuOff && cuOff <= pctabOff && pctabOff <= pclnOff &&
		nfunc >= 0 && base+pclnOff+8*(nfunc+1) <= len(mem)) {
		return 0, fmt.Errorf("pclntab header: offsets %d %d %d %d for %d functions do not fit", nameOff, cuOff, pctabOff, pclnOff, nfunc)
	}
	pctab := mem[base+pctabOff : base+pclnOff]
	ftab := mem[base+pclnOff:]

	// A pc table may be shared by several functions and by tables of different kinds,
	// so a dropped table's bytes are cleared only where no kept table uses them.
	used := make([]bool, len(pctab))
	var dropped []int
	for i := range nfunc {
		rec := base + pclnOff + int(le.Uint32(ftab[8*i+4:]))
		if rec+funcRecordSize > len(mem) {
			return 0, fmt.Errorf("function %d: record outside memory", i)
		}
		npcdata := int(le.Uint32(mem[rec+28:]))
		if rec+funcRecordSize+4*npcdata > len(mem) {
			return 0, fmt.Errorf("function %d: %d pcdata tables outside memory", i, npcdata)
		}
		kept := []int{int(le.Uint32(mem[rec+16:]))} // pcsp
		for k := range npcdata {
			kept = append(kept, int(le.Uint32(mem[rec+funcRecordSize+4*k:])))
		}
		for _, off := range kept {
			n, err := pcTableLen(pctab, off)
			if err != nil {
				return 0, fmt.Errorf("function %d: %w", i, err)
			}
			for b := off; b < off+n; b++ {
				used[b] = true
			}
		}
		dropped = append(dropped, int(le.Uint32(mem[rec+20:])), int(le.Uint32(mem[rec+24:])))
		le.PutUint32(mem[rec+20:], 0) // pcfile
		le.PutUint32(mem[rec+24:], 0) // pcln
	}
	cleared := 0
	for _, off := range dropped {
		n, err := pcTableLen(pctab, off)
		if err != nil {
			return 0, err
		}
		for b := off; b < off+n; b++ {
			if !used[b] && pctab[b] != 0 {
				pctab[b] = 0
				cleared++
			}
		}
	}
	// cutab and filetab: each compilation unit's file names, read only for file:line.
	for b := base + cuOff; b < base+pctabOff; b++ {
		if mem[b] != 0 {
			mem[b] = 0
			cleared++
		}
	}
	return cleared, nil
}

// pcTableLen returns the length of the pc-value table at off in pctab: (value delta,
// pc delta) varint pairs ended by a zero value delta after the first pair
// (runtime.step). Offset 0 is no table.
func pcTableLen(pctab []byte, off int) (int, error) {
	if off == 0 {
		return 0, nil
	}
	p := off
	for first := true; ; first = false {
		if p >= len(pctab) {
			return 0, fmt.Errorf("pc table at %d runs past the end", off)
		}
		if pctab[p] == 0 && !first {
			return p + 1 - off, nil
		}
		for range 2 { // value delta, pc delta
			_, n := binary.Uvarint(pctab[p:])
			if n <= 0 {
				return 0, fmt.Errorf("pc table at %d: bad varint at %d", off, p)
			}
			p += n
		}
	}
}
