package wasmbuild

import (
	"encoding/binary"
	"fmt"
)

// Go's wasm backend compiles every function that can be suspended (any function that
// calls another) into a resumable state machine: the body is a loop around a chain of
// nested blocks whose innermost instruction is a br_table on the function's first
// parameter, the resume point (PC_B). Each basic block's code follows the end of "its"
// block, and every jump between basic blocks, forward or back, is emitted as
//
//	i32.const K; local.set 0; br $loop
//
// — back to the loop, through the br_table, to block K. The dispatch is an indirect
// jump, and every such edge also makes the loop header a merge point of the whole
// function's values, which a Wasm engine's register allocator pays for everywhere.
//
// A forward jump does not need the loop: the block whose end is where K's code starts
// still encloses the jump (blocks of later states enclose the code of earlier ones), so
// `br` to that block lands in the same place, directly. Thread rewrites exactly those
// jumps and nothing else: the resume point is still set (a later dispatch, after a
// goroutine switch, reads it), backward jumps still go through the loop, and so do
// entries and resumptions. No Go toolchain option does this (cmd/internal/obj/wasm
// always emits the dispatch), and binaryen's optimizer keeps the pattern, as it cannot
// see through the local; hence this pass.

// ThreadStats counts what Thread did.
type ThreadStats struct {
	Funcs    int // function bodies with the resumable shape
	Threaded int // forward jumps now direct branches
	Backward int // jumps left to the dispatch (loops)
}

// Thread returns wasm with the forward jumps of Go's resumable functions taken
// directly (see above). Functions of any other shape are copied unchanged.
func Thread(wasm []byte) ([]byte, ThreadStats, error) {
	var st ThreadStats
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, st, err
	}
	for i, s := range secs {
		if s.id != secCode {
			continue
		}
		bodies, err := readVec(s.body, readSized)
		if err != nil {
			return nil, st, fmt.Errorf("code section: %w", err)
		}
		out := make([][]byte, len(bodies))
		for j, entry := range bodies {
			r := reader{b: entry}
			body := r.bytes(int(r.u32()))
			if r.err != nil {
				return nil, st, fmt.Errorf("function body %d: %w", j, r.err)
			}
			if out[j], err = threadBody(body, &st); err != nil {
				return nil, st, fmt.Errorf("function body %d: %w", j, err)
			}
		}
		secs[i].body = writeVec(sized(out))
	}
	return joinSections(secs), st, nil
}

// threadBody returns one function body (locals and code, without its size) threaded.
func threadBody(body []byte, st *ThreadStats) ([]byte, error) {
	r := reader{b: body}
	groups := r.u32()
	for i := uint32(0); i < groups && r.err == nil; i++ {
		r.u32()
		r.byte()
	}
	if r.err != nil {
		return nil, fmt.Errorf("locals: %w", r.err)
	}
	code := body[r.p:]
	d, ok := findDispatch(code)
	if !ok {
		return body, nil
	}
	st.Funcs++
	out := make([]byte, 0, len(body))
	out = append(out, body[:r.p]...)

	// Walk the code keeping the open constructs (each with an id: the dispatch
	// blocks' ids are their nesting order, so state K's block is d.block[K]), and the
	// last two instructions, to recognise `i32.const K; local.set 0; br <loop>`.
	type open struct{ id int }
	var (
		stack   []open
		nextID  = len(d.blockAt) + 1 // ids 0..len-1: the dispatch blocks; len: the loop
		constK  = int64(-1)          // K of an i32.const just before
		setPC   bool                 // local.set 0 just after it
		c       = reader{b: code}
		opening = 0 // dispatch constructs seen so far (loop, then its blocks)
	)
	for !c.done() {
		start := c.p
		op := c.byte()
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
			if err := skipImmediates(&c, op, start); err != nil {
				return nil, err
			}
			id := nextID
			switch {
			case start == d.loopAt:
				id, opening = len(d.blockAt), 1
			case opening > 0 && opening <= len(d.blockAt) && start == d.blockAt[opening-1]:
				id = opening - 1
				opening++
			default:
				nextID++
			}
			stack = append(stack, open{id})
		case op == 0x0B: // end
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case op == 0x0C && setPC && constK >= 0 && int(constK) < len(d.state): // br after the pattern
			depth := c.u32()
			if c.err != nil {
				return nil, c.err
			}
			if int(depth) < len(stack) && stack[len(stack)-1-int(depth)].id == len(d.blockAt) {
				target := d.state[constK]
				to := -1
				for k := len(stack) - 1; k >= 0; k-- {
					if stack[k].id == target {
						to = len(stack) - 1 - k
						break
					}
				}
				if to >= 0 {
					out = append(out, 0x0C)
					out = binary.AppendUvarint(out, uint64(to))
					st.Threaded++
					constK, setPC = -1, false
					continue
				}
				st.Backward++
			}
		default:
			if err := skipImmediates(&c, op, start); err != nil {
				return nil, err
			}
		}
		if c.err != nil {
			return nil, c.err
		}
		// Track `i32.const K; local.set 0`.
		switch {
		case op == 0x41:
			v := reader{b: code[start+1 : c.p]}
			constK, setPC = v.s33(), false
		case op == 0x21 && c.p == start+2 && code[start+1] == 0 && constK >= 0 && !setPC:
			setPC = true
		default:
			constK, setPC = -1, false
		}
		out = append(out, code[start:c.p]...)
	}
	if c.err != nil {
		return nil, c.err
	}
	return out, nil
}

// dispatch is where a resumable function's state machine sits in its code.
type dispatch struct {
	loopAt  int   // byte offset of the loop
	blockAt []int // byte offsets of the nested blocks inside it, outermost first
	state   []int // state K -> the index (in blockAt) of the block K's code follows
}

// findDispatch recognises Go's prologue: a loop whose body opens only empty-typed
// blocks, then `local.get 0; br_table` with every target one of those blocks. It looks
// at the first loop of the function only (Go emits the dispatch before any code of
// the function's own loops).
func findDispatch(code []byte) (dispatch, bool) {
	var d dispatch
	c := reader{b: code}
	for !c.done() {
		start := c.p
		op := c.byte()
		if op == 0x03 {
			d.loopAt = start
			if c.byte() != 0x40 {
				return d, false
			}
			break
		}
		if skipImmediates(&c, op, start) != nil {
			return d, false
		}
	}
	if c.err != nil || c.p >= len(code) {
		return d, false
	}
	for c.p+1 < len(code) && code[c.p] == 0x02 && code[c.p+1] == 0x40 {
		d.blockAt = append(d.blockAt, c.p)
		c.p += 2
	}
	if len(d.blockAt) == 0 || c.byte() != 0x20 || c.u32() != 0 || c.byte() != 0x0E || c.err != nil {
		return d, false
	}
	n := c.u32()
	if c.err != nil || n > uint32(len(code)) {
		return d, false
	}
	// Relative depth t from the br_table is the block len-1-t (0: the innermost).
	for i := uint32(0); i <= n; i++ {
		t := c.u32()
		if c.err != nil || int(t) >= len(d.blockAt) {
			return d, false
		}
		d.state = append(d.state, len(d.blockAt)-1-int(t))
	}
	d.state = d.state[:n] // the last entry is the default, not a state
	return d, true
}
